#include "kernels/cuda/classifier.h"

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 512;  // rows are vocabulary-long
constexpr unsigned kWarps = kThreads / kWarpSize;

// A running log-sum-exp: max and the sum of exp(x - max) over the values seen.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};  // both empty
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum WarpCombine(MaxSum v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const MaxSum other = {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    v = Combine(v, other);
  }
  return v;
}

// One block per row: each thread folds its strided share of the row into a
// running max and sum, then warps and the block combine them in a fixed order.
template <typename T>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                          int64_t V, int64_t Vp) {
  __shared__ MaxSum warp_parts[kWarps];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  MaxSum acc = {-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float xj = ToFloat(x[j]);
    if (xj > acc.max) {
      acc.sum = acc.sum * expf(acc.max - xj) + 1.0f;
      acc.max = xj;
    } else if (xj != -INFINITY) {  // exp(-inf) adds nothing; skip the inf - inf
      acc.sum += expf(xj - acc.max);
    }
  }
  acc = WarpCombine(acc);
  const unsigned warp = threadIdx.x / kWarpSize;
  const unsigned lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_parts[warp] = acc;
  __syncthreads();
  if (warp != 0) return;
  acc = lane < kWarps ? warp_parts[lane] : MaxSum{-INFINITY, 0.0f};
  acc = WarpCombine(acc);
  if (lane == 0) {
    const float l = acc.max + logf(acc.sum);
    lse[row] = l;
    losses[row] = l - ToFloat(x[targets[row]]);
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(T* logits, const float* lse, const int32_t* targets, float dloss,
                                           int64_t V, int64_t Vp) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const float l = lse[row];
  const int64_t target = targets[row];
  for (int64_t j = threadIdx.x; j < Vp; j += kThreads) {
    float g = 0.0f;
    if (j < V) g = expf(ToFloat(x[j]) - l) * dloss;
    if (j == target) g -= dloss;
    x[j] = FromFloat<T>(g);
  }
}

}  // namespace

template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                         int64_t Vp, cudaStream_t stream) {
  if (N <= 0) return;
  CrossEntropyForwardKernel<<<unsigned(N), kThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  CheckLaunch("CrossEntropyForward");
}

template <typename T>
void CrossEntropyBackwardInPlace(T* logits, const float* lse, const int32_t* targets, float dloss, int64_t N,
                                 int64_t V, int64_t Vp, cudaStream_t stream) {
  if (N <= 0) return;
  CrossEntropyBackwardKernel<<<unsigned(N), kThreads, 0, stream>>>(logits, lse, targets, dloss, V, Vp);
  CheckLaunch("CrossEntropyBackwardInPlace");
}

#define PSTAR_INSTANTIATE_CLASSIFIER(T)                                                                           \
  template void CrossEntropyForward<T>(float*, float*, const T*, const int32_t*, int64_t, int64_t, int64_t,    \
                                       cudaStream_t);                                                            \
  template void CrossEntropyBackwardInPlace<T>(T*, const float*, const int32_t*, float, int64_t, int64_t, int64_t, \
                                               cudaStream_t);

PSTAR_INSTANTIATE_CLASSIFIER(float)
PSTAR_INSTANTIATE_CLASSIFIER(bf16)
PSTAR_INSTANTIATE_CLASSIFIER(fp16)

#undef PSTAR_INSTANTIATE_CLASSIFIER

}  // namespace pstar::kernels::cuda
