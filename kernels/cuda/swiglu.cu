// SwiGLU: the kernels of kernels/cuda/swiglu.cuh.
#include "kernels/cuda/swiglu.h"

#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/swiglu.cuh"

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned PackBlocks(int64_t n) { return BlocksFor((n + kSwiGluPer - 1) / kSwiGluPer, kSwiGluThreads); }

}  // namespace

template <typename T>
void SwiGluForward(T* out, const T* gu, int64_t N, int64_t F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  const bool packs = F % kSwiGluPer == 0 && Aligned16(out) && Aligned16(gu);
  SwiGluForwardKernel<<<PackBlocks(N * F), kSwiGluThreads, 0, stream>>>(out, gu, N, F, packs);
  CheckLaunch("SwiGluForward");
}

template <typename T>
void SwiGluBackward(T* dgu, const T* gu, const T* dout, int64_t N, int64_t F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  const bool packs = F % kSwiGluPer == 0 && Aligned16(dgu) && Aligned16(gu) && Aligned16(dout);
  SwiGluBackwardKernel<<<PackBlocks(N * F), kSwiGluThreads, 0, stream>>>(dgu, gu, dout, N, F, packs);
  CheckLaunch("SwiGluBackward");
}

#define PSTAR_SWIGLU(T)                                                                    \
  template void SwiGluForward<T>(T*, const T*, int64_t, int64_t, cudaStream_t);            \
  template void SwiGluBackward<T>(T*, const T*, const T*, int64_t, int64_t, cudaStream_t);
PSTAR_SWIGLU(float)
PSTAR_SWIGLU(bf16)
PSTAR_SWIGLU(fp16)
#undef PSTAR_SWIGLU

}  // namespace pstar::kernels::cuda
