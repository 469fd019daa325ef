// LayerNorm: one warp per row for the forward pass and for dinp, with fp32
// statistics (each lane sums a strided share of the row, then the warp's
// butterfly); dweight and dbias in two deterministic passes: fixed groups of
// rows summed per column into fp32 scratch, then the groups added in order.
#include "kernels/cuda/layernorm.h"

#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

#include "kernels/cuda/norm_columns.cuh"

constexpr unsigned kThreads = 256;
constexpr unsigned kRowsPerBlock = kThreads / kWarpSize;  // one warp per row
constexpr float kEps = cpu::kLayerNormEps;

unsigned RowBlocks(int64_t N) { return BlocksFor(N, kRowsPerBlock); }

// One warp normalizes one row x (C elements) into o; lane 0 writes the row's
// statistics. Each lane reads only the columns it owns.
template <typename T>
__device__ void NormalizeRowWarp(T* o, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                                 int64_t C, int lane) {
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) sum += ToFloat(x[c]);
  const float m = WarpSum(sum) / float(C);
  float sq = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float d = ToFloat(x[c]) - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(WarpSum(sq) / float(C) + kEps);
  for (int64_t c = lane; c < C; c += kWarpSize) {
    o[c] = FromFloat<T>((ToFloat(x[c]) - m) * s * ToFloat(weight[c]) + ToFloat(bias[c]));
  }
  if (lane == 0) {
    *mean = m;
    *rstd = s;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                           int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  NormalizeRowWarp(out + row * C, mean + row, rstd + row, inp + row * C, weight, bias, C, lane);
}

// The residual add fused in front: each lane writes its share of res, and the
// normalization then reads back only the columns that lane wrote, so no
// synchronization is needed.
template <typename T, typename B>
__global__ void __launch_bounds__(kThreads)
    ResidualLayerNormForwardKernel(T* res, T* out, float* mean, float* rstd, const T* a, const B* b, const T* weight,
                                   const T* bias, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  T* x = res + row * C;
  for (int64_t c = lane; c < C; c += kWarpSize) x[c] = FromFloat<T>(ToFloat(a[row * C + c]) + ToFloat(b[row * C + c]));
  NormalizeRowWarp(out + row * C, mean + row, rstd + row, x, weight, bias, C, lane);
}

// dinp[row] += (dn - mean(dn) - xhat * mean(dn * xhat)) * rstd, dn = weight * dout;
// with `copy`, dinp's new row rounded to D there too.
template <typename T, typename I, typename D>
__global__ void __launch_bounds__(kThreads)
    LayerNormBackwardRowsKernel(T* dinp, D* copy, const D* dout, const I* inp, const T* weight, const float* mean,
                                const float* rstd, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  const I* x = inp + row * C;
  const D* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];

  float sum_dn = 0.0f, sum_dn_xhat = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = (ToFloat(x[c]) - m) * s;
    const float dn = ToFloat(weight[c]) * ToFloat(dy[c]);
    sum_dn += dn;
    sum_dn_xhat += dn * xhat;
  }
  const float mean_dn = WarpSum(sum_dn) / float(C);
  const float mean_dn_xhat = WarpSum(sum_dn_xhat) / float(C);

  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = (ToFloat(x[c]) - m) * s;
    const float dn = ToFloat(weight[c]) * ToFloat(dy[c]);
    const T v = FromFloat<T>(ToFloat(dx[c]) + (dn - mean_dn - xhat * mean_dn_xhat) * s);
    dx[c] = v;
    if (copy != nullptr) copy[row * C + c] = FromFloat<D>(ToFloat(v));
  }
}

// Eight consecutive elements of p (16-byte aligned) widened, in one 16-byte
// load (16-bit types) or two (fp32).
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float (&f)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = ToFloat(e[i]);
  } else {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}

