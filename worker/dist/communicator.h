// Communicator: the collectives ZeRO needs, over a fixed group of ranks. Gloo
// (TCP) serves CPU runs, NCCL GPU runs; a world of one needs no transport.
// Every collective has a timeout: a lost or stalled peer fails the call with a
// Status that names the peer (when the transport can tell) instead of hanging.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "worker/core/status.h"
#include "worker/runtime/half_format.h"

namespace pstar {

enum class CollectiveOp : int { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
inline constexpr int kNumCollectiveOps = 5;
inline const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kBarrier: return "barrier";
  }
  return "?";
}

// A unit of work started with Communicator::Start; 0 names none (done).
using CollectiveTicket = int64_t;

// Per op: calls, payload bytes this rank sent, and seconds spent (totals).
struct CollectiveCounters {
  std::array<std::atomic<int64_t>, kNumCollectiveOps> calls{};
  std::array<std::atomic<int64_t>, kNumCollectiveOps> bytes{};
  std::array<std::atomic<int64_t>, kNumCollectiveOps> nanoseconds{};
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether AllGather and ReduceScatter take GPU memory (NCCL) rather than
  // host memory (Gloo, one rank). The scalar collectives always take host memory.
  virtual bool device_buffers() const { return false; }

  // full[r * shard_elems, (r + 1) * shard_elems) = shard of rank r. `shard` may
  // alias its own place in `full`.
  virtual Status AllGather(const float* shard, float* full, int64_t shard_elems) = 0;
  // shard = sum over ranks of their full[rank * shard_elems, ...). The sum is
  // taken in the same order on every call for a given world size. `shard`
  // may alias this rank's own place in `full`.
  virtual Status ReduceScatter(const float* full, float* shard, int64_t shard_elems) = 0;
  // The same over 16-bit values of `format` (train.grad_precision: 16bit
  // with N ranks): each partial sum is taken in fp32 and rounded to the
  // format before it travels on, so half the bytes cross the network at
  // the cost of one rounding per ring step (N-1 in all). The order is
  // ReduceScatter's. Not every communicator has it (FailedPrecondition).
  virtual Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t shard_elems, HalfFormat format);
  // data = element-wise sum over ranks, in place.
  virtual Status AllReduceSum(double* data, int64_t n) = 0;
  // bytes of `data` from `root` to every rank.
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  virtual Status Barrier() = 0;

  // Collectives under compute. Start runs `work` after everything called or
  // started on this communicator before it and returns a ticket for it;
  // `work` calls collectives directly on the communicator it is given. Every
  // rank must start the same collectives in the same order, as with the
  // direct calls. Here (the base) the work runs at once, on the caller's
  // thread; a queued communicator (MakeQueuedCommunicator) runs it on a
  // thread of its own and returns before it is done.
  virtual CollectiveTicket Start(std::function<Status(Communicator&)> work);
  // Returns once the work of `ticket`, and of every ticket before it, is
  // done: OK, or the communicator's first failure if that came no later.
  virtual Status Wait(CollectiveTicket ticket);
  // Whether the work of `ticket` is done, without waiting.
  virtual bool Done(CollectiveTicket ticket) { return ticket <= started_; }
  // Whether Start returns before its work is done.
  virtual bool queued() const { return false; }

  virtual const CollectiveCounters& counters() const { return counters_; }
  // Nanoseconds callers have waited for collectives (totals): the part of
  // their time that nothing overlapped. Here every call waits for its own,
  // so it is all of it.
  virtual int64_t waited_nanoseconds() const;

 protected:
  CollectiveCounters counters_;

 private:
  // The base Start's bookkeeping: tickets given, and the first failure.
  CollectiveTicket started_ = 0;
  CollectiveTicket failed_at_ = 0;
  Status failure_;
};

// `inner` with its collectives, direct calls and started work alike, run on
// one thread of the communicator's own, in the order they came: Start returns
// at once, a direct call waits for everything before it and then its own
// collective. So a rank's step can queue all-gathers ahead and
// reduce-scatters behind while it computes, and every caller (the step, the
// optimizer's norm, a checkpoint's verdict) still shares one order of
// collectives with the other ranks. Destruction waits for the queue.
std::unique_ptr<Communicator> MakeQueuedCommunicator(std::unique_ptr<Communicator> inner);

// A world of one rank: gathers and scatters are copies, reductions identities.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

}  // namespace pstar
