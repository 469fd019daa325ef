// RoPE's kernel (kernels/cuda/rope.h): one thread per rotated pair
// (x_i, x_{i + D/2}) of a head, consecutive threads on consecutive i, so a
// warp reads a head's halves and the tables' row in runs.
//
// Device code only, with no includes: kernels/cuda/rope.cu puts it inside its
// namespace after kernels/cuda/element.cuh, and the host emulation's test
// after tests/kernels/cuda/warp_emulation.h.

constexpr unsigned kRopeThreads = 256;

// `sign` +1 rotates by the angle, -1 by its negative (the transpose).
template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    RopeRotateKernel(T* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                     int64_t N, int64_t heads, int64_t half, float sign) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * heads * half) return;
  const int64_t i = k % half, head = k / half;
  const int64_t n = head / heads, h = head % heads;
  T* v = x + n * row_stride + h * 2 * half;
  const int64_t entry = int64_t(positions[n]) * half + i;
  const float c = cos[entry], s = sign * sin[entry];
  const float a = ToFloat(v[i]), b = ToFloat(v[i + half]);
  v[i] = FromFloat<T>(a * c - b * s);
  v[i + half] = FromFloat<T>(b * c + a * s);
}
