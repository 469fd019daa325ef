// The public CPU kernels: each forwards to the instruction-set variant
// SelectedCpuIsa() names (kernels/cpu/isa.h). The variants' declarations are
// the public headers included once more per variant with `cpu` renamed, the
// way the build compiles the variants' objects; a signature that drifts from
// its header fails the link.
#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/cpu/isa.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#if !defined(PSTAR_CPU_VARIANT_native) && !defined(PSTAR_CPU_VARIANT_baseline) && !defined(PSTAR_CPU_VARIANT_x86_64)
#error "no CPU kernel variant: the build defines PSTAR_CPU_VARIANT_<name> for each one it compiles"
#endif

#define PSTAR_DECLARE_CPU_VARIANT "kernels/cpu/declare_variant.inc"

#ifdef PSTAR_CPU_VARIANT_native
#define cpu cpu_native
#include PSTAR_DECLARE_CPU_VARIANT
#undef cpu
#define PSTAR_CASE_native(call) \
  case CpuIsa::kNative:         \
    return cpu_native::call;
#else
#define PSTAR_CASE_native(call)
#endif

#ifdef PSTAR_CPU_VARIANT_baseline
#define cpu cpu_baseline
#include PSTAR_DECLARE_CPU_VARIANT
#undef cpu
#define PSTAR_CASE_baseline(call) \
  case CpuIsa::kBaseline:         \
    return cpu_baseline::call;
#else
#define PSTAR_CASE_baseline(call)
#endif

#ifdef PSTAR_CPU_VARIANT_x86_64
#define cpu cpu_x86_64
#include PSTAR_DECLARE_CPU_VARIANT
#undef cpu
#define PSTAR_CASE_x86_64(call) \
  case CpuIsa::kX86_64:         \
    return cpu_x86_64::call;
#else
#define PSTAR_CASE_x86_64(call)
#endif

#ifdef PSTAR_CPU_VARIANT_x86_64_v3
#define cpu cpu_x86_64_v3
#include PSTAR_DECLARE_CPU_VARIANT
#undef cpu
#define PSTAR_CASE_x86_64_v3(call) \
  case CpuIsa::kX86_64_V3:         \
    return cpu_x86_64_v3::call;
#else
#define PSTAR_CASE_x86_64_v3(call)
#endif

#ifdef PSTAR_CPU_VARIANT_x86_64_v4
#define cpu cpu_x86_64_v4
#include PSTAR_DECLARE_CPU_VARIANT
#undef cpu
#define PSTAR_CASE_x86_64_v4(call) \
  case CpuIsa::kX86_64_V4:         \
    return cpu_x86_64_v4::call;
#else
#define PSTAR_CASE_x86_64_v4(call)
#endif

// Calls `call` in the selected variant's namespace. Every variant the build
// has is a case; SelectedCpuIsa() only returns built ones.
// clang-format off
#define PSTAR_CPU_DISPATCH(call)  \
  switch (SelectedCpuIsa()) {     \
    PSTAR_CASE_native(call)       \
    PSTAR_CASE_baseline(call)     \
    PSTAR_CASE_x86_64(call)       \
    PSTAR_CASE_x86_64_v3(call)    \
    PSTAR_CASE_x86_64_v4(call)    \
    default:                      \
      __builtin_unreachable();    \
  }
// clang-format on

