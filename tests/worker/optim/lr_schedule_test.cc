#include <gtest/gtest.h>

#include "worker/optim/lr_schedule.h"

#include <cmath>

namespace pstar {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0f, 0.1f, 4, 14, LrDecay::kCosine};
  EXPECT_FLOAT_EQ(s.At(0), 0.25f);
  EXPECT_FLOAT_EQ(s.At(3), 1.0f);
  EXPECT_FLOAT_EQ(s.At(4), 1.0f);
  EXPECT_NEAR(s.At(9), 0.1f + 0.9f * 0.5f * (1 + std::cos(3.14159265 * 5 / 9)), 1e-6);
  EXPECT_FLOAT_EQ(s.At(13), 0.1f);
  for (int i = 5; i < 14; ++i) EXPECT_LT(s.At(i), s.At(i - 1));
  LrSchedule c{1.0f, 0.0f, 0, 10, LrDecay::kConstant};
  EXPECT_FLOAT_EQ(c.At(7), 1.0f);
}

}  // namespace
}  // namespace pstar
