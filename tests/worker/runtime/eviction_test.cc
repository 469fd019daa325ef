#include "worker/runtime/eviction.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/worker/runtime/runtime_test_fixtures.h"

namespace pstar {
namespace {

TEST(Eviction, OptTakesTheFarthestNextUseAndLruTheOldest) {
  ChunkTrace t(8);
  test::RecordStep(t, {{0}, {1}, {2}, {3}});
  t.BeginStep();
  t.Observe({0});
  const std::vector<EvictionCandidate> c = {{1, false, 5}, {3, false, 1}, {2, false, 9}};
  EXPECT_EQ(ChooseVictim(c, EvictionPolicy::kOpt, t, 0), 3);
  EXPECT_EQ(ChooseVictim(c, EvictionPolicy::kLru, t, 0), 3);
  const std::vector<EvictionCandidate> d = {{1, false, 1}, {3, false, 5}, {2, false, 9}};
  EXPECT_EQ(ChooseVictim(d, EvictionPolicy::kLru, t, 0), 1);
  EXPECT_EQ(ChooseVictim(d, EvictionPolicy::kOpt, t, 0), 3);
  // A prefetch may evict only chunks needed later than it; never blindly.
  EXPECT_EQ(ChooseVictim(d, EvictionPolicy::kOpt, t, 3), -1);
  EXPECT_EQ(ChooseVictim(d, EvictionPolicy::kOpt, t, 2), 3);
  EXPECT_EQ(ChooseVictim(d, EvictionPolicy::kLru, t, 1), -1);
  EXPECT_EQ(ChooseVictim({}, EvictionPolicy::kLru, t, 0), -1);
}

TEST(Eviction, TiesGoToACleanCopyThenTheLowerIndex) {
  ChunkTrace t(8);  // no trace: OPT falls back to LRU
  const std::vector<EvictionCandidate> c = {{4, true, 2}, {6, false, 2}, {5, false, 2}, {1, true, 2}};
  EXPECT_EQ(ChooseVictim(c, EvictionPolicy::kOpt, t, 0), 5);
  const std::vector<EvictionCandidate> dirty = {{4, true, 2}, {1, true, 2}};
  EXPECT_EQ(ChooseVictim(dirty, EvictionPolicy::kLru, t, 0), 1);
}

// A trace of one step, served up to (and observing) moment `now`.
ChunkTrace TraceAt(const std::vector<std::vector<int32_t>>& moments, int64_t now) {
  ChunkTrace t(8);
  test::RecordStep(t, moments);
  t.BeginStep();
  for (int64_t m = 0; m < now; ++m) {
    t.Observe(moments[size_t(m)]);
    t.Advance();
  }
  t.Observe(moments[size_t(now)]);
  return t;
}

TEST(Eviction, OptDropsAVictimOnlyWhenTheChunksUsedBeforeItsNextUseFillEverySlot) {
  const auto all = [](int32_t) { return true; };
  // Serving moment 1 (chunk 1), chunk 0 next used at 3; chunk 2 comes between.
  const ChunkTrace apart = TraceAt({{0}, {1}, {2}, {0}}, 1);
  const std::vector<int32_t> resident = {0, 1};
  EXPECT_FALSE(OptDropsBeforeNextUse(apart, resident, 2, 0, /*victim=*/0, all)) << "1 then 2 share the other slot";
  EXPECT_TRUE(OptDropsBeforeNextUse(apart, resident, 1, 0, 0, all));
  // With a prefetch one moment ahead, chunk 2 comes while chunk 1 is in use.
  EXPECT_TRUE(OptDropsBeforeNextUse(apart, resident, 2, 1, 0, all));
  EXPECT_FALSE(OptDropsBeforeNextUse(apart, resident, 3, 1, 0, all));
  // Two chunks in one moment need both other slots.
  const ChunkTrace together = TraceAt({{0}, {1}, {2, 3}, {0}}, 1);
  EXPECT_TRUE(OptDropsBeforeNextUse(together, resident, 2, 0, 0, all));
  EXPECT_FALSE(OptDropsBeforeNextUse(together, resident, 3, 0, 0, all));
  // Chunks of another pool hold none of these slots.
  EXPECT_FALSE(OptDropsBeforeNextUse(together, resident, 2, 0, 0, [](int32_t i) { return i != 3; }));
  // A resident chunk not used before the victim is dropped first: chunk 1
  // takes chunk 4's slot.
  const ChunkTrace idle = TraceAt({{0}, {1}, {0}, {4}}, 1);
  EXPECT_FALSE(OptDropsBeforeNextUse(idle, std::vector<int32_t>{0, 4}, 2, 0, 0, all));
  // A chunk the trace never uses is always dropped.
  const ChunkTrace unused = TraceAt({{5}, {1}, {2}}, 1);
  EXPECT_TRUE(OptDropsBeforeNextUse(unused, std::vector<int32_t>{7, 1}, 8, 0, 7, all));
}

TEST(Eviction, AFilledChunkTakesItsSlotOnlyAtItsUse) {
  const auto all = [](int32_t) { return true; };
  // Serving moment 1 (chunk 1), chunk 0 next used at 4. Brought two moments
  // ahead, chunk 3 would hold a slot from moment 2, beside 1 and 2: with
  // three slots chunk 0 goes. Filled at its use (moment 3), it takes chunk
  // 1's slot, whose last use is over by then.
  const ChunkTrace t = TraceAt({{0}, {1}, {2, 1}, {3, 2}, {0}}, 1);
  const std::vector<int32_t> resident = {0, 1, 2};
  EXPECT_TRUE(OptDropsBeforeNextUse(t, resident, 3, 2, 0, all));
  EXPECT_FALSE(OptDropsBeforeNextUse(t, resident, 3, 2, 0, all, [](int32_t i) { return i == 3; }));
  // A filled chunk still holds a slot at its use: there 2 and 3 fill two.
  const ChunkTrace later = TraceAt({{0}, {1}, {2}, {3, 2}, {0}}, 1);
  const auto filled = [](int32_t i) { return i == 3; };
  EXPECT_TRUE(OptDropsBeforeNextUse(later, std::vector<int32_t>{0, 1}, 2, 0, 0, all, filled));
  EXPECT_FALSE(OptDropsBeforeNextUse(later, std::vector<int32_t>{0, 1}, 3, 0, 0, all, filled));
}

TEST(Eviction, OptDropsReadsTheNextStepForAVictimUsedThere) {
  const auto all = [](int32_t) { return true; };
  // Serving moment 2 (chunk 2): chunk 0 is next used at the next step's
  // moment 0, and only chunk 3 comes before it.
  const ChunkTrace t = TraceAt({{0}, {1}, {2}, {3}}, 2);
  EXPECT_FALSE(OptDropsBeforeNextUse(t, std::vector<int32_t>{0, 2}, 2, 0, 0, all));
  EXPECT_TRUE(OptDropsBeforeNextUse(t, std::vector<int32_t>{0, 2}, 1, 0, 0, all));
}

}  // namespace
}  // namespace pstar
