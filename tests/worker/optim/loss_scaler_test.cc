#include "worker/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace pstar {
namespace {

Fp16Section Dynamic(int64_t power, int64_t window, int64_t hysteresis, float min_scale) {
  Fp16Section f;
  f.initial_scale_power = power;
  f.loss_scale_window = window;
  f.hysteresis = hysteresis;
  f.min_loss_scale = min_scale;
  return f;
}

TEST(LossScaler, DisabledIsTheIdentity) {
  LossScaler s = LossScaler::FromConfig(Dynamic(16, 2, 1, 1), false);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_FALSE(s.Update(false));  // not applied, and the trainer reports divergence
  EXPECT_EQ(s.scale(), 1.0f);
}

TEST(LossScaler, DoublesAfterACleanWindowAndHalvesOnOverflow) {
  LossScaler s = LossScaler::FromConfig(Dynamic(4, 3, 1, 1), true);
  EXPECT_EQ(s.scale(), 16.0f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 16.0f);
  EXPECT_TRUE(s.Update(true));  // the third clean step in a row
  EXPECT_EQ(s.scale(), 32.0f);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 16.0f);
  // The clean count restarted at the overflow.
  EXPECT_TRUE(s.Update(true));
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 16.0f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 32.0f);
}

TEST(LossScaler, HysteresisToleratesOverflowsBeforeHalving) {
  LossScaler s = LossScaler::FromConfig(Dynamic(10, 100, 3, 1), true);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_FALSE(s.Update(false));  // the third: halve, and every later one too
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(LossScaler, NeverBelowTheMinimum) {
  LossScaler s = LossScaler::FromConfig(Dynamic(3, 100, 1, 2), true);
  EXPECT_FALSE(s.at_minimum());
  s.Update(false);
  EXPECT_EQ(s.scale(), 4.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2.0f);
  EXPECT_TRUE(s.at_minimum());
  s.Update(false);
  EXPECT_EQ(s.scale(), 2.0f);
}

TEST(LossScaler, StaticScaleSkipsOverflowsWithoutChanging) {
  Fp16Section f;
  f.loss_scale = 128.0f;
  f.loss_scale_window = 1;
  LossScaler s = LossScaler::FromConfig(f, true);
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_FALSE(s.at_minimum());
}

TEST(LossScaler, RestoreContinuesFromACheckpointsScale) {
  LossScaler s = LossScaler::FromConfig(Dynamic(16, 2, 2, 1), true);
  s.Update(false);  // spends one unit of hysteresis
  s.Restore(256.0f);
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_FALSE(s.Update(false));  // the budget is whole again: no halving yet
  EXPECT_EQ(s.scale(), 256.0f);
  LossScaler off = LossScaler::FromConfig(Dynamic(16, 2, 2, 1), false);
  off.Restore(256.0f);
  EXPECT_EQ(off.scale(), 1.0f);
}

}  // namespace
}  // namespace pstar
