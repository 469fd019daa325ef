// Residual connection out = a + b.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

void ResidualForward(float* out, const float* a, const float* b, int64_t n);

}  // namespace pstar::kernels::cpu
