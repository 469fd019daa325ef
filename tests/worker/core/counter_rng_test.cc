#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "worker/core/counter_rng.h"

namespace pstar {
namespace {

TEST(CounterRng, PureFunctionOfSeedStreamAndIndex) {
  EXPECT_EQ(CounterNormal(1, 2, 3), CounterNormal(1, 2, 3));
  EXPECT_NE(CounterNormal(1, 2, 3), CounterNormal(1, 2, 4));
  EXPECT_NE(CounterNormal(1, 2, 3), CounterNormal(1, 5, 3));
  EXPECT_NE(CounterNormal(1, 2, 3), CounterNormal(9, 2, 3));
  // A slice filled on its own equals the same slice of a whole fill.
  std::vector<float> whole(1000), slice(100);
  FillNormal(whole.data(), 1000, 0.02f, 7, StableKey("w"), 0);
  FillNormal(slice.data(), 100, 0.02f, 7, StableKey("w"), 450);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(slice[size_t(i)], whole[size_t(450 + i)]);
}

TEST(CounterRng, NormalMoments) {
  const int n = 200000;
  double s = 0, ss = 0, u = 0;
  for (int i = 0; i < n; ++i) {
    double x = CounterNormal(3, 4, uint64_t(i));
    s += x;
    ss += x * x;
    u += CounterUniform(3, 4, uint64_t(i));
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(ss / n, 1.0, 0.01);
  EXPECT_NEAR(u / n, 0.5, 0.005);
}

TEST(CounterRng, PhiloxKnownAnswer) {
  // Random123's published known-answer vector for philox4x32-10 with zero inputs.
  auto r = Philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

}  // namespace
}  // namespace pstar
