#include "kernels/cuda/attention.h"

#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/element.cuh"
#include "kernels/cuda/mma_primitives.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr int kBlock = int(kAttentionBlock);       // queries or keys per thread block
constexpr int kWarps = 16;                          // 512 threads
constexpr int kRowsPerWarp = kBlock / kWarps;       // rows of the block each warp owns
constexpr int kPerLane = int(kMaxGpuAttentionHeadSize) / kWarpSize;  // head columns per lane
constexpr unsigned kFull = 0xffffffffu;
static_assert(kBlock == 2 * kWarpSize, "a row's keys are two per lane");

// Shared tiles are rows of hs fp32 values, hs + 1 apart so that lanes walking
// different rows along the head dimension hit different banks.
__device__ __forceinline__ int Ld(int hs) { return hs + 1; }

// rows x hs elements of a head, rows ld_src apart in global memory, into a tile.
template <typename T>
__device__ void LoadTile(float* tile, const T* src, int64_t ld_src, int rows, int hs) {
  const int ld = Ld(hs);
  for (int e = int(threadIdx.x); e < kBlock * hs; e += int(blockDim.x)) {
    const int r = e / hs, d = e % hs;
    tile[r * ld + d] = r < rows ? ToFloat(src[int64_t(r) * ld_src + d]) : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}

// One (batch, head) per blockIdx.x, one query block per blockIdx.y (the
// longest rows first); each warp runs the online softmax of its rows over the
// key blocks up to the diagonal, two keys per lane.
template <typename T>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    FlashForward(T* out, float* lse, const T* qkv, int64_t Tlen, QkvRows L, int hs, float scale) {
  extern __shared__ float smem[];
  const int ld = Ld(hs);
  float* qs = smem;
  float* ks = qs + kBlock * ld;
  float* vs = ks + kBlock * ld;
  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t i = nb - 1 - int64_t(blockIdx.y);
  const int64_t r0 = i * kBlock, C3 = L.qkv;
  const int rows = int(min(int64_t(kBlock), Tlen - r0));
  const T* q = qkv + b * Tlen * C3 + h * hs;
  const T* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const T* values = keys + int64_t(L.NKV) * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTile(qs, q + r0 * C3, C3, rows, hs);

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[rr][c] = 0.0f;
  }
  for (int64_t j = 0; j <= i; ++j) {
    const int64_t c0 = j * kBlock;
    const int cols = int(min(int64_t(kBlock), Tlen - c0));
    __syncthreads();  // the previous key block is no longer read
    LoadTile(ks, keys + c0 * C3, C3, cols, hs);
    LoadTile(vs, values + c0 * C3, C3, cols, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      if (r >= rows) continue;  // the whole warp
      const int64_t t = r0 + r, first = FirstVisibleKey(L.positions, b, Tlen, t);
      float s[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + half * kWarpSize;
        s[half] = c < cols && c0 + c <= t && c0 + c >= first ? Dot(qs + r * ld, ks + c * ld, hs) * scale : -INFINITY;
      }
      const float mx = fmaxf(m[rr], WarpMax(fmaxf(s[0], s[1])));
      if (mx == -INFINITY) continue;  // no key of the query's example so far: nothing to add (the whole warp)
      const float p0 = expf(s[0] - mx), p1 = expf(s[1] - mx);
      const float alpha = expf(m[rr] - mx);
      l[rr] = l[rr] * alpha + WarpSum(p0 + p1);
      m[rr] = mx;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc[rr][c] *= alpha;
      for (int k = 0; k < cols; ++k) {
        const float pk = __shfl_sync(kFull, k < kWarpSize ? p0 : p1, k % kWarpSize);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          const int d = lane + c * kWarpSize;
          if (d < hs) acc[rr][c] += pk * vs[k * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    const int64_t t = r0 + r;
    const float inv = 1.0f / l[rr];
    T* o = out + (b * Tlen + t) * C + h * hs;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < hs) o[d] = FromFloat<T>(acc[rr][c] * inv);
    }
    if (lane == 0) lse[bh * Tlen + t] = m[rr] + logf(l[rr]);
  }
}

// The block's dynamic shared memory, for the tensor-core kernels.
__device__ __forceinline__ unsigned char* TensorCoreSharedMemory() {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  return tc_smem;
}

#include "kernels/cuda/attention_tensor_core.cuh"
#include "kernels/cuda/attention_mma.cuh"

// dsum (B, NH, T) = rowsum(dout * out) per head: one warp per (b, t, h).
template <typename T, typename A>
__global__ void RowDots(float* dsum, const T* dout, const A* out, int64_t rows, int64_t Tlen, int64_t C, int NH,
                        int hs) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp
  const int lane = int(threadIdx.x % kWarpSize);
  const int64_t bh = row / Tlen, t = row % Tlen, b = bh / NH, h = bh % NH;
  const int64_t at = (b * Tlen + t) * C + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) s += ToFloat(dout[at + d]) * ToFloat(out[at + d]);
  s = WarpSum(s);
  if (lane == 0) dsum[row] = s;
}

