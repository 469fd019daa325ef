// Adam and AdamW over every tensor of a ParamStore, one kernel call per
// contiguous span of a chunk, on whichever tier the hybrid placement chose.
// Weight decay applies only to weights and embeddings, never to biases or norms.
#pragma once

#include <cstdint>
#include <vector>
#include <span>
#include <utility>

#include "kernels/adam.h"
#include "worker/model/model_kernels.h"
#include "worker/model/param_store.h"
#include "worker/optim/async_updater.h"

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
  // A run of tensors of one chunk with one weight decay, contiguous in this
  // rank's shard: elements [begin, end).
  struct Span {
    int64_t begin, end;
    bool decayed;
  };

  explicit AdamOptimizer(AdamConfig config) : config_(config) {}

  // One update of every parameter from its gradient times `grad_scale`
  // (clipping and loss-scale unscaling fused into the update), chunk by
  // chunk in `order` (every chunk once; empty: chunk order). With `async`,
  // the chunks that update in host memory (not on a GPU, not homed on disk)
  // are queued on it and may still be running when Step returns: the
  // ChunkManager's host fence (which the caller sets to async's Wait) makes
  // every later use of a chunk wait for its own update. The bits are those
  // of a synchronous update either way.
  // Chunks marked in `done` (speculated, see below) are left out.
  void Step(ParamStore& store, float lr, float grad_scale, AsyncUpdater* async = nullptr,
            std::span<const int32_t> order = {}, const std::vector<uint8_t>* done = nullptr);

  // Speculation: a chunk's update of the coming Step, started as soon as its
  // gradient is final (during the backward pass), before the gradient norm
  // and the loss scaler have said whether the step clips or skips. It runs
  // with `grad_scale` as if neither did; if one does, Undo puts the chunk
  // back and the Step updates it again with the right scale (or not at all).
  //
  // Whether chunk `chunk` can be speculated: one rank, updated on the host,
  // nothing of it homed on disk (whose windows the manager owns).
  static bool Speculable(const ParamStore& store, int32_t chunk);
  // Where a speculated chunk's param (or master) and moments are saved before
  // they are overwritten: one shard each.
  struct UndoSlot {
    float* param;
    float* exp_avg;
    float* exp_avg_sq;
  };
  // Queues chunk `chunk`'s update of the coming Step on `async`, which first
  // waits for the gradient's copy home and saves the chunk into `undo`.
  void Speculate(ParamStore& store, int32_t chunk, float lr, float grad_scale, const UndoSlot& undo,
                 AsyncUpdater& async);
  // Puts a speculated chunk back as `undo` holds it (its update has ended).
  void Undo(ParamStore& store, int32_t chunk, const UndoSlot& undo);

  // Host seconds of chunk updates run on the calling thread (not queued),
  // since the last call.
  double TakeHostSeconds() { return std::exchange(host_seconds_, 0.0); }

  int64_t steps_taken() const { return step_; }
  // Restores the step count (bias correction) from a checkpoint.
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  // This rank's part of a chunk as runs of tensors with one weight decay,
  // each contiguous in the shard (see Span); made on first use.
  const std::vector<Span>& SpansOf(const ParamStore& store, int32_t chunk);
  // The kernel's parameters for update number `step` (1-based: bias correction).
  kernels::cpu::AdamParams ParamsFor(int64_t step, float lr, float grad_scale) const;

  AdamConfig config_;
  int64_t step_ = 0;
  std::vector<std::vector<Span>> spans_;  // per chunk, made on first use
  double host_seconds_ = 0.0;
};

// What a training step reads back from the device once its gradients are
// final, in one wait (ModelKernels::TakeStepSums).
struct StepSums {
  // The sum of the squares of this rank's gradient shards as stored (padding
  // excluded), in a fixed order: the global norm is the square root of its
  // sum over ranks. Gradients current in GPU memory are summed there, the
  // rest on the host, so nothing moves for it; both sum in the same order,
  // so its bits do not depend on the device budget.
  double grad_squares = 0.0;
  // The model's loss accumulator since the last take (then reset to zero).
  double loss_sum = 0.0;
};
StepSums TakeStepSums(ParamStore& store, ModelKernels& ops);

// PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6));
// 1 when max_norm <= 0 (clipping off).
float ClipCoefficient(double norm, float max_norm);

}  // namespace pstar
