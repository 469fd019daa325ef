#include "kernels/gelu.h"

#include <algorithm>

#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

inline float Gelu(float x) {
  float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + VecTanh(u));
}

// gelu'(x).
inline float GeluSlope(float x) {
  float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  float th = VecTanh(u);
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

// n values of x (16 bits) widened into pieces of kPiece floats, each piece
// handed to body(first, widened, count): the fp32 loops above then run on
// them unchanged (same bits), vectorized.
constexpr int64_t kPiece = 1024;

template <typename Body>
void InWidenedPieces(const uint16_t* x, bool bf16, int64_t n, Body body) {
#pragma omp parallel for schedule(static)
  for (int64_t p0 = 0; p0 < n; p0 += kPiece) {
    float w[kPiece];
    const int64_t m = std::min(kPiece, n - p0);
    if (bf16) {
      for (int64_t i = 0; i < m; ++i) w[i] = BFloat16ToFloat(x[p0 + i]);
    } else {
      for (int64_t i = 0; i < m; ++i) w[i] = HalfToFloat(x[p0 + i]);
    }
    body(p0, w, m);
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = Gelu(inp[i]);
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dinp[i] = GeluSlope(inp[i]) * dout[i];
}

void GeluForward(uint16_t* out, const uint16_t* inp, bool bf16, int64_t n) {
  InWidenedPieces(inp, bf16, n, [&](int64_t p0, float* x, int64_t m) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) x[i] = Gelu(x[i]);
    if (bf16) {
      for (int64_t i = 0; i < m; ++i) out[p0 + i] = FloatToBFloat16(x[i]);
    } else {
      for (int64_t i = 0; i < m; ++i) out[p0 + i] = FloatToHalf(x[i]);
    }
  });
}

void GeluBackward(float* dinp, const uint16_t* inp, bool bf16, const float* dout, int64_t n) {
  InWidenedPieces(inp, bf16, n, [&](int64_t p0, float* x, int64_t m) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) dinp[p0 + i] = GeluSlope(x[i]) * dout[p0 + i];
  });
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
