// GELU, tanh approximation (GPT-2's "gelu_new", PyTorch approximate='tanh').
#ifndef PSTAR_KERNELS_GELU_H_
#define PSTAR_KERNELS_GELU_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_GELU_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

void GeluForward(float* out, const float* inp, int64_t n);
// The same two over a 16-bit run's activations: inp and out 16-bit
// (bfloat16 when `bf16`, else IEEE half), widened exactly; out rounded once
// (nearest even); dinp and dout fp32. Exactly the fp32 kernels over the
// widened inp. dinp may alias dout.
void GeluForward(uint16_t* out, const uint16_t* inp, bool bf16, int64_t n);
void GeluBackward(float* dinp, const uint16_t* inp, bool bf16, const float* dout, int64_t n);
// dinp = gelu'(inp) * dout (overwritten; dinp may alias dout).
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace pstar::kernels::cpu
