// GELU, tanh approximation (GPT-2's "gelu_new", PyTorch approximate='tanh').
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

void GeluForward(float* out, const float* inp, int64_t n);
// The same with out narrowed to 16 bits (bfloat16 when `bf16`, else IEEE
// half, nearest even): exactly the fp32 kernel's out rounded, the next linear
// layer's operand in a 16-bit run.
void GeluForward(uint16_t* out, bool bf16, const float* inp, int64_t n);
// dinp = gelu'(inp) * dout (overwritten; dinp may alias dout).
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace pstar::kernels::cpu
