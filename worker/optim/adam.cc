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
    ParamStore::ChunkUpdate u = store.AcquireForUpdate(c);
    // Tensors are packed back to back, so each run of tensors with the same
    // weight decay is one contiguous span and one kernel call.
    const std::vector<TensorId>& tensors = layout.chunk_tensors(c);
    for (size_t first = 0; first < tensors.size();) {
      const bool decayed = layout.spec(tensors[first]).decayed();
      const int64_t begin = layout.placement(tensors[first]).offset;
      int64_t end = begin + layout.spec(tensors[first]).numel();
      size_t last = first + 1;
      while (last < tensors.size() && layout.spec(tensors[last]).decayed() == decayed &&
             layout.placement(tensors[last]).offset == end) {
        end += layout.spec(tensors[last]).numel();
        ++last;
      }
      const float wd = decayed ? config_.weight_decay : 0.0f;
      p.decoupled_weight_decay = config_.decoupled_weight_decay ? wd : 0.0f;
      p.l2_weight_decay = config_.decoupled_weight_decay ? 0.0f : wd;
      kernels::cpu::AdamUpdate(u.param() + begin, u.grad() + begin, u.exp_avg() + begin,
                               u.exp_avg_sq() + begin, end - begin, p);
      first = last;
    }
  }
}

double GradientNorm(ParamStore& store) {
  const ParamLayout& layout = store.layout();
  double sum = 0.0;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    sum += kernels::cpu::SumOfSquares(store.Peek(StateKind::kGrad, id), layout.spec(id).numel());
  }
  return std::sqrt(sum);
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace pstar
