// SwiGLU on the GPU, as kernels/swiglu.h: row n of gu (N, 2F) holds gate (F)
// then up (F); out (N, F) = silu(gate) * up. fp32 arithmetic on elements of
// T, rounded once; 16-byte accesses where F is a multiple of 8 and every
// pointer 16-byte aligned, element by element elsewhere.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

template <typename T>
void SwiGluForward(T* out, const T* gu, int64_t N, int64_t F, cudaStream_t stream);

// dgu (N, 2F) overwritten: dgate = dout * up * silu'(gate), dup = dout * silu(gate).
template <typename T>
void SwiGluBackward(T* dgu, const T* gu, const T* dout, int64_t N, int64_t F, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
