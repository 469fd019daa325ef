// LayerNorm over the last dimension on the GPU (eps kLayerNormEps), as
// kernels/layernorm.h: inp/out (N, C); mean/rstd (N) are fp32 whatever T.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/layernorm.h"

namespace pstar::kernels::cuda {

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C, cudaStream_t stream);

// res = a + b, then LayerNormForward(out, ..., res, ...), in one kernel (one
// warp per row), as kernels/layernorm.h's ResidualLayerNormForward. b may be
// fp32 where the rest is 16-bit (B = float: a projection's fp32 output added
// to a 16-bit run's residual stream).
template <typename T, typename B = T>
void ResidualLayerNormForward(T* res, T* out, float* mean, float* rstd, const T* a, const B* b, const T* weight,
                              const T* bias, int64_t N, int64_t C, cudaStream_t stream);

// Elements of fp32 scratch LayerNormBackward needs for its partial sums.
int64_t LayerNormBackwardScratchElements(int64_t N, int64_t C);

// dinp += ..., dweight += ..., dbias += ... (accumulating). Deterministic: the
// weight and bias sums are fixed-order partials, no atomics. inp may be
// 16-bit where the rest is fp32 (I = bf16 or fp16 for T = float: a 16-bit
// run's residual stream, fp32 gradients), and so may dout (D: a 16-bit run's
// activation gradients), read widened. With dinp_copy, dinp's new values
// rounded to D are written there as well, in the same pass (the 16-bit
// operand of the next linear layer's backward).
//
// The per-row kernel (KernelTuning::layernorm_backward_kernel): kScalar
// reads one element per lane at a time; kVector 16 bytes at a time, where C
// is a multiple of 8 and every pointer 16-byte aligned (elsewhere kScalar
// runs). Each sums in a fixed order of its own.
enum class LayerNormKernel { kScalar = 0, kVector = 1 };

// Whether kVector takes these buffers (C, and the pointers' alignment).
bool LayerNormBackwardTakesVectors(const void* dinp, const void* dinp_copy, const void* dout, const void* inp,
                                   const void* weight, int64_t C);

template <typename T, typename I = T, typename D = T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, float* scratch, const D* dout, const I* inp, const T* weight,
                       const float* mean, const float* rstd, int64_t N, int64_t C, cudaStream_t stream,
                       D* dinp_copy = nullptr, LayerNormKernel kernel = LayerNormKernel::kScalar);

}  // namespace pstar::kernels::cuda
