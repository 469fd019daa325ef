#include "worker/dist/collective_replay.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace pstar {

Result<ReplayResult> ReplayCollectives(Communicator& comm, const std::vector<CollectiveCall>& calls, int repeats) {
  if (repeats < 1) return Status::InvalidArgument("collective replay: at least one repeat");
  const int64_t world = comm.world_size();
  int64_t largest = 0;
  for (const CollectiveCall& c : calls) {
    if (c.op != CollectiveOp::kAllGather && c.op != CollectiveOp::kReduceScatter) {
      return Status::InvalidArgument(std::string("collective replay: cannot replay ") + CollectiveOpName(c.op));
    }
    if (c.shard_elems < 0) return Status::InvalidArgument("collective replay: a negative shard size");
    largest = std::max(largest, c.shard_elems);
  }
  // Zeros: a reduce-scatter of them sums to zeros, nothing overflows.
  std::vector<float> full(size_t(largest * world), 0.0f), shard(size_t(largest), 0.0f);
  auto sent = [&] {
    int64_t b = 0;
    for (const auto& x : comm.counters().bytes) b += x.load();
    return b;
  };
  PSTAR_RETURN_IF_ERROR(comm.Barrier().WithPrefix("collective replay"));
  const int64_t sent_before = sent();
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    for (const CollectiveCall& c : calls) {
      Status s = c.op == CollectiveOp::kAllGather ? comm.AllGather(shard.data(), full.data(), c.shard_elems)
                 : c.half ? comm.ReduceScatterHalf(reinterpret_cast<const uint16_t*>(full.data()),
                                                   reinterpret_cast<uint16_t*>(shard.data()), c.shard_elems,
                                                   HalfFormat::kBf16)
                          : comm.ReduceScatter(full.data(), shard.data(), c.shard_elems);
      PSTAR_RETURN_IF_ERROR(s.WithPrefix("collective replay"));
    }
  }
  ReplayResult result;
  result.seconds_per_repeat =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / double(repeats);
  result.payload_bytes = (sent() - sent_before) / repeats;
  return result;
}

}  // namespace pstar
