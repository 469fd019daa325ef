// Collective replay: a step's collectives run again without its compute,
// what "communication alone" means for the overlap figures (pstar train
// --comm-alone). The chunk runtime records the calls of one step (op and
// shard size, in order); every rank replays the same list on scratch
// buffers, so the ranks meet in the same collectives as in the step.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"

namespace pstar {

// One collective as the runtime started it: all-gather or reduce-scatter of
// `shard_elems` floats (or 16-bit values) per rank.
struct CollectiveCall {
  CollectiveOp op = CollectiveOp::kAllGather;
  int64_t shard_elems = 0;
  bool half = false;  // a reduce-scatter of 16-bit values (ReduceScatterHalf)
};

struct ReplayResult {
  double seconds_per_repeat = 0.0;  // wall time of one pass over the calls
  int64_t payload_bytes = 0;        // this rank's sent bytes in one pass
};

// Runs `calls` in order, `repeats` times, each call waited for before the
// next (the collectives one after another, as the network carries them), after
// a barrier. Every rank must pass the same calls. Fails on the first failed
// collective, or on an op other than all-gather and reduce-scatter.
Result<ReplayResult> ReplayCollectives(Communicator& comm, const std::vector<CollectiveCall>& calls, int repeats);

}  // namespace pstar
