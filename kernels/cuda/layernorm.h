// LayerNorm over the last dimension on the GPU (eps kLayerNormEps), as
// kernels/layernorm.h: inp/out (N, C); mean/rstd (N) are fp32 whatever T.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/layernorm.h"

namespace pstar::kernels::cuda {

// out is of type O: T, or bf16/fp16 for a float T (a 16-bit run keeps the
// normalized rows, the next linear layer's operand, in 16 bits).
template <typename T, typename O = T>
void LayerNormForward(O* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C, cudaStream_t stream);

// res = a + b, then LayerNormForward(out, ..., res, ...), in one kernel (one
// warp per row), as kernels/layernorm.h's ResidualLayerNormForward.
template <typename T, typename O = T>
void ResidualLayerNormForward(T* res, O* out, float* mean, float* rstd, const T* a, const T* b, const T* weight,
                              const T* bias, int64_t N, int64_t C, cudaStream_t stream);

// Elements of fp32 scratch LayerNormBackward needs for its partial sums.
int64_t LayerNormBackwardScratchElements(int64_t N, int64_t C);

// dinp += ..., dweight += ..., dbias += ... (accumulating). Deterministic: the
// weight and bias sums are fixed-order partials, no atomics.
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp,
                       const T* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                       cudaStream_t stream);

}  // namespace pstar::kernels::cuda
