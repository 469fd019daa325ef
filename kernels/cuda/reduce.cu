// Deterministic reductions in two kernels: a fixed grid of kPartials blocks,
// each thread summing a grid-strided share of x in double and each block
// combining its threads in a fixed tree, writes one partial per block; then
// one block adds the partials in a fixed order. Which thread sees which
// element depends only on n, never on the device, so the bits never vary.
#include "kernels/cuda/reduce.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / kWarpSize;
constexpr unsigned kPartials = 512;  // blocks of the first pass: enough to fill a large GPU

__device__ __forceinline__ double WarpSumDouble(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block, in thread 0 (other threads get garbage). All
// kThreads threads must call it.
__device__ double BlockSumDouble(double v) {
  __shared__ double warp_sums[kWarps];
  v = WarpSumDouble(v);
  const unsigned warp = threadIdx.x / kWarpSize;
  const unsigned lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < kWarps; ++w) total += warp_sums[w];
  }
  return total;
}

struct Square {
  __device__ double operator()(float x) const { return double(x) * double(x); }
};

struct Plain {
  __device__ double operator()(float x) const { return double(x); }
};

// partials[blockIdx.x] = sum of f(x[i]) over the block's grid-strided share.
// Launched with exactly kPartials blocks of kThreads.
template <typename T, typename F>
__global__ void __launch_bounds__(kThreads) PartialSumKernel(double* partials, const T* x, int64_t n, F f) {
  const int64_t stride = int64_t(kPartials) * kThreads;
  double acc = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) acc += f(ToFloat(x[i]));
  const double total = BlockSumDouble(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// The kPartials partials, summed by one block of kThreads: thread t adds
// partials t, t + kThreads, ... in order, then the block tree.
__device__ double SumPartials(const double* partials) {
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < kPartials; i += kThreads) acc += partials[i];
  return BlockSumDouble(acc);
}

__global__ void __launch_bounds__(kThreads) AccumulateKernel(double* out, const double* partials) {
  const double total = SumPartials(partials);
  if (threadIdx.x == 0) *out += total;
}

// PartialSumKernel of squares for span blockIdx.y: its kPartials partials at
// partials + blockIdx.y * kPartials. A block past the span's end sums
// nothing: its partial is +0.0 either way, written without the tree.
__global__ void __launch_bounds__(kThreads) MultiPartialSquaresKernel(double* partials, const DeviceSpan* spans) {
  const DeviceSpan span = spans[blockIdx.y];
  double* out = partials + int64_t(blockIdx.y) * kPartials + blockIdx.x;
  const int64_t first = int64_t(blockIdx.x) * kThreads;
  if (first >= span.n) {
    if (threadIdx.x == 0) *out = 0.0;
    return;
  }
  const int64_t stride = int64_t(kPartials) * kThreads;
  double acc = 0.0;
  for (int64_t i = first + threadIdx.x; i < span.n; i += stride) acc += Square{}(span.data[i]);
  const double total = BlockSumDouble(acc);
  if (threadIdx.x == 0) *out = total;
}

// AccumulateKernel for span blockIdx.x.
__global__ void __launch_bounds__(kThreads) MultiAccumulateKernel(double* out, const double* partials) {
  const double total = SumPartials(partials + int64_t(blockIdx.x) * kPartials);
  if (threadIdx.x == 0) out[blockIdx.x] += total;
}

// Any thread that sees a non-finite value stores 1; concurrent stores of the
// same value need no atomics. Widening keeps inf and NaN, so the test is on
// the fp32 value.
template <typename T>
__global__ void FlagNonFiniteKernel(int32_t* flag, const T* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = ToFloat(x[i]);
    bad |= !isfinite(v);
  }
  if (bad) *flag = 1;
}

}  // namespace

int64_t ReduceScratchElements() { return kPartials; }

template <typename T>
void SumOfSquares(double* out, double* scratch, const T* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;  // adds zero
  PartialSumKernel<<<kPartials, kThreads, 0, stream>>>(scratch, x, n, Square{});
  CheckLaunch("SumOfSquares (partials)");
  AccumulateKernel<<<1, kThreads, 0, stream>>>(out, scratch);
  CheckLaunch("SumOfSquares (total)");
}

int64_t SumsOfSquaresScratchElements(int64_t count) { return count * kPartials; }

void SumsOfSquares(double* out, double* scratch, const DeviceSpan* spans, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  if (count > kMaxSumSpans) {
    std::fprintf(stderr, "pstar: SumsOfSquares of %lld spans, more than %lld\n", static_cast<long long>(count),
                 static_cast<long long>(kMaxSumSpans));
    std::abort();
  }
  MultiPartialSquaresKernel<<<dim3(kPartials, unsigned(count)), kThreads, 0, stream>>>(scratch, spans);
  CheckLaunch("SumsOfSquares (partials)");
  MultiAccumulateKernel<<<unsigned(count), kThreads, 0, stream>>>(out, scratch);
  CheckLaunch("SumsOfSquares (totals)");
}

template <typename T>
void FlagNonFinite(int32_t* flag, const T* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  // A bounded, grid-strided grid: each thread checks many elements and
  // stores at most once.
  constexpr unsigned kMaxBlocks = 1024;
  const unsigned blocks = BlocksFor(n, kThreads) < kMaxBlocks ? BlocksFor(n, kThreads) : kMaxBlocks;
  FlagNonFiniteKernel<<<blocks, kThreads, 0, stream>>>(flag, x, n);
  CheckLaunch("FlagNonFinite");
}

void Sum(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;  // adds zero
  PartialSumKernel<<<kPartials, kThreads, 0, stream>>>(scratch, x, n, Plain{});
  CheckLaunch("Sum (partials)");
  AccumulateKernel<<<1, kThreads, 0, stream>>>(out, scratch);
  CheckLaunch("Sum (total)");
}

#define PSTAR_REDUCE(T)                                                               \
  template void SumOfSquares<T>(double*, double*, const T*, int64_t, cudaStream_t);  \
  template void FlagNonFinite<T>(int32_t*, const T*, int64_t, cudaStream_t);
PSTAR_REDUCE(float)
PSTAR_REDUCE(bf16)
PSTAR_REDUCE(fp16)
#undef PSTAR_REDUCE

}  // namespace pstar::kernels::cuda
