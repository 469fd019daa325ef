// LayerNorm over the last dimension (eps 1e-5). inp/out (N, C); mean/rstd (N).
#ifndef PSTAR_KERNELS_LAYERNORM_H_
#define PSTAR_KERNELS_LAYERNORM_H_
#include <cstdint>

namespace pstar::kernels::cpu {
inline constexpr float kLayerNormEps = 1e-5f;
}  // namespace pstar::kernels::cpu
#endif  // PSTAR_KERNELS_LAYERNORM_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C);
// The residual add and the LayerNorm after it in one pass over each row:
// res = a + b, then LayerNormForward(out, mean, rstd, res, ...). The same bits
// as the two kernels one after the other, one read of res fewer.
void ResidualLayerNormForward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* weight, const float* bias, int64_t N, int64_t C);
// The 16-bit activations of a bf16/fp16 run (bfloat16 when `bf16`, else
// IEEE half): inp, res, a and out are 16-bit, b (a projection's fp32 output)
// is fp32. Each row is widened exactly, computed as above in fp32 and
// rounded once on the store (nearest even): res = round(a + b), and out is
// the fp32 kernel's output over the widened input (or res), rounded.
void LayerNormForward(uint16_t* out, float* mean, float* rstd, const uint16_t* inp, bool bf16, const float* weight,
                      const float* bias, int64_t N, int64_t C);
void ResidualLayerNormForward(uint16_t* res, uint16_t* out, float* mean, float* rstd, const uint16_t* a,
                              const float* b, bool bf16, const float* weight, const float* bias, int64_t N, int64_t C);
// dinp += ..., dweight += ..., dbias += ... (accumulating, deterministic order).
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int64_t N, int64_t C);
// The same over a 16-bit inp (widened exactly as it is read): the fp32
// kernel's bits over the widened input.
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp, bool bf16,
                       const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);

}  // namespace pstar::kernels::cpu
