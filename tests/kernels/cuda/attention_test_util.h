// Shared by the CUDA attention tests: a shape and the gradient check against
// the CPU kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {

struct AttentionShape {
  int64_t B, T, C, NH;
};

inline testing::Message Describe(const AttentionShape& s) {
  return testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH;
}

// q, k and v gradients separately: each has its own scale. dq and dk are sums
// of p·(dout·v - dout·out) terms that cancel exactly at one position (T=1:
// both are zero, computed as a difference of equal dot products summed in
// different orders), so the whole gradient's size is the floor of each part's.
template <typename T>
void ExpectGradientsClose(const std::vector<float>& got, const std::vector<float>& want, const AttentionShape& s) {
  double floor = 0.0;
  for (float w : want) floor = std::max(floor, std::abs(double(w)));
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got_part, want_part;
    for (int64_t row = 0; row < s.B * s.T; ++row) {
      for (int64_t c = 0; c < s.C; ++c) {
        got_part.push_back(got[size_t(row * 3 * s.C + part * s.C + c)]);
        want_part.push_back(want[size_t(row * 3 * s.C + part * s.C + c)]);
      }
    }
    EXPECT_TRUE(AllClose(got_part, want_part, Element<T>::kTolerance, floor)) << "d"
                                                                              << "qkv"[part];
  }
}

}  // namespace pstar::test
