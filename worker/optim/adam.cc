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
    // This rank's slices of the chunk's tensors lie back to back in its shard,
    // so each run with the same weight decay is one contiguous span and one
    // kernel call.
    const std::vector<TensorId>& tensors = layout.chunk_tensors(c);
    size_t first = 0;
    while (first < tensors.size()) {
      const ParamStore::Slice s = store.OwnedSlice(tensors[first]);
      if (s.begin == s.end) {
        ++first;
        continue;
      }
      const bool decayed = layout.spec(tensors[first]).decayed();
      const int64_t begin = s.shard_offset;
      int64_t end = begin + (s.end - s.begin);
      size_t last = first + 1;
      while (last < tensors.size() && layout.spec(tensors[last]).decayed() == decayed) {
        const ParamStore::Slice next = store.OwnedSlice(tensors[last]);
        if (next.begin == next.end || next.shard_offset != end) break;
        end += next.end - next.begin;
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

Result<double> GradientNorm(ParamStore& store) {
  const ParamLayout& layout = store.layout();
  double sum = 0.0;
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    const float* shard = store.PeekShard(StateKind::kGrad, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const ParamStore::Slice s = store.OwnedSlice(id);
      sum += kernels::cpu::SumOfSquares(shard + s.shard_offset, s.end - s.begin);
    }
  }
  if (store.world_size() > 1) PSTAR_RETURN_IF_ERROR(store.comm()->AllReduceSum(&sum, 1));
  return std::sqrt(sum);
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace pstar
