// Token + position embedding. Layout: wte (V, C), wpe (maxT, C), out (B, T, C).
#ifndef PSTAR_KERNELS_ENCODER_H_
#define PSTAR_KERNELS_ENCODER_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_ENCODER_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; a null wpe is no position
// table (rotary models): out[b,t,:] = wte[tokens[b,t],:].
void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                    int64_t B, int64_t T, int64_t C);
// The residual stream of a 16-bit run: out in 16 bits (bfloat16 when
// `bf16`, else IEEE half), the fp32 sum rounded once (nearest even); the
// tables 16-bit in the same format (16-bit parameter chunks, each value
// widened exactly as it is read), or fp32.
void EncoderForward(uint16_t* out, const int32_t* tokens, const uint16_t* wte, const uint16_t* wpe, bool bf16,
                    int64_t B, int64_t T, int64_t C);
void EncoderForward(uint16_t* out, bool bf16, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                    int64_t T, int64_t C);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (unless
// dwpe is null). Deterministic:
// rows are summed in (b, t) order whatever the thread count.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                     int64_t B, int64_t T, int64_t C);

}  // namespace pstar::kernels::cpu
