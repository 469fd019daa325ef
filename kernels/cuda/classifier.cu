#include "kernels/cuda/classifier.h"

#include <cstdint>
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

// The block's running sums combined in a fixed order (each warp's, then
// warp 0 over the warps): the row's log-sum-exp, returned to every thread
// after one barrier, so the target's logit is read (into *loss, the
// log-sum-exp less it, where loss is not null) before any thread writes.
template <typename T>
__device__ float RowLogSumExp(MaxSum acc, float* loss, const T* x, int64_t target) {
  __shared__ MaxSum warp_parts[kMaxWarps];
  __shared__ float row_lse;
  const unsigned warps = blockDim.x / kWarpSize;
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
      if (loss != nullptr) *loss = target < 0 ? 0.0f : l - ToFloat(x[target]);
    }
  }
  __syncthreads();
  return row_lse;
}

// One block per row: each thread folds its strided share of the row into a
// running max and sum, then warps and the block combine them in a fixed
// order; the loss is the log-sum-exp less the target's logit (read before
// any thread writes), and with `write` every thread then turns its share of
// the row into the gradient.
template <typename T>
__global__ void CrossEntropyScalarRows(float* losses, T* logits, const int32_t* targets, float dloss, bool write,
                                       int64_t V, int64_t Vp) {
  const unsigned threads = blockDim.x;
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
  const float l = RowLogSumExp(acc, losses != nullptr ? losses + row : nullptr, x, target);
  if (!write) return;
  for (int64_t j = threadIdx.x; j < Vp; j += threads) {
    float g = 0.0f;
    if (j < V && target >= 0) g = expf(ToFloat(x[j]) - l) * dloss;
    if (j == target) g -= dloss;
    x[j] = FromFloat<T>(g);
  }
}

// The same loss and gradient with 16-byte loads and stores: each thread
// takes whole vectors of kVec logits (the row is 16-byte aligned, and Vp a
// multiple of kVec), folds a vector's maximum into its running max once,
// then adds the vector's exponentials. Eight times the bytes in flight per
// thread of CrossEntropyScalarRows, for a pass that is bound by memory.
template <typename T>
__global__ void CrossEntropyVectorRows(float* losses, T* logits, const int32_t* targets, float dloss, bool write,
                                       int64_t V, int64_t Vp) {
  constexpr int kVec = 16 / sizeof(T);
  const unsigned threads = blockDim.x;
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  uint4* xv = reinterpret_cast<uint4*>(x);
  const int64_t target = targets[row];
  const int64_t vectors = (V + kVec - 1) / kVec;  // those holding the V logits (the last may end in padding)
  MaxSum acc = {-INFINITY, 0.0f};
  for (int64_t v = threadIdx.x; v < vectors; v += threads) {
    const uint4 raw = xv[v];
    const T* e = reinterpret_cast<const T*>(&raw);
    float f[kVec];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      f[i] = v * kVec + i < V ? ToFloat(e[i]) : -INFINITY;
      m = fmaxf(m, f[i]);
    }
    if (m > acc.max) {
      acc.sum *= expf(acc.max - m);  // 0 while nothing was seen (exp(-inf))
      acc.max = m;
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (f[i] != -INFINITY) acc.sum += expf(f[i] - acc.max);  // a NaN logit makes the sum NaN
    }
  }
  const float l = RowLogSumExp(acc, losses != nullptr ? losses + row : nullptr, x, target);
  if (!write) return;
  for (int64_t v = threadIdx.x; v < Vp / kVec; v += threads) {
    uint4 raw = xv[v];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t j = v * kVec + i;
      float g = 0.0f;
      if (j < V && target >= 0) g = expf(ToFloat(e[i]) - l) * dloss;
      if (j == target) g -= dloss;
      e[i] = FromFloat<T>(g);
    }
    xv[v] = raw;
  }
}

}  // namespace

bool CrossEntropyTakesVectors(const void* logits, int64_t Vp, size_t element_bytes) {
  return reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (Vp * int64_t(element_bytes)) % 16 == 0;
}

template <typename T>
void CrossEntropy(float* losses, T* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp, cudaStream_t stream, int threads, CrossEntropyKernel kernel) {
  if (N <= 0) return;
  if (threads < int(kWarpSize) || threads > 1024 || threads % int(kWarpSize) != 0) {
    std::fprintf(stderr, "pstar: CrossEntropy with %d threads per block (a multiple of 32 up to 1024)\n", threads);
    std::abort();
  }
  if (kernel == CrossEntropyKernel::kVector && CrossEntropyTakesVectors(logits, Vp, sizeof(T))) {
    CrossEntropyVectorRows<<<unsigned(N), unsigned(threads), 0, stream>>>(losses, logits, targets, dloss, write_dlogits,
                                                                          V, Vp);
  } else {
    CrossEntropyScalarRows<<<unsigned(N), unsigned(threads), 0, stream>>>(losses, logits, targets, dloss, write_dlogits,
                                                                          V, Vp);
  }
  CheckLaunch("CrossEntropy");
}

#define PSTAR_INSTANTIATE_CLASSIFIER(T)                                                                                \
  template void CrossEntropy<T>(float*, T*, const int32_t*, float, bool, int64_t, int64_t, int64_t, cudaStream_t, int, \
                                CrossEntropyKernel);

PSTAR_INSTANTIATE_CLASSIFIER(float)
PSTAR_INSTANTIATE_CLASSIFIER(bf16)
PSTAR_INSTANTIATE_CLASSIFIER(fp16)

#undef PSTAR_INSTANTIATE_CLASSIFIER

}  // namespace pstar::kernels::cuda
