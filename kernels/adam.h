// Adam / AdamW update of one contiguous span, matching PyTorch's formulas:
//   g  = grad * grad_scale (+ l2 * p for coupled Adam)
//   p *= 1 - lr * decoupled_wd
//   m  = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

struct AdamParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decoupled_weight_decay;  // AdamW
  float l2_weight_decay;         // classic Adam (added to the gradient)
  float grad_scale;              // unscale x clip coefficient, fused
  float bias_correction1;        // 1 - beta1^step
  float bias_correction2;        // 1 - beta2^step
};

void AdamUpdate(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& p);

}  // namespace pstar::kernels::cpu
