// Causal multi-head self-attention on the GPU, same layout as
// kernels/attention.h: qkv (B, T, 3C) holds q | k | v, head h at columns
// h*hs of each third; att (B, NH, T, T) keeps the softmax probabilities
// (zero above the diagonal); out (B, T, C). The GEMMs go through cuBLAS(Lt);
// softmax statistics are fp32.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"

namespace pstar::kernels::cuda {

// Elements of T the passes need as scratch (permuted q, k, v and the like),
// carved by the caller with the other activations.
int64_t AttentionScratchElements(int64_t B, int64_t T, int64_t C, int64_t NH);

template <typename T>
void AttentionForward(BlasContext& blas, T* out, T* att, T* scratch, const T* qkv, int64_t B,
                      int64_t Tlen, int64_t C, int64_t NH, cudaStream_t stream);

// dqkv is overwritten; datt is scratch of att's size.
template <typename T>
void AttentionBackward(BlasContext& blas, T* dqkv, T* datt, T* scratch, const T* dout, const T* qkv,
                       const T* att, int64_t B, int64_t Tlen, int64_t C, int64_t NH,
                       cudaStream_t stream);

}  // namespace pstar::kernels::cuda
