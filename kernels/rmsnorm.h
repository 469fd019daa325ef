// RMSNorm over the last dimension, as Llama, Qwen2 and Mistral normalize:
// out = weight * x / sqrt(mean(x^2) + eps), no mean subtracted and no bias.
// inp/out (N, C); rstd (N), kept for the backward pass.
#ifndef PSTAR_KERNELS_RMSNORM_H_
#define PSTAR_KERNELS_RMSNORM_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_RMSNORM_H_

// The kernels' declarations stay outside the include guard, as LayerNorm's
// do (kernels/layernorm.h).

namespace pstar::kernels::cpu {

// Each row's mean square is summed in double; the row is scaled in fp32 and
// then times its weight, in that order (the Hugging Face models' rounding).
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, float eps, int64_t N, int64_t C);
// The residual add and the RMSNorm after it in one pass over each row:
// res = a + b, then RmsNormForward(out, rstd, res, ...). The same bits as the
// two kernels one after the other.
void ResidualRmsNormForward(float* res, float* out, float* rstd, const float* a, const float* b, const float* weight,
                            float eps, int64_t N, int64_t C);
// 16-bit activations (bfloat16 when `bf16`, else IEEE half): inp, res, a and
// out are 16-bit, b (a projection's fp32 output) is fp32; each row widened
// exactly, computed in fp32 as above and rounded once on the store.
void RmsNormForward(uint16_t* out, float* rstd, const uint16_t* inp, bool bf16, const float* weight, float eps,
                    int64_t N, int64_t C);
void ResidualRmsNormForward(uint16_t* res, uint16_t* out, float* rstd, const uint16_t* a, const float* b, bool bf16,
                            const float* weight, float eps, int64_t N, int64_t C);
// dinp += ..., dweight += ... (accumulating; the weight's gradient is summed
// over rows in row order whatever the thread count).
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     const float* rstd, int64_t N, int64_t C);
// The same over a 16-bit inp (widened exactly as it is read).
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const uint16_t* inp, bool bf16,
                     const float* weight, const float* rstd, int64_t N, int64_t C);

}  // namespace pstar::kernels::cpu
