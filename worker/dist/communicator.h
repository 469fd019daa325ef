// Communicator: the collectives ZeRO needs, over a fixed group of ranks. Gloo
// (TCP) serves CPU runs, NCCL GPU runs; a world of one needs no transport.
// Every collective has a timeout: a lost or stalled peer fails the call with a
// Status that names the peer (when the transport can tell) instead of hanging.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "worker/core/status.h"

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
  // data = element-wise sum over ranks, in place.
  virtual Status AllReduceSum(double* data, int64_t n) = 0;
  // bytes of `data` from `root` to every rank.
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  virtual Status Barrier() = 0;

  const CollectiveCounters& counters() const { return counters_; }

 protected:
  CollectiveCounters counters_;
};

// A world of one rank: gathers and scatters are copies, reductions identities.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

}  // namespace pstar
