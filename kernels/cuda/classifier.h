// Softmax cross-entropy on the GPU, as kernels/classifier.h: logits (N, V),
// rows Vp apart (the padding columns are not in the softmax), with integer
// targets (N); the losses are fp32 whatever the logits' type, and the
// gradient is written over the logits in one pass with the loss.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// losses[i] = lse_i - logits[i, targets[i]] (losses may be null); with
// `write_dlogits`, logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss
// for j < V, 0 after; a negative target is ignored (loss 0, gradient row
// 0), as on the CPU. One block of `threads` (a multiple of 32 up to 1024;
// KernelTuning) per row: the row is read once for its log-sum-exp and once
// more for the gradient, which is written in T.
// The kernel (KernelTuning::cross_entropy_kernel): kScalar reads and writes
// one element per thread at a time; kVector 16 bytes (where the logits are
// 16-byte aligned and a row's Vp elements a multiple of 16 bytes, as the
// model's padded vocabulary is; elsewhere kScalar runs). Each sums in a
// fixed order of its own, so each gives the same bits run to run.
enum class CrossEntropyKernel { kScalar = 0, kVector = 1 };

// Whether kVector takes these logits (their alignment and row stride).
bool CrossEntropyTakesVectors(const void* logits, int64_t Vp, size_t element_bytes);

template <typename T>
void CrossEntropy(float* losses, T* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp, cudaStream_t stream, int threads = 512,
                  CrossEntropyKernel kernel = CrossEntropyKernel::kScalar);

}  // namespace pstar::kernels::cuda
