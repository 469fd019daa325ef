// RoPE: the kernel of kernels/cuda/rope.cuh in both directions.
#include "kernels/cuda/rope.h"

#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

#include "kernels/cuda/rope.cuh"

template <typename T>
void Rotate(T* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
            int64_t heads, int64_t D, float sign, cudaStream_t stream, const char* what) {
  const int64_t pairs = N * heads * (D / 2);
  if (pairs <= 0) return;
  RopeRotateKernel<<<BlocksFor(pairs, kRopeThreads), kRopeThreads, 0, stream>>>(x, row_stride, cos, sin, positions,
                                                                                N, heads, D / 2, sign);
  CheckLaunch(what);
}

}  // namespace

template <typename T>
void RopeForward(T* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
                 int64_t heads, int64_t D, cudaStream_t stream) {
  Rotate(x, row_stride, cos, sin, positions, N, heads, D, 1.0f, stream, "RopeForward");
}

template <typename T>
void RopeBackward(T* dx, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
                  int64_t heads, int64_t D, cudaStream_t stream) {
  Rotate(dx, row_stride, cos, sin, positions, N, heads, D, -1.0f, stream, "RopeBackward");
}

#define PSTAR_ROPE(T)                                                                                             \
  template void RopeForward<T>(T*, int64_t, const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, \
                               cudaStream_t);                                                                     \
  template void RopeBackward<T>(T*, int64_t, const float*, const float*, const int32_t*, int64_t, int64_t,         \
                                int64_t, cudaStream_t);
PSTAR_ROPE(float)
PSTAR_ROPE(bf16)
PSTAR_ROPE(fp16)
#undef PSTAR_ROPE

}  // namespace pstar::kernels::cuda
