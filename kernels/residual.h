// Residual connection out = a + b.
#ifndef PSTAR_KERNELS_RESIDUAL_H_
#define PSTAR_KERNELS_RESIDUAL_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_RESIDUAL_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

void ResidualForward(float* out, const float* a, const float* b, int64_t n);
// The residual stream of a 16-bit run: a and out 16-bit (bfloat16 when
// `bf16`, else IEEE half), b fp32; the fp32 sum rounded once (nearest even).
// out may alias a.
void ResidualForward(uint16_t* out, const uint16_t* a, const float* b, bool bf16, int64_t n);

}  // namespace pstar::kernels::cpu
