#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kRowsPerBlock = 8;  // softmax: one warp per row

// heads (B, NH, T, hs) <- src (B, T, NH*hs) whose rows are ld elements apart:
// one thread per element of heads, so writes are contiguous and reads run
// along each head's hs columns.
template <typename T>
__global__ void ToHeads(T* heads, const T* src, int64_t ld, int64_t B, int64_t Tlen, int64_t NH, int64_t hs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * NH * Tlen * hs) return;
  const int64_t d = i % hs;
  const int64_t t = (i / hs) % Tlen;
  const int64_t h = (i / (hs * Tlen)) % NH;
  const int64_t b = i / (hs * Tlen * NH);
  heads[i] = src[(b * Tlen + t) * ld + h * hs + d];
}

// The inverse: dst (B, T, NH*hs), rows ld apart, <- heads (B, NH, T, hs).
template <typename T>
__global__ void FromHeads(T* dst, int64_t ld, const T* heads, int64_t B, int64_t Tlen, int64_t NH, int64_t hs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * NH * Tlen * hs) return;
  const int64_t d = i % hs;
  const int64_t t = (i / hs) % Tlen;
  const int64_t h = (i / (hs * Tlen)) % NH;
  const int64_t b = i / (hs * Tlen * NH);
  dst[(b * Tlen + t) * ld + h * hs + d] = heads[i];
}

// In place over att, rows of Tlen: the row of query position t (row % Tlen)
// becomes the softmax of its first t + 1 scores, and zeros after them. One
// warp per row; max, sum and probabilities in fp32.
template <typename T>
__global__ void CausalSoftmaxForward(T* att, int64_t rows, int64_t Tlen) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = int(threadIdx.x % kWarpSize);
  const int64_t t = row % Tlen;
  T* x = att + row * Tlen;
  float maxv = -INFINITY;
  for (int64_t j = lane; j <= t; j += kWarpSize) maxv = fmaxf(maxv, ToFloat(x[j]));
  maxv = WarpMax(maxv);
  float sum = 0.0f;
  for (int64_t j = lane; j <= t; j += kWarpSize) sum += expf(ToFloat(x[j]) - maxv);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < Tlen; j += kWarpSize) {
    x[j] = FromFloat<T>(j <= t ? expf(ToFloat(x[j]) - maxv) * inv : 0.0f);
  }
}

// In place over datt (dP on entry, dS on exit), with the probabilities P of
// the same rows: dS = P * (dP - sum_j P_j dP_j) * scale on the causal part,
// zero above the diagonal. One warp per row, fp32.
template <typename T>
__global__ void CausalSoftmaxBackward(T* datt, const T* att, int64_t rows, int64_t Tlen, float scale) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int lane = int(threadIdx.x % kWarpSize);
  const int64_t t = row % Tlen;
  T* dp = datt + row * Tlen;
  const T* p = att + row * Tlen;
  float dot = 0.0f;
  for (int64_t j = lane; j <= t; j += kWarpSize) dot += ToFloat(p[j]) * ToFloat(dp[j]);
  dot = WarpSum(dot);
  for (int64_t j = lane; j < Tlen; j += kWarpSize) {
    dp[j] = FromFloat<T>(j <= t ? ToFloat(p[j]) * (ToFloat(dp[j]) - dot) * scale : 0.0f);
  }
}

template <typename T>
void LaunchToHeads(T* heads, const T* src, int64_t ld, int64_t B, int64_t Tlen, int64_t NH, int64_t hs,
                   cudaStream_t stream) {
  ToHeads<<<BlocksFor(B * NH * Tlen * hs, kThreads), kThreads, 0, stream>>>(heads, src, ld, B, Tlen, NH, hs);
  CheckLaunch("ToHeads");
}

template <typename T>
void LaunchFromHeads(T* dst, int64_t ld, const T* heads, int64_t B, int64_t Tlen, int64_t NH, int64_t hs,
                     cudaStream_t stream) {
  FromHeads<<<BlocksFor(B * NH * Tlen * hs, kThreads), kThreads, 0, stream>>>(dst, ld, heads, B, Tlen, NH, hs);
  CheckLaunch("FromHeads");
}

}  // namespace

// Forward keeps q, k, v per head (the output per head reuses q's space);
// backward keeps q, k, v, dout per head and dv (dq and dk reuse dout's and
// v's space).
int64_t AttentionScratchElements(int64_t B, int64_t T, int64_t C, int64_t NH) { return 5 * B * T * C; }