// dk and dv of one key block (blockIdx.y) of one (batch, head): each warp owns
// a few keys and walks the query blocks from the diagonal down, two queries
// per lane for the probabilities, then every query's term in order.
template <typename T, typename A>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    FlashBackwardKeys(T* dqkv, const T* dout, const A* qkv, const float* lse, const float* dsum, int64_t Tlen,
                      QkvRows L, int hs, float scale) {
  extern __shared__ float smem[];
  const int ld = Ld(hs);
  float* ks = smem;
  float* vs = ks + kBlock * ld;
  float* qs = vs + kBlock * ld;
  float* dys = qs + kBlock * ld;
  float* lse_s = dys + kBlock * ld;
  float* dsum_s = lse_s + kBlock;
  const int NH = L.NH, NKV = L.NKV, group = NH / NKV;
  const int64_t C = L.out, bk = blockIdx.x, b = bk / NKV, kv = bk % NKV;
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t j = int64_t(blockIdx.y);
  const int64_t c0 = j * kBlock, C3 = L.qkv;
  const int cols = int(min(int64_t(kBlock), Tlen - c0));
  const A* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const A* values = keys + int64_t(NKV) * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTile(ks, keys + c0 * C3, C3, cols, hs);
  LoadTile(vs, values + c0 * C3, C3, cols, hs);

  float dk[kRowsPerWarp][kPerLane], dv[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dk[rr][c] = dv[rr][c] = 0.0f;
  }
  // The group's query heads one after another, each over its query blocks:
  // one writer per dK and dV element, in a fixed order.
  for (int gq = 0; gq < group; ++gq) {
    const int64_t h = kv * group + gq, bh = b * NH + h;
    const A* q = qkv + b * Tlen * C3 + h * hs;
    const T* dy = dout + b * Tlen * C + h * hs;
    for (int64_t i = j; i < nb; ++i) {
      const int64_t r0 = i * kBlock;
      const int rows = int(min(int64_t(kBlock), Tlen - r0));
      __syncthreads();
      LoadTile(qs, q + r0 * C3, C3, rows, hs);
      LoadTile(dys, dy + r0 * C, C, rows, hs);
      for (int r = int(threadIdx.x); r < kBlock; r += int(blockDim.x)) {
        lse_s[r] = r < rows ? lse[bh * Tlen + r0 + r] : 0.0f;
        dsum_s[r] = r < rows ? dsum[bh * Tlen + r0 + r] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kRowsPerWarp; ++kk) {
        const int key = warp * kRowsPerWarp + kk;
        if (key >= cols) continue;  // the whole warp
        float p[2], ds[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = lane + half * kWarpSize;
          p[half] = ds[half] = 0.0f;
          if (r < rows && r0 + r >= c0 + key && c0 + key >= FirstVisibleKey(L.positions, b, Tlen, r0 + r)) {
            p[half] = expf(Dot(qs + r * ld, ks + key * ld, hs) * scale - lse_s[r]);
            const float dp = Dot(dys + r * ld, vs + key * ld, hs);
            ds[half] = p[half] * (dp - dsum_s[r]) * scale;
          }
        }
        for (int r = 0; r < rows; ++r) {
          const float pr = __shfl_sync(kFull, r < kWarpSize ? p[0] : p[1], r % kWarpSize);
          const float dsr = __shfl_sync(kFull, r < kWarpSize ? ds[0] : ds[1], r % kWarpSize);
#pragma unroll
          for (int c = 0; c < kPerLane; ++c) {
            const int d = lane + c * kWarpSize;
            if (d < hs) {
              dv[kk][c] += pr * dys[r * ld + d];
              dk[kk][c] += dsr * qs[r * ld + d];
            }
          }
        }
      }
    }
  }
  T* base = dqkv + b * Tlen * C3;
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk) {
    const int key = warp * kRowsPerWarp + kk;
    if (key >= cols) continue;
    T* dk_row = base + (NH + kv) * hs + (c0 + key) * C3;
    T* dv_row = base + (NH + NKV + kv) * hs + (c0 + key) * C3;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < hs) {
        dk_row[d] = FromFloat<T>(dk[kk][c]);
        dv_row[d] = FromFloat<T>(dv[kk][c]);
      }
    }
  }
}

