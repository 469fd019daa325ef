// SwiGLU's kernels (kernels/cuda/swiglu.h): each thread takes kSwiGluPer
// consecutive outputs of one row, as one aligned pack per operand (`packs`:
// F a multiple of 8, every pointer 16-byte aligned) or element by element.
//
// Device code only, with no includes: kernels/cuda/swiglu.cu puts it inside
// its namespace after kernels/cuda/element.cuh and kernels/cuda/packs.cuh, and
// the host emulation's test after tests/kernels/cuda/warp_emulation.h.

constexpr unsigned kSwiGluThreads = 256;
constexpr int64_t kSwiGluPer = 8;

__device__ __forceinline__ float SwiGluSigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void __launch_bounds__(kSwiGluThreads)
    SwiGluForwardKernel(T* out, const T* gu, int64_t N, int64_t F, bool packs) {
  const int64_t k0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kSwiGluPer;
  if (k0 >= N * F) return;
  if (packs) {  // the pack lies in one row
    const int64_t n = k0 / F, f = k0 % F;
    float g[8], u[8], o[8];
    Widen8(gu + n * 2 * F + f, g);
    Widen8(gu + n * 2 * F + F + f, u);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = g[i] * SwiGluSigmoid(g[i]) * u[i];
    Narrow8(out + k0, o);
    return;
  }
  const int64_t end = N * F - k0 < kSwiGluPer ? N * F : k0 + kSwiGluPer;
  for (int64_t k = k0; k < end; ++k) {
    const int64_t n = k / F, f = k % F;
    const float g = ToFloat(gu[n * 2 * F + f]), u = ToFloat(gu[n * 2 * F + F + f]);
    out[k] = FromFloat<T>(g * SwiGluSigmoid(g) * u);
  }
}

// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename T>
__global__ void __launch_bounds__(kSwiGluThreads)
    SwiGluBackwardKernel(T* dgu, const T* gu, const T* dout, int64_t N, int64_t F, bool packs) {
  const int64_t k0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kSwiGluPer;
  if (k0 >= N * F) return;
  if (packs) {
    const int64_t n = k0 / F, f = k0 % F;
    float g[8], u[8], d[8], dg[8], du[8];
    Widen8(gu + n * 2 * F + f, g);
    Widen8(gu + n * 2 * F + F + f, u);
    Widen8(dout + k0, d);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float s = SwiGluSigmoid(g[i]);
      dg[i] = d[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
      du[i] = d[i] * (g[i] * s);
    }
    Narrow8(dgu + n * 2 * F + f, dg);
    Narrow8(dgu + n * 2 * F + F + f, du);
    return;
  }
  const int64_t end = N * F - k0 < kSwiGluPer ? N * F : k0 + kSwiGluPer;
  for (int64_t k = k0; k < end; ++k) {
    const int64_t n = k / F, f = k % F;
    const float g = ToFloat(gu[n * 2 * F + f]), u = ToFloat(gu[n * 2 * F + F + f]), d = ToFloat(dout[k]);
    const float s = SwiGluSigmoid(g);
    dgu[n * 2 * F + f] = FromFloat<T>(d * u * (s * (1.0f + g * (1.0f - s))));
    dgu[n * 2 * F + F + f] = FromFloat<T>(d * (g * s));
  }
}
