// exp and tanh written as plain float arithmetic (a range reduction and a
// polynomial, as Cephes' expf), so that `omp simd` loops calling them
// vectorize; libm's calls do not. Accurate to about 2 ulp for inputs in
// [-87.33, 88.37]; below (-inf included) exp is exactly 0, above +inf, of NaN
// NaN. Files using them compile without FMA contraction (and without trapping
// math, so the selects vectorize), so a value's bits do not depend on whether
// a vector lane or a loop's scalar remainder computed it (and so not on how
// threads split the loop).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pstar::kernels::cpu {

inline float VecExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // Inputs whose results are normal floats, and whose 2^n scale is one: the
  // top (88.38, 88.72] also goes to +inf, as in Cephes' expf.
  constexpr float kMin = -87.3365448f, kMax = 88.3762626f;
  const bool nan = x != x;
  const bool underflow = x < kMin, overflow = x > kMax;
  const float xc = nan ? 0.0f : underflow ? kMin : overflow ? kMax : x;
  // xc = n ln2 + r, |r| <= ln2 / 2
  const float fn = std::floor(xc * kLog2e + 0.5f);
  const float r = (xc - fn * kLn2Hi) - fn * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^n through the exponent bits (n >= -126 after the clamp).
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float result = y * scale;
  result = underflow ? 0.0f : result;
  result = overflow ? __builtin_inff() : result;
  return nan ? x : result;  // NaN stays NaN: overflow checks downstream see it
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): saturates to +-1 exactly.
inline float VecTanh(float x) { return 1.0f - 2.0f / (VecExp(2.0f * x) + 1.0f); }

// Reductions over a row in kReduceLanes fixed lanes: element c goes to lane
// c % kReduceLanes and the lanes are combined in one fixed order, so the
// result depends on the row's length alone (not on alignment or threads) and
// the loop vectorizes, where an in-order fold is one chain of dependent ops.
inline constexpr int64_t kReduceLanes = 16;

// max(init, x[0..n)); a NaN element may or may not survive (as with a
// plain a > b ? a : b fold), so callers let NaN through their sums instead.
inline float RowMax(const float* x, int64_t n, float init) {
  float lane[kReduceLanes];
  for (float& v : lane) v = init;
  int64_t c = 0;
  for (; c + kReduceLanes <= n; c += kReduceLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kReduceLanes; ++l) lane[l] = lane[l] > x[c + l] ? lane[l] : x[c + l];
  }
  for (int64_t l = 0; c + l < n; ++l) lane[l] = lane[l] > x[c + l] ? lane[l] : x[c + l];
  float m = lane[0];
  for (int64_t l = 1; l < kReduceLanes; ++l) m = m > lane[l] ? m : lane[l];
  return m;
}

}  // namespace pstar::kernels::cpu