// dq of one query block (blockIdx.y) of one (batch, head): each warp owns a
// few queries and walks the key blocks up to the diagonal, two keys per lane.
template <typename T, typename A>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    FlashBackwardQueries(T* dqkv, const T* dout, const A* qkv, const float* lse, const float* dsum, int64_t Tlen,
                         QkvRows L, int hs, float scale) {
  extern __shared__ float smem[];
  const int ld = Ld(hs);
  float* qs = smem;
  float* dys = qs + kBlock * ld;
  float* ks = dys + kBlock * ld;
  float* vs = ks + kBlock * ld;
  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t i = nb - 1 - int64_t(blockIdx.y);
  const int64_t r0 = i * kBlock, C3 = L.qkv;
  const int rows = int(min(int64_t(kBlock), Tlen - r0));
  const A* q = qkv + b * Tlen * C3 + h * hs;
  const A* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const A* values = keys + int64_t(L.NKV) * hs;
  const T* dy = dout + b * Tlen * C + h * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTile(qs, q + r0 * C3, C3, rows, hs);
  LoadTile(dys, dy + r0 * C, C, rows, hs);

  float dq[kRowsPerWarp][kPerLane], row_lse[kRowsPerWarp], row_dsum[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    row_lse[rr] = r < rows ? lse[bh * Tlen + r0 + r] : 0.0f;
    row_dsum[rr] = r < rows ? dsum[bh * Tlen + r0 + r] : 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dq[rr][c] = 0.0f;
  }
  for (int64_t j = 0; j <= i; ++j) {
    const int64_t c0 = j * kBlock;
    const int cols = int(min(int64_t(kBlock), Tlen - c0));
    __syncthreads();
    LoadTile(ks, keys + c0 * C3, C3, cols, hs);
    LoadTile(vs, values + c0 * C3, C3, cols, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      if (r >= rows) continue;  // the whole warp
      const int64_t t = r0 + r, first = FirstVisibleKey(L.positions, b, Tlen, t);
      float ds[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + half * kWarpSize;
        ds[half] = 0.0f;
        if (c < cols && c0 + c <= t && c0 + c >= first) {
          const float p = expf(Dot(qs + r * ld, ks + c * ld, hs) * scale - row_lse[rr]);
          const float dp = Dot(dys + r * ld, vs + c * ld, hs);
          ds[half] = p * (dp - row_dsum[rr]) * scale;
        }
      }
      for (int k = 0; k < cols; ++k) {
        const float dsk = __shfl_sync(kFull, k < kWarpSize ? ds[0] : ds[1], k % kWarpSize);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          const int d = lane + c * kWarpSize;
          if (d < hs) dq[rr][c] += dsk * ks[k * ld + d];
        }
      }
    }
  }
  T* base = dqkv + b * Tlen * C3 + h * hs;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    T* dq_row = base + (r0 + r) * C3;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < hs) dq_row[d] = FromFloat<T>(dq[rr][c]);
    }
  }
}

// Dynamic shared memory beyond the default 48 KiB must be allowed per kernel.
template <typename Kernel>
void AllowSharedBytes(Kernel kernel, size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "pstar: CUDA %s (%zu bytes) failed: %s\n", what, bytes, cudaGetErrorString(e));
  std::abort();
}

// The most dynamic shared memory a tensor-core block may ask for on the
// current device (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on sm_86/sm_89),
// or 0 below sm_80, where those kernels are compiled empty (a build for older
// architectures): they must not be launched there.
size_t TensorCoreSharedBytesLimit() {
  int device = 0, major = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess || major < 8) {
    return 0;
  }
  return size_t(bytes);
}

