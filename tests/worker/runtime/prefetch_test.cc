#include "worker/runtime/prefetch.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "tests/worker/runtime/runtime_test_fixtures.h"

namespace pstar {
namespace {

TEST(Prefetch, WithinAStepLoadsTheNextMomentsNearestFirstAndStopsWithoutRoom) {
  ChunkTrace t(8);
  test::RecordStep(t, {{0}, {1, 2}, {3}, {4}});
  t.BeginStep();
  t.Observe({0});
  std::vector<std::pair<int32_t, int64_t>> asked;
  PrefetchWithinStep(t, 2, [&](int32_t i, int64_t d) {
    asked.push_back({i, d});
    return true;
  });
  EXPECT_EQ(asked, (std::vector<std::pair<int32_t, int64_t>>{{1, 1}, {2, 1}, {3, 2}}));
  asked.clear();
  PrefetchWithinStep(t, 2, [&](int32_t i, int64_t d) {
    asked.push_back({i, d});
    return i != 1;
  });
  EXPECT_EQ(asked.size(), 1u);
  asked.clear();
  PrefetchWithinStep(t, 0, [&](int32_t i, int64_t d) {
    asked.push_back({i, d});
    return true;
  });
  EXPECT_TRUE(asked.empty());
}

TEST(Prefetch, BetweenStepsSkipsGradientsAndCountsFromBeforeTheFirstMoment) {
  ChunkPlacement p;
  p.num_chunks = 2;  // index 2, 3 are gradients
  ChunkTrace t(p.total());
  test::RecordStep(t, {{0, 2}, {1, 3}, {1}});
  std::vector<std::pair<int32_t, int64_t>> asked;
  PrefetchNextStep(t, 2, p, [&](int32_t i, int64_t d) {
    asked.push_back({i, d});
    EXPECT_EQ(t.moment(), -1);
    return true;
  });
  EXPECT_EQ(asked, (std::vector<std::pair<int32_t, int64_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(t.moment(), 0);
}

TEST(Prefetch, BetweenStepsInPiecesLoadsWhatTheWholeWalkDoesAsChunksBecomeReady) {
  ChunkPlacement p;
  p.num_chunks = 3;  // 3, 4, 5 are gradients
  ChunkTrace t(p.total());
  test::RecordStep(t, {{0, 3}, {1}, {2, 4}, {1, 5}});
  std::vector<std::pair<int32_t, int64_t>> whole, pieces;
  PrefetchNextStep(t, 3, p, [&](int32_t i, int64_t d) {
    whole.push_back({i, d});
    return true;
  });
  std::vector<bool> ready(3, false);
  NextStepPrefetch walk;
  auto load = [&](int32_t i, int64_t d) {
    EXPECT_TRUE(ready[size_t(i)]) << "chunk " << i << " loaded before it was ready";
    pieces.push_back({i, d});
    return true;
  };
  auto is_ready = [&](int32_t i) { return bool(ready[size_t(i)]); };
  walk.Advance(t, 3, p, load, is_ready);  // nothing ready: nothing loaded
  EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(t.moment(), -1);
  ready[1] = true;  // not the first: still nothing
  walk.Advance(t, 3, p, load, is_ready);
  EXPECT_TRUE(pieces.empty());
  ready[0] = true;
  walk.Advance(t, 3, p, load, is_ready);  // moments 0 and 1, then 2 waits
  EXPECT_EQ(pieces, (std::vector<std::pair<int32_t, int64_t>>{{0, 1}, {1, 2}}));
  EXPECT_FALSE(walk.ended());
  walk.Finish(t, 3, p, [&](int32_t i, int64_t d) {
    pieces.push_back({i, d});
    return true;
  });
  EXPECT_EQ(pieces, whole);
  EXPECT_TRUE(walk.ended());
  EXPECT_EQ(t.moment(), 0);

  // Without room the walk ends for good, ready or not.
  pieces.clear();
  walk.Reset();
  walk.Advance(
      t, 3, p,
      [&](int32_t i, int64_t d) {
        pieces.push_back({i, d});
        return i != 1;
      },
      [](int32_t) { return true; });
  EXPECT_TRUE(walk.ended());
  walk.Finish(t, 3, p, [&](int32_t i, int64_t d) {
    pieces.push_back({i, d});
    return true;
  });
  EXPECT_EQ(pieces, (std::vector<std::pair<int32_t, int64_t>>{{0, 1}, {1, 2}}));
}

}  // namespace
}  // namespace pstar
