// GELU, tanh approximation (GPT-2's "gelu_new", PyTorch approximate='tanh').
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

void GeluForward(float* out, const float* inp, int64_t n);
// dinp = gelu'(inp) * dout (overwritten; dinp may alias dout).
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace pstar::kernels::cpu
