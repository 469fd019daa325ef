// Element-wise ops on the GPU: GELU (tanh approximation, as kernels/gelu.h),
// the residual add, and conversions between fp32 and the 16-bit formats.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream);
// dinp = gelu'(inp) * dout (overwritten; dinp may alias dout). inp may be
// 16-bit (A) where the gradients are fp32 (T = float): a 16-bit run.
template <typename T, typename A = T>
void GeluBackward(T* dinp, const A* inp, const T* dout, int64_t n, cudaStream_t stream);

// out = a + b (out may alias a or b). b may be fp32 where out and a are
// 16-bit (a 16-bit run's residual stream plus an fp32 projection).
template <typename T, typename B = T>
void ResidualForward(T* out, const T* a, const B* b, int64_t n, cudaStream_t stream);

// out[i] = in[i] converted; narrowing rounds to nearest even, giving the same
// bits as kernels/half.h. Instantiated for every pair of float, bf16, fp16.
template <typename To, typename From>
void Convert(To* out, const From* in, int64_t n, cudaStream_t stream);

// x[i] = float(T(x[i])), in place: rounded to T's precision (nearest even,
// the bits of kernels/half.h). T is bf16 or fp16.
template <typename T>
void RoundThrough(float* x, int64_t n, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
