// Device-side helpers for the kernels templated on the element type (include
// from .cu files only): loads and stores through fp32, and warp reductions.
// The butterfly reductions leave the same bits in every lane, and their order
// is fixed, so results do not vary from run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(fp16 x) { return __half2float(x); }

// Narrowing rounds to nearest, ties to even.
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ fp16 FromFloat<fp16>(float x) {
  return __float2half_rn(x);
}

constexpr int kWarpSize = 32;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

}  // namespace pstar::kernels::cuda
