#include "kernels/rope.h"

#include "kernels/cpu/isa_target.h"
#include "kernels/half.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// `sign` +1 rotates by the angle, -1 by its negative (the transpose).
template <typename T, typename Load, typename Store>
void RotateRows(T* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
                int64_t heads, int64_t D, float sign, Load load, Store store) {
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cos + int64_t(positions[n]) * half;
    const float* s = sin + int64_t(positions[n]) * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + n * row_stride + h * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = load(v[i]), b = load(v[i + half]);
        const float si = sign * s[i];
        v[i] = store(a * c[i] - b * si);
        v[i + half] = store(b * c[i] + a * si);
      }
    }
  }
}

}  // namespace

void RopeForward(float* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                 int64_t N, int64_t heads, int64_t D) {
  RotateRows(x, row_stride, cos, sin, positions, N, heads, D, 1.0f, KeepFloat{}, KeepFloat{});
}

void RopeForward(uint16_t* x, bool bf16, int64_t row_stride, const float* cos, const float* sin,
                 const int32_t* positions, int64_t N, int64_t heads, int64_t D) {
  if (bf16) return RotateRows(x, row_stride, cos, sin, positions, N, heads, D, 1.0f, WidenBf16{}, NarrowBf16{});
  RotateRows(x, row_stride, cos, sin, positions, N, heads, D, 1.0f, WidenHalf{}, NarrowHalf{});
}

void RopeBackward(float* dx, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                  int64_t N, int64_t heads, int64_t D) {
  RotateRows(dx, row_stride, cos, sin, positions, N, heads, D, -1.0f, KeepFloat{}, KeepFloat{});
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
