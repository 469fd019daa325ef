#include "kernels/residual.h"

#include "kernels/half.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void ResidualForward(uint16_t* out, const uint16_t* a, const float* b, bool bf16, int64_t n) {
  if (bf16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(BFloat16ToFloat(a[i]) + b[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(HalfToFloat(a[i]) + b[i]);
  }
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
