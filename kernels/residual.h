// Residual connection out = a + b.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

void ResidualForward(float* out, const float* a, const float* b, int64_t n);
// The residual stream of a 16-bit run: a and out 16-bit (bfloat16 when
// `bf16`, else IEEE half), b fp32; the fp32 sum rounded once (nearest even).
// out may alias a.
void ResidualForward(uint16_t* out, const uint16_t* a, const float* b, bool bf16, int64_t n);

}  // namespace pstar::kernels::cpu
