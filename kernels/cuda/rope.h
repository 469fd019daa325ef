// Rotary position embeddings on the GPU, as kernels/rope.h (rotate-half),
// reading the shared fp32 tables (kernels::RopeTables) and a position per
// row. In place on T: a 16-bit run rotates its 16-bit q and k and rounds once.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// Rotates `heads` heads of head_dim D (even) in each of N rows, row n at
// x + n * row_stride, by position positions[n]: cos and sin are
// (positions, D / 2).
template <typename T>
void RopeForward(T* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
                 int64_t heads, int64_t D, cudaStream_t stream);

// The rotation's transpose on a gradient in place (kernels::cpu::RopeBackward).
// On a 16-bit gradient it rounds once more than the CPU backend, which
// rotates the fp32 gradient before rounding it.
template <typename T>
void RopeBackward(T* dx, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions, int64_t N,
                  int64_t heads, int64_t D, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
