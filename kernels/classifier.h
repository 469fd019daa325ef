// Softmax cross-entropy over logits (N, V) with integer targets (N). Rows are
// Vp >= V apart: columns V..Vp-1 pad the vocabulary for the GEMMs and are not
// part of the softmax. Forward keeps the logits and stores each row's
// log-sum-exp; backward turns the logits buffer into dlogits in place (zero in
// the padding), so one (N, Vp) buffer serves both passes.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

// losses[i] = lse_i - logits[i, targets[i]]; lse[i] = log sum_j exp(logits[i, j]).
void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t Vp);
// logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss for j < V, 0 after.
void CrossEntropyBackwardInPlace(float* logits, const float* lse, const int32_t* targets,
                                 float dloss, int64_t N, int64_t V, int64_t Vp);

}  // namespace pstar::kernels::cpu