template <typename T>
void AttentionForward(BlasContext& blas, T* out, T* att, T* scratch, const T* qkv, int64_t B, int64_t Tlen,
                      int64_t C, int64_t NH, cudaStream_t stream) {
  const int64_t hs = C / NH;
  const int64_t n = B * Tlen * C;
  const int64_t heads = B * NH;
  const int64_t head_stride = Tlen * hs;   // one head of q, k, v or y
  const int64_t att_stride = Tlen * Tlen;  // one head of att
  if (n == 0) return;
  T* q = scratch;
  T* k = q + n;
  T* v = k + n;
  LaunchToHeads(q, qkv, 3 * C, B, Tlen, NH, hs, stream);
  LaunchToHeads(k, qkv + C, 3 * C, B, Tlen, NH, hs, stream);
  LaunchToHeads(v, qkv + 2 * C, 3 * C, B, Tlen, NH, hs, stream);

  // S = scale Q K^T per head, then P = causal softmax(S) in place.
  const float scale = 1.0f / std::sqrt(float(hs));
  GemmStridedBatched(blas, false, true, Tlen, Tlen, hs, scale, q, hs, head_stride, k, hs, head_stride, 0.0f, att,
                     Tlen, att_stride, heads, stream);
  const int64_t rows = heads * Tlen;
  CausalSoftmaxForward<<<BlocksFor(rows, kRowsPerBlock), kRowsPerBlock * kWarpSize, 0, stream>>>(att, rows, Tlen);
  CheckLaunch("CausalSoftmaxForward");

  // Y = P V per head, into q's space, then back to (B, T, C).
  T* y = q;
  GemmStridedBatched(blas, false, false, Tlen, hs, Tlen, 1.0f, att, Tlen, att_stride, v, hs, head_stride, 0.0f, y,
                     hs, head_stride, heads, stream);
  LaunchFromHeads(out, C, y, B, Tlen, NH, hs, stream);
}

template <typename T>
void AttentionBackward(BlasContext& blas, T* dqkv, T* datt, T* scratch, const T* dout, const T* qkv,
                       const T* att, int64_t B, int64_t Tlen, int64_t C, int64_t NH, cudaStream_t stream) {
  const int64_t hs = C / NH;
  const int64_t n = B * Tlen * C;
  const int64_t heads = B * NH;
  const int64_t head_stride = Tlen * hs;
  const int64_t att_stride = Tlen * Tlen;
  if (n == 0) return;
  T* q = scratch;
  T* k = q + n;
  T* v = k + n;
  T* dy = v + n;
  T* dv = dy + n;
  LaunchToHeads(q, qkv, 3 * C, B, Tlen, NH, hs, stream);
  LaunchToHeads(k, qkv + C, 3 * C, B, Tlen, NH, hs, stream);
  LaunchToHeads(v, qkv + 2 * C, 3 * C, B, Tlen, NH, hs, stream);
  LaunchToHeads(dy, dout, C, B, Tlen, NH, hs, stream);

  // dP = dY V^T and dV = P^T dY per head.
  GemmStridedBatched(blas, false, true, Tlen, Tlen, hs, 1.0f, dy, hs, head_stride, v, hs, head_stride, 0.0f, datt,
                     Tlen, att_stride, heads, stream);
  GemmStridedBatched(blas, true, false, Tlen, hs, Tlen, 1.0f, att, Tlen, att_stride, dy, hs, head_stride, 0.0f, dv,
                     hs, head_stride, heads, stream);

  // dS through the softmax, scale included, in place in datt.
  const float scale = 1.0f / std::sqrt(float(hs));
  const int64_t rows = heads * Tlen;
  CausalSoftmaxBackward<<<BlocksFor(rows, kRowsPerBlock), kRowsPerBlock * kWarpSize, 0, stream>>>(datt, att, rows,
                                                                                                 Tlen, scale);
  CheckLaunch("CausalSoftmaxBackward");

  // dQ = dS K into dY's space and dK = dS^T Q into V's space (both are done
  // with), then all three back into dqkv.
  T* dq = dy;
  T* dk = v;
  GemmStridedBatched(blas, false, false, Tlen, hs, Tlen, 1.0f, datt, Tlen, att_stride, k, hs, head_stride, 0.0f, dq,
                     hs, head_stride, heads, stream);
  GemmStridedBatched(blas, true, false, Tlen, hs, Tlen, 1.0f, datt, Tlen, att_stride, q, hs, head_stride, 0.0f, dk,
                     hs, head_stride, heads, stream);
  LaunchFromHeads(dqkv, 3 * C, dq, B, Tlen, NH, hs, stream);
  LaunchFromHeads(dqkv + C, 3 * C, dk, B, Tlen, NH, hs, stream);
  LaunchFromHeads(dqkv + 2 * C, 3 * C, dv, B, Tlen, NH, hs, stream);
}

#define PSTAR_INSTANTIATE_ATTENTION(T)                                                                        \
  template void AttentionForward<T>(BlasContext&, T*, T*, T*, const T*, int64_t, int64_t, int64_t, int64_t,   \
                                    cudaStream_t);                                                            \
  template void AttentionBackward<T>(BlasContext&, T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                     int64_t, int64_t, cudaStream_t);

PSTAR_INSTANTIATE_ATTENTION(float)
PSTAR_INSTANTIATE_ATTENTION(bf16)
PSTAR_INSTANTIATE_ATTENTION(fp16)

#undef PSTAR_INSTANTIATE_ATTENTION

}  // namespace pstar::kernels::cuda
