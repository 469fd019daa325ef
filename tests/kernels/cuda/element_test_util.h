// Element types for the CUDA kernel tests: host-side rounding to bf16/fp16
// (kernels/half.h, round to nearest even), random inputs already exact in the
// element type, and per-element comparisons against the CPU kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/launch.h"
#include "kernels/half.h"

namespace pstar::test {

using kernels::cuda::bf16;
using kernels::cuda::fp16;

// Per element type: host conversions and the tolerance of results stored in
// it (fp32 results differ from the CPU only in summation order; 16-bit ones
// are also rounded to 8 or 11 significant bits).
template <typename T>
struct Element;

template <>
struct Element<float> {
  static constexpr double kTolerance = 1e-5;
  static float FromFloat(float f) { return f; }
  static float ToFloat(float x) { return x; }
};

template <>
struct Element<bf16> {
  static constexpr double kTolerance = 1e-2;
  static bf16 FromFloat(float f) {
    __nv_bfloat16_raw raw;
    raw.x = kernels::FloatToBFloat16(f);
    return bf16(raw);
  }
  static float ToFloat(bf16 x) { return kernels::BFloat16ToFloat(static_cast<__nv_bfloat16_raw>(x).x); }
};

template <>
struct Element<fp16> {
  static constexpr double kTolerance = 1e-2;
  static fp16 FromFloat(float f) {
    __half_raw raw;
    raw.x = kernels::FloatToHalf(f);
    return fp16(raw);
  }
  static float ToFloat(fp16 x) { return kernels::HalfToFloat(static_cast<__half_raw>(x).x); }
};

using ElementTypes = ::testing::Types<float, bf16, fp16>;

// Names the typed tests by element type.
struct ElementName {
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, float>) return "fp32";
    if (std::is_same_v<T, bf16>) return "bf16";
    return "fp16";
  }
};

// Normal(0, scale) values rounded to T, returned as floats (exact in T).
template <typename T>
std::vector<float> RandomValues(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = Element<T>::ToFloat(Element<T>::FromFloat(dist(rng)));
  return v;
}

template <typename T>
std::vector<T> ToElements(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Element<T>::FromFloat(v[i]);
  return out;
}

template <typename T>
std::vector<float> ToFloats(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Element<T>::ToFloat(v[i]);
  return out;
}

// Checks |got - want| <= tol * (|want| + max(max|want|, floor)) element by
// element: the error relative to the element itself or, for elements near
// zero after cancellation, to the size of the tensor. `floor` is the size of
// the terms that cancel where the tensor itself can be all but zero (a
// gradient that is a difference of equal terms, one element near a zero of
// its function). Reports the worst one.
inline ::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                                           double floor = 0.0) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  double scale = floor;
  for (float w : want) scale = std::max(scale, std::abs(double(w)));
  double worst_ratio = 0.0;
  size_t worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    const double allowed = tol * (std::abs(double(want[i])) + scale) + 1e-30;
    const double ratio = std::isnan(err) ? INFINITY : err / allowed;
    if (ratio > 1.0) ++bad;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off; worst [" << worst
                                       << "]: got " << got[worst] << ", want " << want[worst] << " (max " << scale
                                       << ", tolerance " << tol << ")";
}

}  // namespace pstar::test
