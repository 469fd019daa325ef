// Softmax cross-entropy on the GPU, as kernels/classifier.h: logits (N, V),
// rows Vp apart (the padding columns are not in the softmax), with integer
// targets (N); losses and log-sum-exps are fp32 whatever the
// logits' type. Backward turns the logits into dlogits in place.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// losses[i] = lse_i - logits[i, targets[i]]; lse[i] = log sum_j exp(logits[i, j]).
template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N,
                         int64_t V, int64_t Vp, cudaStream_t stream);

// logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss for j < V, 0 after.
template <typename T>
void CrossEntropyBackwardInPlace(T* logits, const float* lse, const int32_t* targets, float dloss,
                                 int64_t N, int64_t V, int64_t Vp, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
