// RMSNorm: the kernels of kernels/cuda/rmsnorm.cuh, and the weight gradient
// through the norms' deterministic column sums.
#include "kernels/cuda/rmsnorm.h"

#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

#include "kernels/cuda/norm_columns.cuh"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/rmsnorm.cuh"

constexpr unsigned kColumnThreads = 256;

unsigned RowBlocks(int64_t N) { return BlocksFor(N, kRmsNormRowsPerBlock); }

}  // namespace

template <typename T>
void RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int64_t C,
                    cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  RmsNormForwardKernel<T, T><<<RowBlocks(N), kRmsNormThreads, 0, stream>>>(nullptr, out, rstd, inp, nullptr, weight,
                                                                          eps, N, C);
  CheckLaunch("RmsNormForward");
}

template <typename T, typename B>
void ResidualRmsNormForward(T* res, T* out, float* rstd, const T* a, const B* b, const T* weight, float eps,
                            int64_t N, int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  RmsNormForwardKernel<T, B><<<RowBlocks(N), kRmsNormThreads, 0, stream>>>(res, out, rstd, a, b, weight, eps, N, C);
  CheckLaunch("ResidualRmsNormForward");
}

int64_t RmsNormBackwardScratchElements(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 0;
  return NormGroups(N) * C;
}

template <typename I, typename D>
void RmsNormBackward(float* dinp, float* dweight, float* scratch, const D* dout, const I* inp, const float* weight,
                     const float* rstd, int64_t N, int64_t C, cudaStream_t stream, D* dinp_copy,
                     LayerNormKernel kernel) {
  if (N <= 0 || C <= 0) return;
  if (kernel == LayerNormKernel::kVector && LayerNormBackwardTakesVectors(dinp, dinp_copy, dout, inp, weight, C)) {
    RmsNormBackwardRowsVectorKernel<<<RowBlocks(N), kRmsNormThreads, 0, stream>>>(dinp, dinp_copy, dout, inp, weight,
                                                                                 rstd, N, C);
  } else {
    RmsNormBackwardRowsKernel<<<RowBlocks(N), kRmsNormThreads, 0, stream>>>(dinp, dinp_copy, dout, inp, weight,
                                                                           rstd, N, C);
  }
  CheckLaunch("RmsNormBackward (dinp)");
  const int64_t groups = NormGroups(N);
  const dim3 grid(static_cast<unsigned>(groups), BlocksFor(C, kColumnThreads));
  NormColumnPartialsKernel<false><<<grid, kColumnThreads, 0, stream>>>(scratch, dout, inp,
                                                                       static_cast<const float*>(nullptr), rstd, N, C,
                                                                       NormGroupRows(N));
  CheckLaunch("RmsNormBackward (column partials)");
  NormColumnTotalsKernel<false, float><<<BlocksFor(C, kColumnThreads), kColumnThreads, 0, stream>>>(
      dweight, nullptr, scratch, groups, C);
  CheckLaunch("RmsNormBackward (column totals)");
}

#define PSTAR_RMSNORM(T)                                                                                            \
  template void RmsNormForward<T>(T*, float*, const T*, const T*, float, int64_t, int64_t, cudaStream_t);          \
  template void ResidualRmsNormForward<T, T>(T*, T*, float*, const T*, const T*, const T*, float, int64_t, int64_t, \
                                             cudaStream_t);                                                         \
  template void RmsNormBackward<T, float>(float*, float*, float*, const float*, const T*, const float*,             \
                                          const float*, int64_t, int64_t, cudaStream_t, float*, LayerNormKernel);
PSTAR_RMSNORM(float)
PSTAR_RMSNORM(bf16)
PSTAR_RMSNORM(fp16)
#undef PSTAR_RMSNORM

// A 16-bit run: the residual stream and the output 16-bit, the projection
// fp32; its gradients 16-bit beside the fp32 residual gradient.
#define PSTAR_RMSNORM_MIXED(H)                                                                                      \
  template void ResidualRmsNormForward<H, float>(H*, H*, float*, const H*, const float*, const H*, float, int64_t,  \
                                                 int64_t, cudaStream_t);                                            \
  template void RmsNormBackward<H, H>(float*, float*, float*, const H*, const H*, const float*, const float*,       \
                                      int64_t, int64_t, cudaStream_t, H*, LayerNormKernel);
PSTAR_RMSNORM_MIXED(bf16)
PSTAR_RMSNORM_MIXED(fp16)
#undef PSTAR_RMSNORM_MIXED

}  // namespace pstar::kernels::cuda
