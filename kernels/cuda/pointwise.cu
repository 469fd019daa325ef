// Element-wise kernels. Each thread takes kPer consecutive elements: one or
// two 16- or 32-byte vector accesses per operand when every pointer is
// aligned to its pack and the pack lies inside the array, element by element
// otherwise (misaligned pointers, the last partial pack).
#include "kernels/cuda/pointwise.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kPer = 8;

// kPer consecutive elements, loaded or stored as one aligned unit.
template <typename T>
struct alignas(sizeof(T) * kPer) Pack {
  T v[kPer];
};

template <typename T>
bool PackAligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T>) == 0;
}

unsigned PackBlocks(int64_t n) { return BlocksFor((n + kPer - 1) / kPer, kThreads); }

// The tanh approximation of kernels/gelu.h, with its constants.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

struct Gelu {
  __device__ float operator()(float x) const {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

// gelu'(x) * dy.
struct GeluGrad {
  __device__ float operator()(float x, float dy) const {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return grad * dy;
  }
};

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct Identity {
  __device__ float operator()(float x) const { return x; }
};

template <typename T>
struct RoundTo {
  __device__ float operator()(float x) const { return ToFloat(FromFloat<T>(x)); }
};

// out[i] = op(in[i]), through fp32. `vec`: every pointer is pack-aligned.
template <typename To, typename From, typename Op>
__global__ void UnaryKernel(To* out, const From* in, int64_t n, bool vec, Op op) {
  const int64_t i0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kPer;
  if (i0 >= n) return;
  if (vec && i0 + kPer <= n) {
    const Pack<From> x = *reinterpret_cast<const Pack<From>*>(in + i0);
    Pack<To> y;
#pragma unroll
    for (int k = 0; k < kPer; ++k) y.v[k] = FromFloat<To>(op(ToFloat(x.v[k])));
    *reinterpret_cast<Pack<To>*>(out + i0) = y;
  } else {
    const int64_t end = n - i0 < kPer ? n : i0 + kPer;
    for (int64_t i = i0; i < end; ++i) out[i] = FromFloat<To>(op(ToFloat(in[i])));
  }
}

// out[i] = op(a[i], b[i]), through fp32. out may alias a or b: each element
// is read before it is written, by the same thread.
template <typename To, typename A, typename B, typename Op>
__global__ void BinaryKernel(To* out, const A* a, const B* b, int64_t n, bool vec, Op op) {
  const int64_t i0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kPer;
  if (i0 >= n) return;
  if (vec && i0 + kPer <= n) {
    const Pack<A> x = *reinterpret_cast<const Pack<A>*>(a + i0);
    const Pack<B> z = *reinterpret_cast<const Pack<B>*>(b + i0);
    Pack<To> y;
#pragma unroll
    for (int k = 0; k < kPer; ++k) y.v[k] = FromFloat<To>(op(ToFloat(x.v[k]), ToFloat(z.v[k])));
    *reinterpret_cast<Pack<To>*>(out + i0) = y;
  } else {
    const int64_t end = n - i0 < kPer ? n : i0 + kPer;
    for (int64_t i = i0; i < end; ++i) out[i] = FromFloat<To>(op(ToFloat(a[i]), ToFloat(b[i])));
  }
}

template <typename To, typename A, typename B, typename Op>
void LaunchBinary(To* out, const A* a, const B* b, int64_t n, Op op, cudaStream_t stream, const char* what) {
  if (n <= 0) return;
  const bool vec = PackAligned(out) && PackAligned(a) && PackAligned(b);
  BinaryKernel<<<PackBlocks(n), kThreads, 0, stream>>>(out, a, b, n, vec, op);
  CheckLaunch(what);
}

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const bool vec = PackAligned(out) && PackAligned(inp);
  UnaryKernel<<<PackBlocks(n), kThreads, 0, stream>>>(out, inp, n, vec, Gelu{});
  CheckLaunch("GeluForward");
}

template <typename T, typename A>
void GeluBackward(T* dinp, const A* inp, const T* dout, int64_t n, cudaStream_t stream) {
  LaunchBinary(dinp, inp, dout, n, GeluGrad{}, stream, "GeluBackward");
}

template <typename T, typename B>
void ResidualForward(T* out, const T* a, const B* b, int64_t n, cudaStream_t stream) {
  LaunchBinary(out, a, b, n, Add{}, stream, "ResidualForward");
}

// Widening to fp32 is exact and the one rounding is FromFloat's, so a
// conversion between the two 16-bit formats rounds once, as the host's
// FloatToHalf(BFloat16ToFloat(x)) does. The same type is a plain copy.
template <typename To, typename From>
void Convert(To* out, const From* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<To, From>) {
    if (out == in) return;
    if (cudaMemcpyAsync(out, in, size_t(n) * sizeof(To), cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
      CheckLaunch("Convert (copy)");
    }
  } else {
    const bool vec = PackAligned(out) && PackAligned(in);
    UnaryKernel<<<PackBlocks(n), kThreads, 0, stream>>>(out, in, n, vec, Identity{});
    CheckLaunch("Convert");
  }
}

template <typename T>
void RoundThrough(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  UnaryKernel<<<PackBlocks(n), kThreads, 0, stream>>>(x, x, n, PackAligned(x), RoundTo<T>{});
  CheckLaunch("RoundThrough");
}
template void RoundThrough<bf16>(float*, int64_t, cudaStream_t);
template void RoundThrough<fp16>(float*, int64_t, cudaStream_t);

#define PSTAR_POINTWISE(T)                                                           \
  template void GeluForward<T>(T*, const T*, int64_t, cudaStream_t);                 \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t, cudaStream_t);      \
  template void ResidualForward<T>(T*, const T*, const T*, int64_t, cudaStream_t);   \
  template void Convert<T, float>(T*, const float*, int64_t, cudaStream_t);          \
  template void Convert<T, bf16>(T*, const bf16*, int64_t, cudaStream_t);            \
  template void Convert<T, fp16>(T*, const fp16*, int64_t, cudaStream_t);
PSTAR_POINTWISE(float)
PSTAR_POINTWISE(bf16)
PSTAR_POINTWISE(fp16)
#undef PSTAR_POINTWISE
template void GeluBackward<float, bf16>(float*, const bf16*, const float*, int64_t, cudaStream_t);
template void GeluBackward<float, fp16>(float*, const fp16*, const float*, int64_t, cudaStream_t);
template void ResidualForward<bf16, float>(bf16*, const bf16*, const float*, int64_t, cudaStream_t);
template void ResidualForward<fp16, float>(fp16*, const fp16*, const float*, int64_t, cudaStream_t);

}  // namespace pstar::kernels::cuda
