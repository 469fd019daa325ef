// ParamStore: the model's view of its parameters, reached only through the
// ParamLayout and bracketed uses. A Use marks its tensors COMPUTE and is one
// "moment" of the access sequence: the ChunkManager makes the tensors' chunks
// resident on the device for exactly that long, evicting and prefetching
// others. The model never holds a parameter pointer past the op that asked.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/model/param_layout.h"
#include "worker/runtime/chunk_event_log.h"
#include "worker/runtime/chunk_manager.h"
#include "worker/runtime/runtime_counters.h"

namespace pstar {

enum class Pass : uint8_t { kForward, kBackward };

// PatrickStar's tensor states; a chunk may move only while none of its tensors is COMPUTE.
enum class TensorState : uint8_t { kFree, kCompute, kHold, kHoldAfterForward, kHoldAfterBackward };
const char* TensorStateName(TensorState state);

struct AccessRecord {
  int64_t moment;
  TensorId tensor;
  Pass pass;
  bool params = true;  // false: a backward use of the gradients alone (AcquireGrads)
  bool grads = true;   // false: a backward use of the values alone (AcquireParams)
};

// One bracket of the access sequence.
struct AccessMoment {
  std::vector<TensorId> tensors;
  Pass pass;
  bool params = true;  // false: the tensors' gradients alone (AcquireGrads)
  bool grads = true;   // false in the backward pass: the tensors' values alone (AcquireParams)
};

// The most chunks any moment pins: its tensors' param chunks (unless it
// reaches only gradients), plus their grad chunks in the backward pass
// (unless it reaches only values; in all, and of each kind). The device
// budget must hold this many.
struct MomentChunks {
  int32_t total = 0, params = 0, grads = 0;
};
MomentChunks MostChunksPerMoment(const ParamLayout& layout, const std::vector<AccessMoment>& moments);
inline int32_t MaxChunksPerMoment(const ParamLayout& layout, const std::vector<AccessMoment>& moments) {
  return MostChunksPerMoment(layout, moments).total;
}

class ParamStore {
 public:
  class Use;
  class ChunkUpdate;

  // Lays the chunks out in a ChunkManager configured by `options`. With a
  // communicator of N ranks this rank holds shard `rank` of every chunk.
  static Result<std::unique_ptr<ParamStore>> Create(ParamLayout layout,
                                                    std::unique_ptr<DeviceBackend> backend,
                                                    const ChunkRuntimeOptions& options,
                                                    Communicator* comm = nullptr);
  // Everything resident on an emulated device with room for every chunk (tools, tests).
  explicit ParamStore(ParamLayout layout);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamLayout& layout() const { return layout_; }
  ChunkManager& chunks() { return *chunks_; }
  const ChunkManager& chunks() const { return *chunks_; }

  // Brackets one op's use of `tensors`; pointers from the Use stay valid until
  // it is destroyed. In the backward pass the tensors' gradients are reachable
  // (and written) too.
  Use Acquire(std::vector<TensorId> tensors, Pass pass);
  // A backward-pass use of the tensors' gradients alone, for an op that
  // reads none of their values (the embeddings' backward): their param
  // chunks are not made resident for it, which with N ranks spares a gather.
  Use AcquireGrads(std::vector<TensorId> tensors);
  // A backward-pass use of the tensors' values alone, for an op that writes
  // none of their gradients (the classifier's input gradient, whose weight
  // gradient is taken later): their grad chunks are not made resident for it.
  Use AcquireParams(std::vector<TensorId> tensors);

  // Param, grad and both Adam moments of one chunk for its optimizer update, on
  // the device when the hybrid placement put its moments there, else on the host.
  // With `grad_ready` (one rank, a chunk updated on the host), the gradient's
  // copy home is only started: *grad_ready is the event the updating thread
  // waits for before it reads the gradient (null when there is none).
  ChunkUpdate AcquireForUpdate(int32_t chunk, const Event** grad_ready = nullptr);

