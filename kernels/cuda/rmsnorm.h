// RMSNorm over the last dimension on the GPU, as kernels/rmsnorm.h:
// out = weight * (x * rstd), rstd = (mean(x^2) + eps)^-1/2. inp/out (N, C);
// rstd (N) fp32 whatever T. One warp per row; each row's mean square is
// summed in fp32 (the CPU kernel sums in double: the results agree to fp32
// rounding, not bit for bit).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm.h"

namespace pstar::kernels::cuda {

template <typename T>
void RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int64_t C,
                    cudaStream_t stream);

// res = a + b (rounded to T), then RmsNormForward(out, rstd, res, ...) of the
// rounded row, in one kernel. b may be fp32 where the rest is 16-bit (a
// projection's fp32 output added to a 16-bit run's residual stream).
template <typename T, typename B = T>
void ResidualRmsNormForward(T* res, T* out, float* rstd, const T* a, const B* b, const T* weight, float eps,
                            int64_t N, int64_t C, cudaStream_t stream);

// Elements of fp32 scratch RmsNormBackward needs for its partial sums.
int64_t RmsNormBackwardScratchElements(int64_t N, int64_t C);

// dinp += ..., dweight += ... (fp32, accumulating). Deterministic: the
// weight's sum is LayerNorm's row-group partials (kernels/cuda/norm_columns.cuh),
// no atomics. inp (I) and dout (D) may be 16-bit, read widened; with
// dinp_copy, dinp's new values rounded to D are written there in the same
// pass (the operand of the next linear layer's backward). `kernel` is
// LayerNorm's knob (KernelTuning::layernorm_backward_kernel): kVector reads
// 16 bytes at a time where LayerNormBackwardTakesVectors says so, in a
// summation order of its own.
template <typename I, typename D>
void RmsNormBackward(float* dinp, float* dweight, float* scratch, const D* dout, const I* inp, const float* weight,
                     const float* rstd, int64_t N, int64_t C, cudaStream_t stream, D* dinp_copy = nullptr,
                     LayerNormKernel kernel = LayerNormKernel::kScalar);

}  // namespace pstar::kernels::cuda
