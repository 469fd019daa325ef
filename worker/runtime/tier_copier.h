// TierCopier: the copies between a chunk's host home and its device slot, in
// every form the runtime uses: plain, 16-bit (gradients widened up and
// narrowed home, params narrowed from their fp32 master on the host or on
// the device) and, with N ranks, each rank's shard all-gathered into the
// slot and the ranks' partial gradients reduce-scattered into the home
// shards. Copies are queued on the copy streams in order with the slot's
// events; each move is told to the move observer and counted. The chunk
// manager decides what moves and when; this unit knows how.
//
// With N ranks a move is a collective started on the communicator
// (Communicator::Start): the methods return its ticket, and the slot and the
// home it reads or writes are the caller's to leave alone until it is done.
// On a GPU the started work first waits for the copies queued before it (an
// event of its own), so the host never waits to start one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/core/status.h"
#include "worker/dist/collective_replay.h"
#include "worker/dist/communicator.h"
#include "worker/runtime/chunk_event_log.h"
#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_runtime_options.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/device_tier.h"
#include "worker/runtime/host_tier.h"
#include "worker/runtime/runtime_counters.h"

namespace pstar {

// Watches the copies between the tiers (the training profiler). BeginMove is
// called just before a copy of `direction` is issued on its copy stream (with
// N ranks: before the copy and collective that make up the move), EndMove
// just after, with the token BeginMove returned and the bytes this rank moved.
class MoveObserver {
 public:
  virtual ~MoveObserver() = default;
  virtual int64_t BeginMove(Direction direction) = 0;
  virtual void EndMove(int64_t token, Direction direction, int64_t bytes) = 0;
};

class TierCopier {
 public:
  // `backend`, `comm` (null for one rank) and `counters` must outlive it;
  // `chunk_bytes` is the slot stride.
  static Result<std::unique_ptr<TierCopier>> Create(DeviceBackend& backend, Communicator* comm,
                                                    const ChunkPlacement& placement, int64_t chunk_bytes,
                                                    const ChunkRuntimeOptions& options, RuntimeCounters* counters);

  // The chunk's home into `slot` (whose earlier users the h2d stream already
  // waits for): copied, widened from 16 bits, or (N ranks) its shard
  // gathered with every rank's (the ticket of that gather; 0 with one rank).
  CollectiveTicket LoadHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host);
  // A 16-bit param copy into `slot`: the master narrowed on the device (homed
  // there) or on the host (then copied up, half the bytes moved); with N
  // ranks each narrows its shard and the shards are gathered (its ticket).
  CollectiveTicket LoadHalfParam(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host);
  // The device copy in `slot` home: copied, narrowed to 16 bits, or (N
  // ranks, gradients) reduce-scattered and added to the home shard, which
  // `home_zero` says holds zeros (then the sum replaces it, and it is reset):
  // the ticket of that reduce-scatter, whose work ends with the home's sum.
  CollectiveTicket WriteHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host, bool& home_zero);
  // The end of the last copy into the chunk's host home (d2h stream): the
  // host touches the home, and a load copies from it, only after it.
  Event& home_written(int32_t index) { return *home_written_[size_t(index)]; }

  void SetMoveObserver(MoveObserver* observer) { move_observer_ = observer; }
  // Appends every collective started from now on to `log` (null: stop).
  void SetCallLog(std::vector<CollectiveCall>* log) { call_log_ = log; }
  // Records each collective's begin and end (on the communicator's thread)
  // in `log`; null for none. Not owned.
  void SetEventLog(ChunkEventLog* log) { event_log_ = log; }

 private:
  TierCopier(DeviceBackend& backend, Communicator* comm, const ChunkPlacement& placement, int64_t chunk_bytes,
             const ChunkRuntimeOptions& options, RuntimeCounters* counters);
  int64_t BeginMove(Direction d) { return move_observer_ != nullptr ? move_observer_->BeginMove(d) : -1; }
  void EndMove(int64_t token, Direction d, int64_t bytes) {
    if (move_observer_ != nullptr) move_observer_->EndMove(token, d, bytes);
  }
  void CountMove(int32_t index, Direction direction, int64_t bytes);
  // A failed collective ends the process (the design's lost-peer rule).
  void CheckCollective(const Status& status) const;
  // Starts `work` once the device work queued on `stream` so far is done
  // (GPU: the started work waits for an event of a small ring, each reused
  // only after the work that waited for it).
  CollectiveTicket StartAfter(StreamKind stream, std::function<Status(Communicator&)> work);
  // The all-gather of 16-bit shards of `shard` values each into `dst`
  // (logged as started).
  std::function<Status(Communicator&)> GatherHalf(const uint16_t* own, uint16_t* dst, int64_t shard);
  // `work`, the collective of placement index `index`, between its begin and
  // end events when an event log is attached.
  std::function<Status(Communicator&)> Traced(int32_t index, std::function<Status(Communicator&)> work);

  DeviceBackend& backend_;
  Communicator* comm_;
  const ChunkPlacement placement_;
  const int64_t chunk_bytes_;
  const int world_, rank_;
  const int64_t shard_bytes_;
  const ChunkRuntimeOptions options_;
  RuntimeCounters* counters_;
  MoveObserver* move_observer_ = nullptr;
  std::vector<CollectiveCall>* call_log_ = nullptr;
  ChunkEventLog* event_log_ = nullptr;
  void LogCall(CollectiveOp op, int64_t shard_elems, bool half = false) {
    if (call_log_ != nullptr) call_log_->push_back({op, shard_elems, half});
  }
  // With N ranks, the work of a 16-bit gradient's reduce-scatter: the
  // slot's partials narrowed (exactly: the model keeps them 16-bit values)
  // into `staging`, reduce-scattered in 16 bits, and added to the 16-bit
  // home (replacing it when `replace`), rounded once more.
  Status ReduceHalfHome(Communicator& c, const float* src, uint16_t* staging, uint16_t* home, bool replace);
  std::vector<std::unique_ptr<Event>> home_written_;
  // One shard of host memory (pinned on a GPU) for reduce-scatter results, with N > 1 ranks.
  MemoryBlock scratch_;
  // Pinned host buffers params are narrowed into before they go up (GPU,
  // half_params), used in turn; each waits for its last copy before reuse.
  MemoryBlock param_staging_;
  std::unique_ptr<Event> param_staged_[2];
  int param_staging_next_ = 0;
  std::unique_ptr<Event> compute_done_;
  // StartAfter's events and the ticket that last waited for each; and the
  // event the communicator's thread orders its own copies with.
  std::vector<std::unique_ptr<Event>> start_events_;
  std::vector<CollectiveTicket> start_event_tickets_;
  size_t next_start_event_ = 0;
  std::unique_ptr<Event> comm_copied_;
};

}  // namespace pstar