void CheckShape(const AttentionShape& s) {
  if (s.hs < 1 || s.hs > kMaxGpuAttentionHeadSize) {
    std::fprintf(stderr, "pstar: CUDA attention takes head sizes 1..%lld, not %lld\n",
                 static_cast<long long>(kMaxGpuAttentionHeadSize), static_cast<long long>(s.hs));
    std::abort();
  }
  if (s.NKV < 1 || s.NH % s.NKV != 0) {
    std::fprintf(stderr, "pstar: CUDA attention takes key/value heads that divide the %lld query heads, not %lld\n",
                 static_cast<long long>(s.NH), static_cast<long long>(s.NKV));
    std::abort();
  }
}

}  // namespace

int64_t AttentionScratchElements(const AttentionShape& s, AttentionBackwardKernel kernel) {
  return GpuAttentionScratchElements(s.B, s.T, s.NH * s.hs, s.NH,
                                     kernel == AttentionBackwardKernel::kMmaOnePass ||
                                         kernel == AttentionBackwardKernel::kMmaOnePassOccupancy);
}

bool AttentionOccupancyVariantsBuilt() {
#ifdef PSTAR_ATTENTION_OCCUPANCY_VARIANTS
  return true;
#else
  return false;
#endif
}

namespace {

// The mma.sync forward (attention_mma.cuh) where it applies: head size 64 or
// 128, qkv 16-byte aligned with C a multiple of 8 (its 16-byte copies), and
// room for its tiles (sm_80 or later). False where it does not. One block
// per (batch, head) and 16 kWarps queries.
template <typename T, int HS, bool kSharedQ = false, int kWarps = kMmaWarps>
bool LaunchMmaForward(T* out, float* lse, const T* qkv, const AttentionShape& shape, cudaStream_t stream) {
  constexpr size_t smem = MmaForwardSharedBytes<HS, kSharedQ, kWarps>();
  if (smem > TensorCoreSharedBytesLimit()) return false;
  const auto kernel = MmaFlashForward<T, HS, kSharedQ, kWarps>;
  AllowSharedBytes(kernel, smem, "MmaFlashForward shared memory");
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(HS));  // log2(e) / sqrt(hs)
  const dim3 grid(unsigned(shape.B * shape.NH), unsigned((shape.T + 16 * kWarps - 1) / (16 * kWarps)));
  kernel<<<grid, kWarps * kWarpSize, smem, stream>>>(out, lse, qkv, shape.T, RowsOf(shape), scale_log2);
  CheckLaunch("MmaFlashForward");
  return true;
}

template <typename T>
bool TryMmaForward(T* out, float* lse, const T* qkv, const AttentionShape& shape, AttentionForwardKernel kernel,
                   cudaStream_t stream) {
  const int64_t hs = shape.hs;
  if (shape.RowElements() % 8 != 0 || reinterpret_cast<uintptr_t>(qkv) % 16 != 0) return false;
  constexpr int kWide = 2 * kMmaWarps;
  if (hs == 64) {
    return kernel == AttentionForwardKernel::kMmaWide
               ? LaunchMmaForward<T, 64, false, kWide>(out, lse, qkv, shape, stream)
               : LaunchMmaForward<T, 64>(out, lse, qkv, shape, stream);
  }
  if (hs != 128) return false;
  switch (kernel) {
    case AttentionForwardKernel::kMmaSharedQ:
      return LaunchMmaForward<T, 128, true>(out, lse, qkv, shape, stream);
    case AttentionForwardKernel::kMmaWide:
      return LaunchMmaForward<T, 128, false, kWide>(out, lse, qkv, shape, stream);
    default:
      return LaunchMmaForward<T, 128>(out, lse, qkv, shape, stream);
  }
}

__global__ void ZeroCounts(int* counts, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) counts[i] = 0;
}