namespace pstar::kernels::cpu {

void AttentionForward(float* out, float* lse, const float* qkv, const AttentionShape& shape) {
  PSTAR_CPU_DISPATCH(AttentionForward(out, lse, qkv, shape));
}
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       const AttentionShape& shape) {
  PSTAR_CPU_DISPATCH(AttentionBackward(dqkv, dout, qkv, out, lse, shape));
}
void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, const AttentionShape& shape) {
  PSTAR_CPU_DISPATCH(AttentionForward(out, lse, qkv, bf16, shape));
}
void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, const AttentionShape& shape) {
  PSTAR_CPU_DISPATCH(AttentionBackward(dqkv, dout, qkv, out, bf16, lse, shape));
}
void AttentionForward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  PSTAR_CPU_DISPATCH(AttentionForward(out, lse, qkv, B, T, C, NH));
}
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                       int64_t T, int64_t C, int64_t NH) {
  PSTAR_CPU_DISPATCH(AttentionBackward(dqkv, dout, qkv, out, lse, B, T, C, NH));
}
void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  PSTAR_CPU_DISPATCH(AttentionForward(out, lse, qkv, bf16, B, T, C, NH));
}
void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  PSTAR_CPU_DISPATCH(AttentionBackward(dqkv, dout, qkv, out, bf16, lse, B, T, C, NH));
}
void CrossEntropy(float* losses, float* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp) {
  PSTAR_CPU_DISPATCH(CrossEntropy(losses, logits, targets, dloss, write_dlogits, N, V, Vp));
}
void CrossEntropy(float* losses, uint16_t* logits, bool bf16, const int32_t* targets, float dloss, bool write_dlogits,
                  int64_t N, int64_t V, int64_t Vp) {
  PSTAR_CPU_DISPATCH(CrossEntropy(losses, logits, bf16, targets, dloss, write_dlogits, N, V, Vp));
}
void EncoderForward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                    int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderForward(out, tokens, positions, wte, wpe, B, T, C));
}
void EncoderForward(uint16_t* out, const int32_t* tokens, const int32_t* positions, const uint16_t* wte,
                    const uint16_t* wpe, bool bf16, int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderForward(out, tokens, positions, wte, wpe, bf16, B, T, C));
}
void EncoderForward(uint16_t* out, bool bf16, const int32_t* tokens, const int32_t* positions, const float* wte,
                    const float* wpe, int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderForward(out, bf16, tokens, positions, wte, wpe, B, T, C));
}
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                     int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderBackward(dwte, dwpe, dout, tokens, positions, B, T, C));
}
void EncoderPartForward(float* out, const int32_t* tokens, const float* part, int64_t row0, int64_t rows, int64_t B,
                        int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderPartForward(out, tokens, part, row0, rows, B, T, C));
}
void EncoderPartForward(uint16_t* out, const int32_t* tokens, const uint16_t* part, bool bf16, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderPartForward(out, tokens, part, bf16, row0, rows, B, T, C));
}
void EncoderPartForward(uint16_t* out, bool bf16, const int32_t* tokens, const float* part, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderPartForward(out, bf16, tokens, part, row0, rows, B, T, C));
}
void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                         int64_t B, int64_t T, int64_t C) {
  PSTAR_CPU_DISPATCH(EncoderPartBackward(dpart, dout, tokens, row0, rows, B, T, C));
}
void GeluForward(float* out, const float* inp, int64_t n) { PSTAR_CPU_DISPATCH(GeluForward(out, inp, n)); }
void GeluForward(uint16_t* out, const uint16_t* inp, bool bf16, int64_t n) {
  PSTAR_CPU_DISPATCH(GeluForward(out, inp, bf16, n));
}
void GeluBackward(float* dinp, const uint16_t* inp, bool bf16, const float* dout, int64_t n) {
  PSTAR_CPU_DISPATCH(GeluBackward(dinp, inp, bf16, dout, n));
}
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  PSTAR_CPU_DISPATCH(GeluBackward(dinp, inp, dout, n));
}
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, float eps, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(RmsNormForward(out, rstd, inp, weight, eps, N, C));
}
void ResidualRmsNormForward(float* res, float* out, float* rstd, const float* a, const float* b, const float* weight,
                            float eps, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(ResidualRmsNormForward(res, out, rstd, a, b, weight, eps, N, C));
}
void RmsNormForward(uint16_t* out, float* rstd, const uint16_t* inp, bool bf16, const float* weight, float eps,
                    int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(RmsNormForward(out, rstd, inp, bf16, weight, eps, N, C));
}
void ResidualRmsNormForward(uint16_t* res, uint16_t* out, float* rstd, const uint16_t* a, const float* b, bool bf16,
                            const float* weight, float eps, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(ResidualRmsNormForward(res, out, rstd, a, b, bf16, weight, eps, N, C));
}
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     const float* rstd, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C));
}
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const uint16_t* inp, bool bf16,
                     const float* weight, const float* rstd, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(RmsNormBackward(dinp, dweight, dout, inp, bf16, weight, rstd, N, C));
}
void RopeForward(float* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                 int64_t N, int64_t heads, int64_t D) {
  PSTAR_CPU_DISPATCH(RopeForward(x, row_stride, cos, sin, positions, N, heads, D));
}
void RopeForward(uint16_t* x, bool bf16, int64_t row_stride, const float* cos, const float* sin,
                 const int32_t* positions, int64_t N, int64_t heads, int64_t D) {
  PSTAR_CPU_DISPATCH(RopeForward(x, bf16, row_stride, cos, sin, positions, N, heads, D));
}
void RopeBackward(float* dx, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                  int64_t N, int64_t heads, int64_t D) {
  PSTAR_CPU_DISPATCH(RopeBackward(dx, row_stride, cos, sin, positions, N, heads, D));
}
void SwiGluForward(float* out, const float* gu, int64_t N, int64_t F) { PSTAR_CPU_DISPATCH(SwiGluForward(out, gu, N, F)); }
void SwiGluForward(uint16_t* out, const uint16_t* gu, bool bf16, int64_t N, int64_t F) {
  PSTAR_CPU_DISPATCH(SwiGluForward(out, gu, bf16, N, F));
}
void SwiGluBackward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F) {
  PSTAR_CPU_DISPATCH(SwiGluBackward(dgu, gu, dout, N, F));
}
void SwiGluBackward(float* dgu, const uint16_t* gu, bool bf16, const float* dout, int64_t N, int64_t F) {
  PSTAR_CPU_DISPATCH(SwiGluBackward(dgu, gu, bf16, dout, N, F));
}
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(LayerNormForward(out, mean, rstd, inp, weight, bias, N, C));
}
void ResidualLayerNormForward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* weight, const float* bias, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(ResidualLayerNormForward(res, out, mean, rstd, a, b, weight, bias, N, C));
}
void LayerNormForward(uint16_t* out, float* mean, float* rstd, const uint16_t* inp, bool bf16, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(LayerNormForward(out, mean, rstd, inp, bf16, weight, bias, N, C));
}
void ResidualLayerNormForward(uint16_t* res, uint16_t* out, float* mean, float* rstd, const uint16_t* a, const float* b,
                              bool bf16, const float* weight, const float* bias, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(ResidualLayerNormForward(res, out, mean, rstd, a, b, bf16, weight, bias, N, C));
}
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp, bool bf16,
                       const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  PSTAR_CPU_DISPATCH(LayerNormBackward(dinp, dweight, dbias, dout, inp, bf16, weight, mean, rstd, N, C));
}
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C,
                   int64_t OC) {
  PSTAR_CPU_DISPATCH(MatmulForward(out, inp, weight, bias, N, C, OC));
}
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int64_t N, int64_t C, int64_t OC) {
  PSTAR_CPU_DISPATCH(MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC));
}
int64_t GemmTile(int64_t M, int64_t N) { PSTAR_CPU_DISPATCH(GemmTile(M, N)); }
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  PSTAR_CPU_DISPATCH(Gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}
double SumOfSquares(const float* x, int64_t n) { PSTAR_CPU_DISPATCH(SumOfSquares(x, n)); }
bool AllFinite(const float* x, int64_t n) { PSTAR_CPU_DISPATCH(AllFinite(x, n)); }
void ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  PSTAR_CPU_DISPATCH(ResidualForward(out, a, b, n));
}
void ResidualForward(uint16_t* out, const uint16_t* a, const float* b, bool bf16, int64_t n) {
  PSTAR_CPU_DISPATCH(ResidualForward(out, a, b, bf16, n));
}

}  // namespace pstar::kernels::cpu
