// ChunkEventLog: what happened to which chunk, in the order it happened, from
// every thread of a rank (the step's, and the optimizer's update thread).
// It is how a run shows its overlap: a chunk's next-forward use after its own
// update, the forward under way before the last update ends, updates during
// backward, and with N ranks each chunk's collectives against the compute. Off unless a caller attaches one (tests, `pstar train
// --chunk-events`); recording takes a lock, so it is not for hot loops of
// many thousand chunks per millisecond.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

enum class ChunkEventKind : uint8_t {
  kStepBegin,      // chunk -1
  kForwardUse,     // an op pinned the chunk's params in a forward pass
  kBackwardUse,    // ... in a backward pass (its gradients too)
  kGradFinal,      // the chunk's gradient is final for this step (its home current)
  kUpdateBegin,    // the optimizer began the chunk's update
  kUpdateEnd,      // ... and finished it
  kUpdateUndone,   // a speculative update was rolled back (it is redone or skipped)
  kUpdateWait,     // the step's thread waited for the chunk's update
  kStepEnd,        // chunk -1: the step's thread is done (updates may still run)
  // With N ranks, on the communicator's thread: the chunk's param all-gather
  // and its gradient reduce-scatter (into the home shard) ran between these.
  kGatherBegin,
  kGatherEnd,
  kReduceScatterBegin,
  kReduceScatterEnd,
};
const char* ChunkEventKindName(ChunkEventKind kind);

struct ChunkEvent {
  int64_t seq = 0;        // order of recording, over all threads
  int64_t step = 0;       // the training step (0-based) the event belongs to
  ChunkEventKind kind = ChunkEventKind::kStepBegin;
  int32_t chunk = -1;
  double time_s = 0.0;    // since the log was made
};

class ChunkEventLog {
 public:
  ChunkEventLog() : start_(std::chrono::steady_clock::now()) {}
  void Record(int64_t step, ChunkEventKind kind, int32_t chunk = -1);
  // The training step the step's thread is in (what its events are recorded under).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // Called with every event after it is recorded, on the recording thread,
  // outside the log's lock (tests use it to hold one thread at a point).
  void SetListener(std::function<void(const ChunkEvent&)> listener) { listener_ = std::move(listener); }
  // A copy of every event so far, in recording order.
  std::vector<ChunkEvent> Events() const;
  // The events as CSV (seq,step,event,chunk,time_s), one line each.
  std::string ToCsv() const;
  Status WriteCsv(const std::string& path) const;

 private:
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> step_{0};
  mutable std::mutex mu_;
  std::vector<ChunkEvent> events_;
  std::function<void(const ChunkEvent&)> listener_;
};

}  // namespace pstar
