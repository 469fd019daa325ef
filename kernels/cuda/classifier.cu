#include "kernels/cuda/classifier.h"

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kMaxWarps = 1024 / kWarpSize;  // blocks of up to 1024 threads (KernelTuning)

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
// running max and sum, then warps and the block combine them in a fixed
// order; the loss is the log-sum-exp less the target's logit (read before
// any thread writes), and with `write` every thread then turns its share of
// the row into the gradient.
template <typename T>
__global__ void CrossEntropyKernel(float* losses, T* logits, const int32_t* targets, float dloss, bool write,
                                   int64_t V, int64_t Vp) {
  __shared__ MaxSum warp_parts[kMaxWarps];
  __shared__ float row_lse;
  const unsigned threads = blockDim.x, warps = threads / kWarpSize;
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int64_t target = targets[row];
  MaxSum acc = {-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < V; j += threads) {
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
  if (warp == 0) {
    acc = lane < warps ? warp_parts[lane] : MaxSum{-INFINITY, 0.0f};
    acc = WarpCombine(acc);
    if (lane == 0) {
      const float l = acc.max + logf(acc.sum);
      row_lse = l;
      if (losses != nullptr) losses[row] = l - ToFloat(x[target]);
    }
  }
  if (!write) return;
  __syncthreads();  // the lse is known and the target's logit read
  const float l = row_lse;
  for (int64_t j = threadIdx.x; j < Vp; j += threads) {
    float g = 0.0f;
    if (j < V) g = expf(ToFloat(x[j]) - l) * dloss;
    if (j == target) g -= dloss;
    x[j] = FromFloat<T>(g);
  }
}

}  // namespace

template <typename T>
void CrossEntropy(float* losses, T* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp, cudaStream_t stream, int threads) {
  if (N <= 0) return;
  if (threads < int(kWarpSize) || threads > 1024 || threads % int(kWarpSize) != 0) {
    std::fprintf(stderr, "pstar: CrossEntropy with %d threads per block (a multiple of 32 up to 1024)\n", threads);
    std::abort();
  }
  CrossEntropyKernel<<<unsigned(N), unsigned(threads), 0, stream>>>(losses, logits, targets, dloss, write_dlogits, V,
                                                                   Vp);
  CheckLaunch("CrossEntropy");
}

#define PSTAR_INSTANTIATE_CLASSIFIER(T)                                                                           \
  template void CrossEntropy<T>(float*, T*, const int32_t*, float, bool, int64_t, int64_t, int64_t, cudaStream_t, int);

PSTAR_INSTANTIATE_CLASSIFIER(float)
PSTAR_INSTANTIATE_CLASSIFIER(bf16)
PSTAR_INSTANTIATE_CLASSIFIER(fp16)

#undef PSTAR_INSTANTIATE_CLASSIFIER

}  // namespace pstar::kernels::cuda
