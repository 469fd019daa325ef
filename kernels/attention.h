// Causal multi-head self-attention.
// qkv (B, T, 3C) holds q | k | v, head h at columns h*hs of each third (hs = C/NH).
// att (B, NH, T, T) keeps the softmax probabilities for backward; entries above
// the diagonal are zero. out (B, T, C).
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

void AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH);
// dqkv is overwritten; datt is scratch of att's size.
void AttentionBackward(float* dqkv, float* datt, const float* dout, const float* qkv,
                       const float* att, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace pstar::kernels::cpu