  // The part of tensor `id` this rank holds: elements [begin, end) of the
  // tensor, at `shard_offset` within the chunk's home shard. Empty when
  // begin == end. With one rank, the whole tensor.
  struct Slice {
    int64_t begin = 0, end = 0, shard_offset = 0;
  };
  Slice OwnedSlice(TensorId id) const;

  // A chunk's home shard, current and writable; its device copy is dropped.
  float* HostShard(StateKind kind, int32_t chunk);
  // A chunk's current shard (or, with one rank, chunk) without moving it,
  // in device memory or on the host (see ChunkManager::Current).
  ChunkManager::CurrentCopy CurrentShard(StateKind kind, int32_t chunk) { return chunks_->Current({kind, chunk}); }
  // As CurrentShard, readable by the host (copied home when it must be).
  const float* PeekShard(StateKind kind, int32_t chunk);

  // A whole tensor's host copy, current and writable; its device copy is
  // dropped (tests, tools). One rank only: with N ranks use OwnedSlice.
  float* TensorData(StateKind kind, TensorId id);
  // The current copy of a whole tensor wherever it lives, for reading. One rank only.
  const float* Peek(StateKind kind, TensorId id);

  // Sets every gradient to zero (start of a step); lazily, without copies.
  void ZeroGrads();
  // Makes every gradient's home shard final (reduce-scatter with N ranks);
  // every rank calls it after the step's last backward pass.
  void FlushGrads() { chunks_->Flush(StateKind::kGrad); }

  // Called when a backward-pass use ends, with each of its tensors' device
  // gradients, in the op's order on the device: rounds gradients kept in 16
  // bits (see ModelKernels::RoundToPrecision). None by default.
  void SetGradientRounding(std::function<void(float* grad, int64_t n)> round) { round_grad_ = std::move(round); }

  // Step boundaries for the chunk trace.
  void BeginStep();
  void EndPhase(StepPhase phase) { chunks_->EndPhase(phase); }
  void EndStep();

  // Param chunks in the order the forward passes since BeginStep first used
  // them, then those they did not use in chunk order: the order the
  // optimizer updates them in, so that the next forward's first chunks are
  // ready first. Chunk order before any forward pass.
  std::vector<int32_t> ForwardChunkOrder() const;

  // Called (with no op holding any chunk) when a backward-pass use ends that
  // was, in the last whole step, the step's last use of its param chunk:
  // the chunk's gradient is then final for this step (its params are not
  // used again either). From the second step on; null (the default) for none.
  void SetGradFinalObserver(std::function<void(int32_t chunk)> observer) { grad_final_ = std::move(observer); }
  // Whether this step used a chunk after its gradient was called final (the
  // step's sequence of uses changed): what was done on that call is then
  // wrong. Cleared by BeginStep.
  bool final_order_broken() const { return final_order_broken_; }

  // Records every op's param chunks (forward and backward uses) as events of
  // the log's current step; null (the default) for none. Not owned.
  void SetEventLog(ChunkEventLog* log) {
    event_log_ = log;
    chunks_->SetEventLog(log);
  }
  ChunkEventLog* event_log() const { return event_log_; }

  TensorState state(TensorId id) const { return states_[size_t(id)]; }
  bool InCompute(TensorId id) const { return compute_refs_[size_t(id)] > 0; }

  // Tensor-level access recording (what the model asked for, in order).
  void SetRecording(bool on) { recording_ = on; }
  const std::vector<AccessRecord>& trace() const { return trace_; }
  void ClearTrace() { trace_.clear(); }
  int64_t moments() const { return moment_; }

  // Bytes of model data this rank holds (home shards of every kind).
  int64_t model_bytes() const;
  int rank() const { return chunks_->rank(); }
  int world_size() const { return chunks_->world_size(); }
  Communicator* comm() const { return chunks_->comm(); }

