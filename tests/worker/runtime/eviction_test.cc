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

}  // namespace
}  // namespace pstar