// The five-product pass: the counts zeroed, then one launch (of the
// kMinBlocks variant).
template <typename T, int HS, int kMinBlocks = 1>
bool LaunchMmaBackwardOnePass(T* dqkv, const T* dout, const T* qkv, const float* lse, float* scratch,
                              const AttentionShape& shape, cudaStream_t stream) {
  constexpr size_t smem = MmaBackwardKeysSharedBytes<HS, true>();
  if (smem > TensorCoreSharedBytesLimit()) return false;
  // The scratch's parts, as GpuAttentionScratchElements lays them out.
  auto aligned = [](int64_t elements) { return (elements + 3) / 4 * 4; };
  const int64_t B = shape.B, Tlen = shape.T, NH = shape.NH;
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const float* dsum = scratch;
  int* counts = reinterpret_cast<int*>(scratch + aligned(B * NH * Tlen));  // then the ticket counter
  float* dq_sum = scratch + aligned(B * NH * Tlen) + aligned(B * NH * nb + 1);
  const int64_t n_counts = B * NH * nb + 1;
  ZeroCounts<<<BlocksFor(n_counts, 256), 256, 0, stream>>>(counts, n_counts);
  CheckLaunch("ZeroCounts");
  const float scale = 1.0f / std::sqrt(float(HS));
  AllowSharedBytes(MmaFlashBackwardKeys<T, HS, true, kMinBlocks>, smem,
                   "MmaFlashBackwardKeys (one pass) shared memory");
  const dim3 grid(unsigned(B * shape.NKV), unsigned(nb));  // one (batch, key/value head) a block
  MmaFlashBackwardKeys<T, HS, true, kMinBlocks><<<grid, kMmaWarps * kWarpSize, smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, Tlen, RowsOf(shape), scale, dq_sum, counts);
  CheckLaunch("MmaFlashBackwardKeys (one pass)");
  return true;
}

// The mma.sync backward passes where they apply (as TryMmaForward, and dqkv
// and dout aligned too). One block per (batch, head) and 16 kWarps keys in
// the keys pass, as many queries in the queries pass.
template <typename T, int HS, int kMinBlocks = 1, int kWarps = kMmaWarps>
bool LaunchMmaBackward(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dsum,
                       const AttentionShape& shape, cudaStream_t stream) {
  constexpr size_t keys = MmaBackwardKeysSharedBytes<HS, false, kWarps>();
  constexpr size_t queries = MmaBackwardQueriesSharedBytes<HS, kWarps>();
  if (std::max(keys, queries) > TensorCoreSharedBytesLimit()) return false;
  const float scale = 1.0f / std::sqrt(float(HS));
  const unsigned blocks = unsigned((shape.T + 16 * kWarps - 1) / (16 * kWarps));
  const QkvRows rows = RowsOf(shape);
  const auto keys_pass = MmaFlashBackwardKeys<T, HS, false, kMinBlocks, kWarps>;
  AllowSharedBytes(keys_pass, keys, "MmaFlashBackwardKeys shared memory");
  keys_pass<<<dim3(unsigned(shape.B * shape.NKV), blocks), kWarps * kWarpSize, keys, stream>>>(
      dqkv, dout, qkv, lse, dsum, shape.T, rows, scale, nullptr, nullptr);
  CheckLaunch("MmaFlashBackwardKeys");
  const auto queries_pass = MmaFlashBackwardQueries<T, HS, kWarps>;
  AllowSharedBytes(queries_pass, queries, "MmaFlashBackwardQueries shared memory");
  queries_pass<<<dim3(unsigned(shape.B * shape.NH), blocks), kWarps * kWarpSize, queries, stream>>>(
      dqkv, dout, qkv, lse, dsum, shape.T, rows, scale);
  CheckLaunch("MmaFlashBackwardQueries");
  return true;
}

