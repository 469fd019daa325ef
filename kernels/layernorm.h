// LayerNorm over the last dimension (eps 1e-5). inp/out (N, C); mean/rstd (N).
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C);
// The residual add and the LayerNorm after it in one pass over each row:
// res = a + b, then LayerNormForward(out, mean, rstd, res, ...). The same bits
// as the two kernels one after the other, one read of res fewer.
void ResidualLayerNormForward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* weight, const float* bias, int64_t N, int64_t C);
// The same two with `out` narrowed to 16 bits (bfloat16 when `bf16`, else
// IEEE half, nearest even): exactly the fp32 kernels' out rounded. A 16-bit
// run keeps the normalized rows so, as the next linear layer's operand.
void LayerNormForward(uint16_t* out, bool bf16, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C);
void ResidualLayerNormForward(float* res, uint16_t* out, bool bf16, float* mean, float* rstd, const float* a,
                              const float* b, const float* weight, const float* bias, int64_t N, int64_t C);
// dinp += ..., dweight += ..., dbias += ... (accumulating, deterministic order).
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int64_t N, int64_t C);

}  // namespace pstar::kernels::cpu
