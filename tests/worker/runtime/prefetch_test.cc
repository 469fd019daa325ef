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

}  // namespace
}  // namespace pstar
