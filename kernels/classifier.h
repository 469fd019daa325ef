// Softmax cross-entropy over logits (N, V) with integer targets (N), loss and
// gradient in one pass. Rows are Vp >= V apart: columns V..Vp-1 pad the
// vocabulary for the GEMMs and are not part of the softmax. The gradient is
// written over the logits (zero in the padding), so one (N, Vp) buffer holds
// the logits and then dlogits: the classifier keeps no other copy.
#ifndef PSTAR_KERNELS_CLASSIFIER_H_
#define PSTAR_KERNELS_CLASSIFIER_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_CLASSIFIER_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

// losses[i] = log sum_j exp(logits[i, j]) - logits[i, targets[i]] (losses
// may be null: the gradient only). With `write_dlogits`, then
// logits[i, j] <- (softmax_ij - [j == targets[i]]) * dloss for j < V, 0 after.
// A negative target marks a position the loss ignores (a prompt's token, a
// packed row's padding): its loss is 0 and its gradient row all zeros.
void CrossEntropy(float* losses, float* logits, const int32_t* targets, float dloss, bool write_dlogits,
                  int64_t N, int64_t V, int64_t Vp);
// The same over 16-bit logits (bf16, or fp16 when !bf16): each row widened
// exactly, computed as above, the gradient rounded to the logits' type.
void CrossEntropy(float* losses, uint16_t* logits, bool bf16, const int32_t* targets, float dloss,
                  bool write_dlogits, int64_t N, int64_t V, int64_t Vp);

}  // namespace pstar::kernels::cpu
