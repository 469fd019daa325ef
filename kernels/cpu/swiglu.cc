#include "kernels/swiglu.h"

#include <cmath>

#include "kernels/cpu/isa_target.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// VecExp's, so that the rows' loops vectorize (this file compiles as
// vector_math.h asks: the same bits in a vector lane and in the remainder).
inline float Sigmoid(float g) { return 1.0f / (1.0f + VecExp(-g)); }

template <typename T, typename Load, typename Store>
void SwiGluRows(T* out, const T* gu, int64_t N, int64_t F, Load load, Store store) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gu + n * 2 * F;
    const T* up = gate + F;
    T* o = out + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float g = load(gate[f]);
      o[f] = store(g * Sigmoid(g) * load(up[f]));
    }
  }
}

// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename T, typename Load>
void SwiGluBackwardRows(float* dgu, const T* gu, const float* dout, int64_t N, int64_t F, Load load) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gu + n * 2 * F;
    const T* up = gate + F;
    float* dgate = dgu + n * 2 * F;
    float* dup = dgate + F;
    const float* dy = dout + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float g = load(gate[f]), u = load(up[f]), d = dy[f];
      const float s = Sigmoid(g);
      dgate[f] = d * u * (s * (1.0f + g * (1.0f - s)));
      dup[f] = d * (g * s);
    }
  }
}

}  // namespace

void SwiGluForward(float* out, const float* gu, int64_t N, int64_t F) {
  SwiGluRows(out, gu, N, F, KeepFloat{}, KeepFloat{});
}

void SwiGluForward(uint16_t* out, const uint16_t* gu, bool bf16, int64_t N, int64_t F) {
  if (bf16) return SwiGluRows(out, gu, N, F, WidenBf16{}, NarrowBf16{});
  SwiGluRows(out, gu, N, F, WidenHalf{}, NarrowHalf{});
}

void SwiGluBackward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F) {
  SwiGluBackwardRows(dgu, gu, dout, N, F, KeepFloat{});
}

void SwiGluBackward(float* dgu, const uint16_t* gu, bool bf16, const float* dout, int64_t N, int64_t F) {
  if (bf16) return SwiGluBackwardRows(dgu, gu, dout, N, F, WidenBf16{});
  SwiGluBackwardRows(dgu, gu, dout, N, F, WidenHalf{});
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
