// Token + position embedding on the GPU, as kernels/encoder.h: wte (V, C),
// wpe (maxT, C) or none (null: rotary models), out (B, T, C).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos,:], pos = positions[b*T+t]
// (null: t), added in fp32 and rounded once to T (in a 16-bit run the tables
// are its 16-bit param chunks and out its 16-bit residual stream).
template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C, cudaStream_t stream);

// A vocabulary table in row parts: `part` holds table rows [row0, row0 +
// rows). Writes the rows of out whose tokens are in the part (their part
// rows, no position table) and leaves the others: the parts in turn give
// EncoderForward's bits over the whole table.
template <typename T>
void EncoderPartForward(T* out, const int32_t* tokens, const T* part, int64_t row0, int64_t rows, int64_t B,
                        int64_t Tlen, int64_t C, cudaStream_t stream);

// Elements of int32 scratch EncoderBackward and EncoderPartBackward need (0 when it needs none).
int64_t EncoderBackwardScratchElements(int64_t B, int64_t Tlen);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[pos,:] += dout[b,t,:] (dwpe
// null: none; pos as in EncoderForward). Deterministic: every row's sum is
// taken in (b, t) order, with no atomics, so runs give the same bits.
template <typename T>
void EncoderBackward(T* dwte, T* dwpe, int32_t* scratch, const T* dout, const int32_t* tokens,
                     const int32_t* positions, int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream);

// dpart's rows of the tokens in the part += their dout rows, each in (b, t)
// order as EncoderBackward adds them: the parts in turn give its bits.
template <typename T>
void EncoderPartBackward(T* dpart, int32_t* scratch, const T* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                         int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
