// RMSNorm's kernels (kernels/cuda/rmsnorm.h): one warp per row, each lane
// summing a strided share of the row (or, in the vector backward, whole runs
// of 8 columns), then the warp's butterfly. Each lane reads back only the
// columns it wrote, so the fused residual needs no barrier.
//
// Device code only, with no includes: kernels/cuda/rmsnorm.cu puts it inside
// its namespace after kernels/cuda/element.cuh and kernels/cuda/packs.cuh, and the host emulation's test
// (tests/kernels/cuda/llama_kernels_emulation_test.cc) after
// tests/kernels/cuda/warp_emulation.h, so the same code runs on both.

constexpr unsigned kRmsNormThreads = 256;
constexpr unsigned kRmsNormRowsPerBlock = kRmsNormThreads / kWarpSize;  // one warp per row

// One warp normalizes row x (C elements) into o; lane 0 writes its rstd.
template <typename T>
__device__ void RmsNormalizeRowWarp(T* o, float* rstd, const T* x, const T* weight, float eps, int64_t C, int lane) {
  float squares = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float v = ToFloat(x[c]);
    squares += v * v;
  }
  const float s = 1.0f / sqrtf(WarpSum(squares) / float(C) + eps);
  for (int64_t c = lane; c < C; c += kWarpSize) o[c] = FromFloat<T>(ToFloat(weight[c]) * (ToFloat(x[c]) * s));
  if (lane == 0) *rstd = s;
}

// With b null: out = RMSNorm(a). Otherwise res = a + b rounded to T first,
// and the rounded row normalized.
template <typename T, typename B>
__global__ void __launch_bounds__(kRmsNormThreads)
    RmsNormForwardKernel(T* res, T* out, float* rstd, const T* a, const B* b, const T* weight, float eps, int64_t N,
                         int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRmsNormRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x % kWarpSize);
  if (row >= N) return;  // the whole warp leaves together
  const T* x = a + row * C;
  if (b != nullptr) {
    T* r = res + row * C;
    for (int64_t c = lane; c < C; c += kWarpSize) r[c] = FromFloat<T>(ToFloat(x[c]) + ToFloat(b[row * C + c]));
    x = r;
  }
  RmsNormalizeRowWarp(out + row * C, rstd + row, x, weight, eps, C, lane);
}

// dinp[row] += (dn - xhat * mean(dn * xhat)) * rstd, xhat = x * rstd,
// dn = weight * dout; with `copy`, dinp's new row rounded to D there too.
template <typename I, typename D>
__global__ void __launch_bounds__(kRmsNormThreads)
    RmsNormBackwardRowsKernel(float* dinp, D* copy, const D* dout, const I* inp, const float* weight,
                              const float* rstd, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRmsNormRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x % kWarpSize);
  if (row >= N) return;  // the whole warp leaves together
  const I* x = inp + row * C;
  const D* dy = dout + row * C;
  const float s = rstd[row];
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) sum += (weight[c] * ToFloat(dy[c])) * (ToFloat(x[c]) * s);
  const float mean_dn_xhat = WarpSum(sum) / float(C);
  float* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = ToFloat(x[c]) * s;
    const float v = dx[c] + (weight[c] * ToFloat(dy[c]) - xhat * mean_dn_xhat) * s;
    dx[c] = v;
    if (copy != nullptr) copy[row * C + c] = FromFloat<D>(v);
  }
}

// The same with 16-byte accesses: each lane takes whole runs of 8 columns
// (C a multiple of 8, every row 16-byte aligned). Its sums run in an order
// of their own: other bits than the scalar kernel's, the same run to run.
template <typename I, typename D>
__global__ void __launch_bounds__(kRmsNormThreads)
    RmsNormBackwardRowsVectorKernel(float* dinp, D* copy, const D* dout, const I* inp, const float* weight,
                                    const float* rstd, int64_t N, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRmsNormRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x % kWarpSize);
  if (row >= N) return;  // the whole warp leaves together
  const I* x = inp + row * C;
  const D* dy = dout + row * C;
  const float s = rstd[row];
  const int64_t runs = C / 8;
  float sum = 0.0f;
  for (int64_t r = lane; r < runs; r += kWarpSize) {
    float xv[8], dyv[8], wv[8];
    Widen8(x + r * 8, xv);
    Widen8(dy + r * 8, dyv);
    Widen8(weight + r * 8, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += (wv[i] * dyv[i]) * (xv[i] * s);
  }
  const float mean_dn_xhat = WarpSum(sum) / float(C);
  float* dx = dinp + row * C;
  for (int64_t r = lane; r < runs; r += kWarpSize) {
    float xv[8], dyv[8], wv[8], dxv[8];
    Widen8(x + r * 8, xv);
    Widen8(dy + r * 8, dyv);
    Widen8(weight + r * 8, wv);
    Widen8(dx + r * 8, dxv);
#pragma unroll
    for (int i = 0; i < 8; ++i) dxv[i] += (wv[i] * dyv[i] - (xv[i] * s) * mean_dn_xhat) * s;
    Narrow8(dx + r * 8, dxv);
    if (copy != nullptr) Narrow8(copy + row * C + r * 8, dxv);
  }
}
