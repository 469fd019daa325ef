// Softmax cross-entropy over logits (N, V) with integer targets (N).
// Forward keeps the logits and stores each row's log-sum-exp; backward turns the
// logits buffer into dlogits in place, so one (N, V) buffer serves both passes.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

// losses[i] = lse_i - logits[i, targets[i]]; lse[i] = log sum_j exp(logits[i, j]).
void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int64_t N, int64_t V);
// logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss.
void CrossEntropyBackwardInPlace(float* logits, const float* lse, const int32_t* targets,
                                 float dloss, int64_t N, int64_t V);

}  // namespace pstar::kernels::cpu
