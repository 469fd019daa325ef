// The norms' deterministic weight (and bias) gradients: sums over rows per
// column, in two passes with no atomics. Rows are cut into at most
// kNormMaxGroups groups of at least kNormMinGroupRows rows; the first pass
// sums each group's rows in row order into fp32 partials, the second adds
// the groups in group order into the gradient. LayerNorm (kernels/cuda/layernorm.cu)
// and RMSNorm (kernels/cuda/rmsnorm.cu) both take them.
//
// Device code only, with no includes: its includers put it inside their
// namespace after ToFloat and FromFloat (kernels/cuda/element.cuh, or the
// host emulation's, tests/kernels/cuda/warp_emulation.h).

constexpr int64_t kNormMinGroupRows = 32;
constexpr int64_t kNormMaxGroups = 256;

inline int64_t NormGroupRows(int64_t N) {
  const int64_t spread = (N + kNormMaxGroups - 1) / kNormMaxGroups;
  return spread > kNormMinGroupRows ? spread : kNormMinGroupRows;
}

inline int64_t NormGroups(int64_t N) { return (N + NormGroupRows(N) - 1) / NormGroupRows(N); }

// Block (g, chunk), thread c of the chunk: over the rows of group g, in row
// order, the sum of dout[n, c] * xhat[n, c] into partials[(G + g) * C + c]
// with kBias (LayerNorm: xhat = (x - mean) * rstd, and the sum of dout[n, c]
// into partials[g * C + c]), else into partials[g * C + c] (RMSNorm: xhat =
// x * rstd, `mean` unread).
template <bool kBias, typename T, typename I>
__global__ void NormColumnPartialsKernel(float* partials, const T* dout, const I* inp, const float* mean,
                                         const float* rstd, int64_t N, int64_t C, int64_t group_rows) {
  const int64_t g = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t first = g * group_rows;
  const int64_t last = first + group_rows < N ? first + group_rows : N;
  float db = 0.0f, dw = 0.0f;
  // Unrolled so that a thread has several rows' loads in flight; the adds stay in row order.
#pragma unroll 4
  for (int64_t n = first; n < last; ++n) {
    const float dy = ToFloat(dout[n * C + c]);
    if constexpr (kBias) {
      db += dy;
      dw += dy * ((ToFloat(inp[n * C + c]) - mean[n]) * rstd[n]);
    } else {
      dw += dy * (ToFloat(inp[n * C + c]) * rstd[n]);
    }
  }
  if constexpr (kBias) {
    partials[g * C + c] = db;
    partials[(gridDim.x + g) * C + c] = dw;
  } else {
    partials[g * C + c] = dw;
  }
}

// dweight[c] += the groups' partials, in group order; with kBias, dbias
// likewise (the layout above).
template <bool kBias, typename T>
__global__ void NormColumnTotalsKernel(T* dweight, T* dbias, const float* partials, int64_t groups, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float db = 0.0f, dw = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (kBias) {
      db += partials[g * C + c];
      dw += partials[(groups + g) * C + c];
    } else {
      dw += partials[g * C + c];
    }
  }
  if constexpr (kBias) dbias[c] = FromFloat<T>(ToFloat(dbias[c]) + db);
  dweight[c] = FromFloat<T>(ToFloat(dweight[c]) + dw);
}
