#include "kernels/adam.h"

#include <cmath>

namespace pstar::kernels::cpu {

void AdamUpdate(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& a) {
  const float step_size = a.lr / a.bias_correction1;
  const float bc2_sqrt = std::sqrt(a.bias_correction2);
  const float decay = 1.0f - a.lr * a.decoupled_weight_decay;
  const float one_minus_b1 = 1.0f - a.beta1;
  const float one_minus_b2 = 1.0f - a.beta2;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float p = param[i];
    float g = grad[i] * a.grad_scale + a.l2_weight_decay * p;
    float m = a.beta1 * exp_avg[i] + one_minus_b1 * g;
    float v = a.beta2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float denom = std::sqrt(v) / bc2_sqrt + a.eps;
    param[i] = p * decay - step_size * (m / denom);
  }
}

}  // namespace pstar::kernels::cpu