template <typename T>
__device__ __forceinline__ void Store8(T* p, const float (&f)[8]) {
  if constexpr (sizeof(T) == 2) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = FromFloat<T>(f[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

// LayerNormBackwardRowsKernel with 16-byte accesses: each lane takes whole
// runs of 8 columns (C a multiple of 8, every row 16-byte aligned), so a
// warp has 8 times the bytes in flight. Its sums run in an order of their
// own (a lane's runs, then the warp's butterfly): other bits than the scalar
// kernel's, the same ones run to run.
template <typename T, typename I, typename D>
__global__ void __launch_bounds__(kThreads)
    LayerNormBackwardRowsVectorKernel(T* dinp, D* copy, const D* dout, const I* inp, const T* weight, const float* mean,
                                      const float* rstd, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  const I* x = inp + row * C;
  const D* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  const int64_t runs = C / 8;

  float sum_dn = 0.0f, sum_dn_xhat = 0.0f;
  for (int64_t r = lane; r < runs; r += kWarpSize) {
    float xv[8], dyv[8], wv[8];
    Load8(x + r * 8, xv);
    Load8(dy + r * 8, dyv);
    Load8(weight + r * 8, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float xhat = (xv[i] - m) * s;
      const float dn = wv[i] * dyv[i];
      sum_dn += dn;
      sum_dn_xhat += dn * xhat;
    }
  }
  const float mean_dn = WarpSum(sum_dn) / float(C);
  const float mean_dn_xhat = WarpSum(sum_dn_xhat) / float(C);

  T* dx = dinp + row * C;
  for (int64_t r = lane; r < runs; r += kWarpSize) {
    float xv[8], dyv[8], wv[8], dxv[8];
    Load8(x + r * 8, xv);
    Load8(dy + r * 8, dyv);
    Load8(weight + r * 8, wv);
    Load8(dx + r * 8, dxv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float xhat = (xv[i] - m) * s;
      const float dn = wv[i] * dyv[i];
      dxv[i] = ToFloat(FromFloat<T>(dxv[i] + (dn - mean_dn - xhat * mean_dn_xhat) * s));
    }
    Store8(dx + r * 8, dxv);
    if (copy != nullptr) Store8(copy + row * C + r * 8, dxv);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                      int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  LayerNormForwardKernel<<<RowBlocks(N), kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  CheckLaunch("LayerNormForward");
}

template <typename T, typename B>
void ResidualLayerNormForward(T* res, T* out, float* mean, float* rstd, const T* a, const B* b, const T* weight,
                              const T* bias, int64_t N, int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  ResidualLayerNormForwardKernel<<<RowBlocks(N), kThreads, 0, stream>>>(res, out, mean, rstd, a, b, weight, bias, N,
                                                                         C);
  CheckLaunch("ResidualLayerNormForward");
}

int64_t LayerNormBackwardScratchElements(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 0;
  return 2 * NormGroups(N) * C;
}

bool LayerNormBackwardTakesVectors(const void* dinp, const void* dinp_copy, const void* dout, const void* inp,
                                   const void* weight, int64_t C) {
  return C % 8 == 0 && Aligned16(dinp) && (dinp_copy == nullptr || Aligned16(dinp_copy)) && Aligned16(dout) &&
         Aligned16(inp) && Aligned16(weight);
}

template <typename T, typename I, typename D>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, float* scratch, const D* dout, const I* inp, const T* weight,
                       const float* mean, const float* rstd, int64_t N, int64_t C, cudaStream_t stream, D* dinp_copy,
                       LayerNormKernel kernel) {
  if (N <= 0 || C <= 0) return;
  if (kernel == LayerNormKernel::kVector && LayerNormBackwardTakesVectors(dinp, dinp_copy, dout, inp, weight, C)) {
    LayerNormBackwardRowsVectorKernel<<<RowBlocks(N), kThreads, 0, stream>>>(dinp, dinp_copy, dout, inp, weight, mean,
                                                                             rstd, N, C);
  } else {
    LayerNormBackwardRowsKernel<<<RowBlocks(N), kThreads, 0, stream>>>(dinp, dinp_copy, dout, inp, weight, mean, rstd,
                                                                       N, C);
  }
  CheckLaunch("LayerNormBackward (dinp)");

  const int64_t groups = NormGroups(N);
  const dim3 grid(static_cast<unsigned>(groups), BlocksFor(C, kThreads));
  NormColumnPartialsKernel<true><<<grid, kThreads, 0, stream>>>(scratch, dout, inp, mean, rstd, N, C,
                                                                NormGroupRows(N));
  CheckLaunch("LayerNormBackward (column partials)");
  NormColumnTotalsKernel<true><<<BlocksFor(C, kThreads), kThreads, 0, stream>>>(dweight, dbias, scratch, groups, C);
  CheckLaunch("LayerNormBackward (column totals)");
}

#define PSTAR_LAYERNORM(T)                                                                                             \
  template void LayerNormForward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, int64_t, cudaStream_t); \
  template void LayerNormBackward<T>(T*, T*, T*, float*, const T*, const T*, const T*, const float*, const float*,     \
                                     int64_t, int64_t, cudaStream_t, T*, LayerNormKernel);                             \
  template void ResidualLayerNormForward<T>(T*, T*, float*, float*, const T*, const T*, const T*, const T*, int64_t,   \
                                            int64_t, cudaStream_t);
PSTAR_LAYERNORM(float)
PSTAR_LAYERNORM(bf16)
PSTAR_LAYERNORM(fp16)
#undef PSTAR_LAYERNORM

// A 16-bit run's residual stream with fp32 projections and gradients.
#define PSTAR_LAYERNORM_MIXED(H)                                                                                       \
  template void ResidualLayerNormForward<H, float>(H*, H*, float*, float*, const H*, const float*, const H*, const H*, \
                                                   int64_t, int64_t, cudaStream_t);                                    \
  template void LayerNormBackward<float, H>(float*, float*, float*, float*, const float*, const H*, const float*,      \
                                            const float*, const float*, int64_t, int64_t, cudaStream_t, float*,        \
                                            LayerNormKernel);                                                          \
  template void LayerNormBackward<float, H, H>(float*, float*, float*, float*, const H*, const H*, const float*,       \
                                               const float*, const float*, int64_t, int64_t, cudaStream_t, H*,         \
                                               LayerNormKernel);
PSTAR_LAYERNORM_MIXED(bf16)
PSTAR_LAYERNORM_MIXED(fp16)
#undef PSTAR_LAYERNORM_MIXED

}  // namespace pstar::kernels::cuda
