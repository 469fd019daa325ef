#include "worker/runtime/chunk_trace.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "tests/worker/runtime/runtime_test_fixtures.h"

namespace pstar {
namespace {

TEST(ChunkTrace, TheFirstStepIsAdoptedAndARepeatKeepsIt) {
  ChunkTrace t(8);
  EXPECT_FALSE(t.valid());
  test::RecordStep(t, {{0, 1}, {2}, {1, 3}});
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.size(), 3);
  EXPECT_EQ(t.recordings(), 1);
  test::RecordStep(t, {{0, 1}, {2}, {1, 3}});
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.recordings(), 1);
}

TEST(ChunkTrace, AChangedMomentInvalidatesUntilTheStepIsAdopted) {
  ChunkTrace t(8);
  test::RecordStep(t, {{0}, {1}, {2}});
  t.BeginStep();
  t.Observe({0});
  t.Advance();
  EXPECT_TRUE(t.valid());
  t.Observe({4});
  EXPECT_FALSE(t.valid());
  t.Advance();
  t.EndStep();
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.recordings(), 2);
  EXPECT_EQ(t.size(), 2);
  EXPECT_EQ(t.MomentAt(1), std::vector<int32_t>{4});
  // A longer step than the trace: the extra moment invalidates it.
  t.BeginStep();
  for (auto m : {0, 4, 5}) {
    t.Observe({m});
    t.Advance();
  }
  EXPECT_FALSE(t.valid());
  t.EndStep();
  EXPECT_EQ(t.size(), 3);
  // A shorter one is adopted at its end.
  test::RecordStep(t, {{0}});
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.recordings(), 4);
}

TEST(ChunkTrace, NextUseDistanceWrapsIntoTheNextStep) {
  ChunkTrace t(8);
  test::RecordStep(t, {{0}, {1}, {2}, {0}});
  t.BeginStep();
  t.Observe({0});  // serving moment 0
  EXPECT_EQ(t.NextUseDistance(1), 1);
  EXPECT_EQ(t.NextUseDistance(2), 2);
  EXPECT_EQ(t.NextUseDistance(0), 3);
  EXPECT_EQ(t.NextUseDistance(7), std::numeric_limits<int64_t>::max());
  t.Advance();
  t.Observe({1});
  t.Advance();
  t.Observe({2});
  t.Advance();
  t.Observe({0});  // moment 3: chunk 1's next use is moment 1 of the next step
  EXPECT_EQ(t.NextUseDistance(1), 4 - 3 + 1);
  t.set_moment(-1);  // before the next step
  EXPECT_EQ(t.NextUseDistance(0), 1);
}

TEST(ChunkTrace, CurrentRunEndsAtTheFirstMomentWithoutTheChunk) {
  ChunkTrace t(8);
  test::RecordStep(t, {{0, 1}, {1}, {1, 2}, {2}, {1}, {0}});
  t.BeginStep();
  t.Observe({0, 1});  // serving moment 0: chunk 1 is held through moment 2
  EXPECT_EQ(t.CurrentRun(1).release, 3);
  EXPECT_EQ(t.CurrentRun(1).next_use, 4);
  EXPECT_EQ(t.CurrentRun(0).release, 1);
  EXPECT_EQ(t.CurrentRun(0).next_use, 5);
  EXPECT_EQ(t.CurrentRun(2).release, 0);  // not used now
  EXPECT_EQ(t.CurrentRun(2).next_use, 0);
  for (int m = 1; m < 5; ++m) {
    t.Advance();
    t.Observe(std::vector<int32_t>(t.MomentAt(m)));
  }
  // Moment 4: chunk 1's run ends here; its next use is the next step's first moment.
  EXPECT_EQ(t.CurrentRun(1).release, 1);
  EXPECT_EQ(t.CurrentRun(1).next_use, 6 - 4 + 0);
}

}  // namespace
}  // namespace pstar
