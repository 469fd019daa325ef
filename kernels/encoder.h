// Token + position embedding. Layout: wte (V, C), wpe (maxT, C), out (B, T, C).
#ifndef PSTAR_KERNELS_ENCODER_H_
#define PSTAR_KERNELS_ENCODER_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_ENCODER_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos,:], pos = positions[b*T+t] or,
// with null positions, t (packed examples restart their positions; each must
// be below wpe's rows); a null wpe is no position table (rotary models):
// out[b,t,:] = wte[tokens[b,t],:].
void EncoderForward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                    int64_t B, int64_t T, int64_t C);
// The residual stream of a 16-bit run: out in 16 bits (bfloat16 when
// `bf16`, else IEEE half), the fp32 sum rounded once (nearest even); the
// tables 16-bit in the same format (16-bit parameter chunks, each value
// widened exactly as it is read), or fp32.
void EncoderForward(uint16_t* out, const int32_t* tokens, const int32_t* positions, const uint16_t* wte,
                    const uint16_t* wpe, bool bf16, int64_t B, int64_t T, int64_t C);
void EncoderForward(uint16_t* out, bool bf16, const int32_t* tokens, const int32_t* positions, const float* wte,
                    const float* wpe, int64_t B, int64_t T, int64_t C);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[pos,:] += dout[b,t,:] (unless
// dwpe is null; pos as in EncoderForward). Deterministic: rows are summed in
// (b, t) order whatever the thread count.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                     int64_t B, int64_t T, int64_t C);

// One row part of a token table with no position table: `part` holds rows
// [row0, row0 + rows) of wte. Tokens in those rows get out[b,t,:] =
// part[tokens[b,t] - row0,:]; the others are left as they are, so the parts
// in turn write every token once, the bits of one EncoderForward over the
// whole table. The 16-bit forms as above.
void EncoderPartForward(float* out, const int32_t* tokens, const float* part, int64_t row0, int64_t rows, int64_t B,
                        int64_t T, int64_t C);
void EncoderPartForward(uint16_t* out, const int32_t* tokens, const uint16_t* part, bool bf16, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C);
void EncoderPartForward(uint16_t* out, bool bf16, const int32_t* tokens, const float* part, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C);
// dpart[tokens[b,t] - row0,:] += dout[b,t,:] for the tokens in the part's
// rows, summed in (b, t) order: the bits of EncoderBackward's rows.
void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                         int64_t B, int64_t T, int64_t C);

}  // namespace pstar::kernels::cpu
