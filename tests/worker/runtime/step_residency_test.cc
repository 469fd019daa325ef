// StepResidency on hand-made counters: phases record their residency and the
// bytes moved since the previous phase end, the peak follows every change, and
// nothing is published until the step ends.
#include "worker/runtime/step_residency.h"

#include <gtest/gtest.h>

namespace pstar {
namespace {

constexpr int kDev = int(Tier::kDevice), kHost = int(Tier::kHost);
constexpr int kH2d = int(Direction::kHostToDevice), kD2h = int(Direction::kDeviceToHost);
constexpr int kParam = int(StateKind::kParam), kGrad = int(StateKind::kGrad);

// Moves `bytes` of `kind` between the tiers as the chunk manager would.
void Move(RuntimeCounters& c, StepResidency& r, int kind, Direction d, int64_t bytes) {
  const int to = d == Direction::kHostToDevice ? kDev : kHost;
  c.resident_bytes[to][kind] += bytes;
  r.OnResidencyChange(Tier(to), bytes);
  c.moved_kind_bytes[int(d)][kind] += bytes;
}
void Drop(RuntimeCounters& c, StepResidency& r, int kind, int64_t bytes) {
  c.resident_bytes[kDev][kind] -= bytes;
  r.OnResidencyChange(Tier::kDevice, -bytes);
}

TEST(StepResidency, PublishesPhasesPeakAndMovesWhenTheStepEnds) {
  RuntimeCounters c;
  c.resident_bytes[kHost][kParam] = 1000;
  c.resident_bytes[kDev][kParam] = 100;   // left by an earlier step
  c.moved_kind_bytes[kH2d][kParam] = 5;   // moved before this step: not counted
  StepResidency r;
  r.EndPhase(StepPhase::kForward, c);     // before any step: ignored
  r.BeginStep(c);
  for (int micro = 0; micro < 2; ++micro) {
    Move(c, r, kParam, Direction::kHostToDevice, 300);  // 400 on the device
    r.EndPhase(StepPhase::kForward, c);
    Move(c, r, kGrad, Direction::kHostToDevice, 50);    // the step's peak, 500, in the second micro-batch
    Drop(c, r, kParam, 300);
    r.EndPhase(StepPhase::kBackward, c);
  }
  Move(c, r, kGrad, Direction::kDeviceToHost, 40);
  Drop(c, r, kGrad, 100);
  r.EndPhase(StepPhase::kBackward, c);
  EXPECT_EQ(c.steps_recorded, 0);
  Drop(c, r, kParam, 100);
  r.EndStep(&c);

  EXPECT_EQ(c.steps_recorded, 1);
  EXPECT_EQ(c.step_peak_bytes[kDev], 500);
  EXPECT_EQ(c.step_peak_bytes[kHost], 1040);
  // Residency at the last end of each phase.
  const int fwd = int(StepPhase::kForward), bwd = int(StepPhase::kBackward), opt = int(StepPhase::kOptimizer);
  EXPECT_EQ(c.step_resident_bytes[fwd][kDev][kParam], 400);
  EXPECT_EQ(c.step_resident_bytes[fwd][kDev][kGrad], 50);
  EXPECT_EQ(c.step_resident_bytes[bwd][kDev][kParam], 100);
  EXPECT_EQ(c.step_resident_bytes[bwd][kDev][kGrad], 0);
  EXPECT_EQ(c.step_resident_bytes[opt][kDev][kParam], 0);
  EXPECT_EQ(c.step_resident_bytes[opt][kHost][kGrad], 40);
  // Moves, summed over the repeats of a phase.
  EXPECT_EQ(c.step_moved_bytes[fwd][kH2d][kParam], 600);
  EXPECT_EQ(c.step_moved_bytes[bwd][kH2d][kGrad], 100);
  EXPECT_EQ(c.step_moved_bytes[bwd][kD2h][kGrad], 40);
  EXPECT_EQ(c.step_moved_bytes[opt][kD2h][kGrad], 0);

  // The next step starts from zero moves and the residency it finds.
  r.BeginStep(c);
  Move(c, r, kParam, Direction::kHostToDevice, 10);
  r.EndStep(&c);
  EXPECT_EQ(c.steps_recorded, 2);
  EXPECT_EQ(c.step_peak_bytes[kDev], 10);
  EXPECT_EQ(c.step_moved_bytes[fwd][kH2d][kParam], 0);
  EXPECT_EQ(c.step_moved_bytes[opt][kH2d][kParam], 10);
  EXPECT_EQ(c.step_resident_bytes[fwd][kDev][kParam], 0);
}

}  // namespace
}  // namespace pstar
