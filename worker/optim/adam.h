// Adam and AdamW over every tensor of a ParamStore, one kernel call per
// contiguous span of a chunk, on whichever tier the hybrid placement chose.
// Weight decay applies only to weights and embeddings, never to biases or norms.
#pragma once

#include <cstdint>

#include "worker/model/model_kernels.h"
#include "worker/model/param_store.h"

namespace pstar {

struct AdamConfig {
  bool decoupled_weight_decay = true;  // AdamW; false = Adam with L2 in the gradient
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamOptimizer {
 public:
  explicit AdamOptimizer(AdamConfig config) : config_(config) {}

  // One update of every parameter from its gradient times `grad_scale`
  // (clipping and loss-scale unscaling fused into the update).
  void Step(ParamStore& store, float lr, float grad_scale);

  int64_t steps_taken() const { return step_; }
  // Restores the step count (bias correction) from a checkpoint.
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  AdamConfig config_;
  int64_t step_ = 0;
};

// L2 norm of the gradients as stored (padding excluded), summed in a fixed
// order; with N ranks, of the summed gradients, all-reduced over the ranks.
// Gradients current in GPU memory are summed there by `ops` (one wait),
// the rest on the host, so nothing moves for the norm; both sum in the same
// order, so the norm's bits do not depend on the device budget.
Result<double> GradientNorm(ParamStore& store, ModelKernels& ops);

// PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping off).
float ClipCoefficient(double norm, float max_norm);

}  // namespace pstar
