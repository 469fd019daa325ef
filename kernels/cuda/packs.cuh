// Eight consecutive elements as one aligned access, for the row kernels
// that read 16 bytes at a time (kernels/cuda/rmsnorm.cuh, swiglu.cuh).
//
// Device code only, with no includes: its includers put it inside their
// namespace after ToFloat and FromFloat (kernels/cuda/element.cuh, or the
// host emulation's).

// Eight consecutive elements, 16-byte aligned: one 16-byte access for
// 16-bit T, two for fp32.
template <typename T>
struct alignas(16) Eight {
  T v[8];
};

template <typename T>
__device__ __forceinline__ void Widen8(const T* p, float (&f)[8]) {
  const Eight<T> e = *reinterpret_cast<const Eight<T>*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = ToFloat(e.v[i]);
}

template <typename T>
__device__ __forceinline__ void Narrow8(T* p, const float (&f)[8]) {
  Eight<T> e;
#pragma unroll
  for (int i = 0; i < 8; ++i) e.v[i] = FromFloat<T>(f[i]);
  *reinterpret_cast<Eight<T>*>(p) = e;
}