template <typename T>
bool TryMmaBackward(T* dqkv, const T* dout, const T* qkv, const float* lse, float* scratch,
                    const AttentionShape& shape, AttentionBackwardKernel kernel, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t hs = shape.hs;
  if (shape.RowElements() % 8 != 0 || (shape.NH * hs) % 8 != 0 || !aligned(qkv) || !aligned(dout) || !aligned(dqkv) || !aligned(scratch)) return false;
#ifdef PSTAR_ATTENTION_OCCUPANCY_VARIANTS
  if (kernel == AttentionBackwardKernel::kMmaOnePassOccupancy && hs == 64) {
    return LaunchMmaBackwardOnePass<T, 64, 3>(dqkv, dout, qkv, lse, scratch, shape, stream);
  }
  if (kernel == AttentionBackwardKernel::kMmaOccupancy && hs == 64) {
    return LaunchMmaBackward<T, 64, 3>(dqkv, dout, qkv, lse, scratch, shape, stream);
  }
#endif
  if (kernel == AttentionBackwardKernel::kMmaOnePass || kernel == AttentionBackwardKernel::kMmaOnePassOccupancy) {
    if (hs == 64) return LaunchMmaBackwardOnePass<T, 64>(dqkv, dout, qkv, lse, scratch, shape, stream);
    if (hs == 128) {
      return LaunchMmaBackwardOnePass<T, 128>(dqkv, dout, qkv, lse, scratch, shape, stream);
    }
    return false;
  }
  constexpr int kWide = 2 * kMmaWarps;
  const bool wide = kernel == AttentionBackwardKernel::kMmaWide;
  if (hs == 64) {
    return wide ? LaunchMmaBackward<T, 64, 1, kWide>(dqkv, dout, qkv, lse, scratch, shape, stream)
                : LaunchMmaBackward<T, 64>(dqkv, dout, qkv, lse, scratch, shape, stream);
  }
  if (hs == 128) {
    return wide ? LaunchMmaBackward<T, 128, 1, kWide>(dqkv, dout, qkv, lse, scratch, shape, stream)
                : LaunchMmaBackward<T, 128>(dqkv, dout, qkv, lse, scratch, shape, stream);
  }
  return false;
}

}  // namespace

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, const AttentionShape& shape, cudaStream_t stream,
                      AttentionForwardKernel kernel) {
  if (shape.B * shape.T * shape.NH * shape.hs == 0) return;
  CheckShape(shape);
  const int64_t hs = shape.hs, B = shape.B, Tlen = shape.T, NH = shape.NH;
  const QkvRows rows = RowsOf(shape);
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const dim3 grid(unsigned(B * NH), unsigned(nb));
  const float scale = 1.0f / std::sqrt(float(hs));
  if constexpr (!std::is_same_v<T, float>) {
    if (kernel != AttentionForwardKernel::kTensorCore &&
        TryMmaForward(out, lse, qkv, shape, kernel, stream)) {
      return;
    }
    const size_t smem = TensorCoreForwardSharedBytes(int(hs), sizeof(T));
    if (hs % kTcTile == 0 && smem <= TensorCoreSharedBytesLimit()) {
      AllowSharedBytes(TensorCoreFlashForward<T>, smem, "TensorCoreFlashForward shared memory");
      TensorCoreFlashForward<T><<<grid, kTcWarps * kWarpSize, smem, stream>>>(out, lse, qkv, Tlen, rows, int(hs),
                                                                              scale);
      CheckLaunch("TensorCoreFlashForward");
      return;
    }
  }
  const size_t smem = size_t(3 * kBlock * (hs + 1)) * sizeof(float);
  AllowSharedBytes(FlashForward<T>, smem, "FlashForward shared memory");
  FlashForward<T><<<grid, kWarps * kWarpSize, smem, stream>>>(out, lse, qkv, Tlen, rows, int(hs), scale);
  CheckLaunch("FlashForward");
}

template <typename T, typename A>
void AttentionBackward(T* dqkv, float* scratch, const T* dout, const A* qkv, const A* out, const float* lse,
                       const AttentionShape& shape, cudaStream_t stream, AttentionBackwardKernel kernel) {
  if (shape.B * shape.T * shape.NH * shape.hs == 0) return;
  CheckShape(shape);
  const int64_t hs = shape.hs, B = shape.B, Tlen = shape.T, NH = shape.NH, C = NH * hs;
  const QkvRows qkv_rows = RowsOf(shape);
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(float(hs));
  float* dsum = scratch;
  const int64_t rows = B * NH * Tlen;
  RowDots<T, A><<<BlocksFor(rows, kWarps), kWarps * kWarpSize, 0, stream>>>(dsum, dout, out, rows, Tlen, C, int(NH),
                                                                        int(hs));
  CheckLaunch("RowDots");
  // The keys passes take one (batch, key/value head) a block, the queries
  // passes one (batch, query head).
  const dim3 keys_grid(unsigned(B * shape.NKV), unsigned(nb)), queries_grid(unsigned(B * NH), unsigned(nb));
  if constexpr (std::is_same_v<T, A> && !std::is_same_v<A, float>) {
    if (kernel != AttentionBackwardKernel::kTensorCore &&
        TryMmaBackward(dqkv, dout, qkv, lse, scratch, shape, kernel, stream)) {
      return;
    }
  }
  if constexpr (!std::is_same_v<A, float>) {
    const size_t keys_tc = TensorCoreBackwardKeysSharedBytes(int(hs), sizeof(A));
    const size_t queries_tc = TensorCoreBackwardQueriesSharedBytes(int(hs), sizeof(A));
    if (hs % kTcTile == 0 && std::max(keys_tc, queries_tc) <= TensorCoreSharedBytesLimit()) {
      AllowSharedBytes(TensorCoreBackwardKeys<T, A>, keys_tc, "TensorCoreBackwardKeys shared memory");
      TensorCoreBackwardKeys<T, A><<<keys_grid, kTcWarps * kWarpSize, keys_tc, stream>>>(
          dqkv, dout, qkv, lse, dsum, Tlen, qkv_rows, int(hs), scale);
      CheckLaunch("TensorCoreBackwardKeys");
      AllowSharedBytes(TensorCoreBackwardQueries<T, A>, queries_tc, "TensorCoreBackwardQueries shared memory");
      TensorCoreBackwardQueries<T, A><<<queries_grid, kTcWarps * kWarpSize, queries_tc, stream>>>(
          dqkv, dout, qkv, lse, dsum, Tlen, qkv_rows, int(hs), scale);
      CheckLaunch("TensorCoreBackwardQueries");
      return;
    }
  }
  const size_t keys_smem = (size_t(4 * kBlock * (hs + 1)) + 2 * kBlock) * sizeof(float);
  AllowSharedBytes(FlashBackwardKeys<T, A>, keys_smem, "FlashBackwardKeys shared memory");
  FlashBackwardKeys<T, A><<<keys_grid, kWarps * kWarpSize, keys_smem, stream>>>(dqkv, dout, qkv, lse, dsum, Tlen,
                                                                             qkv_rows, int(hs), scale);
  CheckLaunch("FlashBackwardKeys");
  const size_t queries_smem = size_t(4 * kBlock * (hs + 1)) * sizeof(float);
  AllowSharedBytes(FlashBackwardQueries<T, A>, queries_smem, "FlashBackwardQueries shared memory");
  FlashBackwardQueries<T, A><<<queries_grid, kWarps * kWarpSize, queries_smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, Tlen, qkv_rows, int(hs), scale);
  CheckLaunch("FlashBackwardQueries");
}