 private:
  ParamStore(ParamLayout layout, std::unique_ptr<ChunkManager> chunks);
  Use AcquireUse(std::vector<TensorId> ids, Pass pass, bool params, bool grads);
  void Release(const std::vector<TensorId>& tensors, const std::vector<ChunkAccess>& accesses, Pass pass, bool params,
               bool grads, int64_t step_moment);

  ParamLayout layout_;
  std::unique_ptr<ChunkManager> chunks_;
  std::vector<int32_t> compute_refs_;
  std::vector<TensorState> states_;
  bool recording_ = false;
  int64_t moment_ = 0;
  std::vector<AccessRecord> trace_;
  std::function<void(float*, int64_t)> round_grad_;
  std::vector<int32_t> forward_order_;  // param chunks by first forward use since BeginStep
  std::vector<uint8_t> forward_seen_;   // per chunk: in forward_order_
  ChunkEventLog* event_log_ = nullptr;
  // Gradient-final points: this step's Acquire count, each chunk's last use
  // so far (a step moment), the last whole step's, and which fired.
  int64_t step_moment_ = 0;
  bool step_had_backward_ = false;
  std::vector<int64_t> last_use_, final_at_;
  std::vector<uint8_t> final_fired_;
  bool final_order_broken_ = false;
  std::function<void(int32_t)> grad_final_;
};

class ParamStore::Use {
 public:
  Use(Use&& other) noexcept;
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  Use& operator=(Use&&) = delete;
  ~Use();

  // fp32 params (the chunk runtime without param_device).
  float* param(TensorId id) const;
  // 16-bit params (param_device: bf16 and fp16 runs).
  const uint16_t* half_param(TensorId id) const;
  // Only in a backward-pass use that reaches gradients.
  float* grad(TensorId id) const;

 private:
  friend class ParamStore;
  Use(ParamStore* store, std::vector<TensorId> tensors, std::vector<ChunkAccess> accesses, Pass pass, bool params,
      bool grads, int64_t step_moment)
      : store_(store),
        tensors_(std::move(tensors)),
        accesses_(std::move(accesses)),
        pass_(pass),
        params_(params),
        grads_(grads),
        step_moment_(step_moment) {}
  void Check(TensorId id) const;
  void CheckParams(TensorId id) const;

  ParamStore* store_;
  std::vector<TensorId> tensors_;
  std::vector<ChunkAccess> accesses_;
  Pass pass_;
  bool params_;          // false: an AcquireGrads use
  bool grads_;           // false: an AcquireParams use
  int64_t step_moment_;  // the Acquire's place in the step
};

class ParamStore::ChunkUpdate {
 public:
  ChunkUpdate(ChunkUpdate&& other) noexcept;
  ChunkUpdate(const ChunkUpdate&) = delete;
  ChunkUpdate& operator=(const ChunkUpdate&) = delete;
  ChunkUpdate& operator=(ChunkUpdate&&) = delete;
  ~ChunkUpdate();

  // fp32: the param, or with 16-bit param chunks the master.
  float* param() const { return param_; }
  // The gradient: fp32, or (on the host, with 16-bit gradient homes) the
  // 16-bit home in `grad_half()` and null here.
  const float* grad() const { return grad_; }
  const uint16_t* grad_half() const { return grad_half_; }
  float* exp_avg() const { return exp_avg_; }
  float* exp_avg_sq() const { return exp_avg_sq_; }
  Tier tier() const { return tier_; }

 private:
  friend class ParamStore;
  ChunkUpdate() = default;

  ChunkManager* chunks_ = nullptr;  // set while device chunks are pinned
  std::vector<ChunkAccess> accesses_;
  float* param_ = nullptr;
  const float* grad_ = nullptr;
  const uint16_t* grad_half_ = nullptr;
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  Tier tier_ = Tier::kHost;
};

}  // namespace pstar
