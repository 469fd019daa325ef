#include "worker/optim/adam.h"

#include <cmath>

#include "kernels/adam.h"
#include "kernels/reduce.h"

namespace pstar {

void AdamOptimizer::Step(ParamStore& store, float lr, float grad_scale) {
  ++step_;
  kernels::cpu::AdamParams p{};
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.grad_scale = grad_scale;
  p.bias_correction1 = float(1.0 - std::pow(double(config_.beta1), double(step_)));
  p.bias_correction2 = float(1.0 - std::pow(double(config_.beta2), double(step_)));
  const ParamLayout& layout = store.layout();
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    float* param = store.ChunkData(StateKind::kParam, c);
    const float* grad = store.ChunkData(StateKind::kGrad, c);
    float* m = store.ChunkData(StateKind::kExpAvg, c);
    float* v = store.ChunkData(StateKind::kExpAvgSq, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const TensorSpec& spec = layout.spec(id);
      const int64_t off = layout.placement(id).offset;
      float wd = spec.decayed() ? config_.weight_decay : 0.0f;
      p.decoupled_weight_decay = config_.decoupled_weight_decay ? wd : 0.0f;
      p.l2_weight_decay = config_.decoupled_weight_decay ? 0.0f : wd;
      kernels::cpu::AdamUpdate(param + off, grad + off, m + off, v + off, spec.numel(), p);
    }
  }
}

double GradientNorm(const ParamStore& store) {
  const ParamLayout& layout = store.layout();
  double sum = 0.0;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    sum += kernels::cpu::SumOfSquares(store.TensorData(StateKind::kGrad, id), layout.spec(id).numel());
  }
  return std::sqrt(sum);
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace pstar
