// Shared by the CUDA attention tests: a shape and the gradient check against
// the CPU kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {

// C = NH * head size (the out row); NKV key/value heads (0: NH, multi-head).
struct AttentionShape {
  int64_t B, T, C, NH, NKV = 0;
  int64_t kv() const { return NKV > 0 ? NKV : NH; }
  int64_t hs() const { return C / NH; }
  int64_t Row() const { return C + 2 * kv() * hs(); }  // a q|k|v row
  kernels::AttentionShape Kernel() const { return {B, T, NH, kv(), hs()}; }
};

inline testing::Message Describe(const AttentionShape& s) {
  return testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " NKV=" << s.kv();
}

// q, k and v gradients separately: each has its own scale. dq and dk are sums
// of p·(dout·v - dout·out) terms that cancel exactly at one position (T=1:
// both are zero, computed as a difference of equal dot products summed in
// different orders), so the whole gradient's size is the floor of each part's.
template <typename T>
void ExpectGradientsClose(const std::vector<float>& got, const std::vector<float>& want, const AttentionShape& s) {
  double floor = 0.0;
  for (float w : want) floor = std::max(floor, std::abs(double(w)));
  const int64_t kv_width = s.kv() * s.hs();
  const int64_t first[3] = {0, s.C, s.C + kv_width}, width[3] = {s.C, kv_width, kv_width};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got_part, want_part;
    for (int64_t row = 0; row < s.B * s.T; ++row) {
      for (int64_t c = 0; c < width[part]; ++c) {
        got_part.push_back(got[size_t(row * s.Row() + first[part] + c)]);
        want_part.push_back(want[size_t(row * s.Row() + first[part] + c)]);
      }
    }
    EXPECT_TRUE(AllClose(got_part, want_part, Element<T>::kTolerance, floor)) << "d"
                                                                              << "qkv"[part];
  }
}

}  // namespace pstar::test