namespace {

template <typename T>
__global__ void AddGroupedHeadsKernel(T* dst, int64_t row, const float* heads, int64_t B, int64_t H, int64_t Tlen,
                                      int64_t hs, int64_t group) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (b, g, t, d)
  const int64_t Hk = H / group;
  if (i >= B * Hk * Tlen * hs) return;
  const int64_t d = i % hs, t = (i / hs) % Tlen, g = (i / (hs * Tlen)) % Hk, b = i / (hs * Tlen * Hk);
  float sum = 0.0f;
  for (int64_t k = 0; k < group; ++k) sum += heads[((b * H + g * group + k) * Tlen + t) * hs + d];
  dst[(b * Tlen + t) * row + g * hs + d] = FromFloat<T>(sum);
}

}  // namespace

template <typename T>
void AddGroupedHeads(T* dst, int64_t row, const float* heads, int64_t B, int64_t H, int64_t Tlen, int64_t hs,
                     int64_t group, cudaStream_t stream) {
  const int64_t n = B * (H / group) * Tlen * hs;
  if (n <= 0) return;
  AddGroupedHeadsKernel<<<BlocksFor(n, 256), 256, 0, stream>>>(dst, row, heads, B, H, Tlen, hs, group);
  CheckLaunch("AddGroupedHeads");
}
template void AddGroupedHeads<bf16>(bf16*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    cudaStream_t);
template void AddGroupedHeads<fp16>(fp16*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    cudaStream_t);

#define PSTAR_INSTANTIATE_ATTENTION(T)                                                                         \
  template void AttentionForward<T>(T*, float*, const T*, const AttentionShape&, cudaStream_t,             \
                                    AttentionForwardKernel);                                                  \
  template void AttentionBackward<T>(T*, float*, const T*, const T*, const T*, const float*,                  \
                                     const AttentionShape&, cudaStream_t, AttentionBackwardKernel);

PSTAR_INSTANTIATE_ATTENTION(float)
PSTAR_INSTANTIATE_ATTENTION(bf16)
PSTAR_INSTANTIATE_ATTENTION(fp16)

#undef PSTAR_INSTANTIATE_ATTENTION

// A 16-bit run's backward: 16-bit activations, fp32 gradients.
template void AttentionBackward<float, bf16>(float*, float*, const float*, const bf16*, const bf16*, const float*,
                                             const AttentionShape&, cudaStream_t, AttentionBackwardKernel);
template void AttentionBackward<float, fp16>(float*, float*, const float*, const fp16*, const fp16*, const float*,
                                             const AttentionShape&, cudaStream_t, AttentionBackwardKernel);

}  // namespace pstar::kernels::cuda
