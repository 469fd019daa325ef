// SwiGLU, the Llama family's MLP activation, over one gate|up GEMM output:
// row n of gu (N, 2F) holds gate (F) then up (F); out (N, F) is
// silu(gate) * up, silu(g) = g / (1 + exp(-g)).
#ifndef PSTAR_KERNELS_SWIGLU_H_
#define PSTAR_KERNELS_SWIGLU_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_SWIGLU_H_

// The kernels' declarations stay outside the include guard (kernels/layernorm.h
// says why).

namespace pstar::kernels::cpu {

void SwiGluForward(float* out, const float* gu, int64_t N, int64_t F);
// 16-bit gu and out (bfloat16 when `bf16`, else IEEE half): widened, computed
// in fp32 and rounded once.
void SwiGluForward(uint16_t* out, const uint16_t* gu, bool bf16, int64_t N, int64_t F);
// dgu (N, 2F) = the gradients of gate and up (overwritten):
// dgate = dout * up * silu'(gate), dup = dout * silu(gate).
void SwiGluBackward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F);
void SwiGluBackward(float* dgu, const uint16_t* gu, bool bf16, const float* dout, int64_t N, int64_t F);

}  // namespace pstar::kernels::cpu
