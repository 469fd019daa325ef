#include "kernels/gelu.h"

#include <algorithm>

#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"

namespace pstar::kernels::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + VecTanh(u));
  }
}

void GeluForward(uint16_t* out, bool bf16, const float* inp, int64_t n) {
  // Pieces computed in fp32 as above (same bits), then narrowed: the tanh
  // loop stays vectorized.
  constexpr int64_t kPiece = 1024;
#pragma omp parallel for schedule(static)
  for (int64_t p0 = 0; p0 < n; p0 += kPiece) {
    float y[kPiece];
    const int64_t m = std::min(kPiece, n - p0);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      float x = inp[p0 + i];
      float u = kSqrt2OverPi * (x + kCubic * x * x * x);
      y[i] = 0.5f * x * (1.0f + VecTanh(u));
    }
    if (bf16) {
      for (int64_t i = 0; i < m; ++i) out[p0 + i] = FloatToBFloat16(y[i]);
    } else {
      for (int64_t i = 0; i < m; ++i) out[p0 + i] = FloatToHalf(y[i]);
    }
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    float th = VecTanh(u);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = grad * dout[i];
  }
}

}  // namespace pstar::kernels::cpu
