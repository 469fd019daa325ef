// Softmax cross-entropy on the GPU, as kernels/classifier.h: logits (N, V),
// rows Vp apart (the padding columns are not in the softmax), with integer
// targets (N); the losses are fp32 whatever the logits' type, and the
// gradient is written over the logits in one pass with the loss.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// losses[i] = lse_i - logits[i, targets[i]] (losses may be null); with
// `write_dlogits`, logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss
// for j < V, 0 after. One block of `threads` (a multiple of 32 up to 1024;
// KernelTuning) per row: the row is read once for its log-sum-exp and once
// more for the gradient, which is written in T.
template <typename T>
void CrossEntropy(float* losses, T* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp, cudaStream_t stream, int threads = 512);

}  // namespace pstar::kernels::cuda
