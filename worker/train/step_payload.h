// StepPayload: the collective payload one step of a job sends per rank,
// counted exactly by running the job's own chunk traffic (pstar plan
// --payload). Every rank of a ZeRO job makes the same chunk decisions, so
// rank 0 alone shows them: it trains a few steps on generated tokens with a
// communicator that stands in for the other ranks (their shards are copies
// of its own), and the bytes its gathers and reduce-scatters would send are
// counted as the ring collectives count them. Which chunks move depends on
// the device budget, the trace and the eviction, not on the numbers.
#pragma once

#include <cstdint>

#include "worker/config/config.h"
#include "worker/core/status.h"

namespace pstar {

struct StepPayload {
  int64_t all_gather_bytes = 0;      // per rank, the last step
  int64_t reduce_scatter_bytes = 0;  // per rank, the last step
  int64_t steps = 0;                 // steps run
  bool steady = false;               // the last two steps sent the same
};

// `config` must be a CPU job; `world_size` at least 2; `steps` at least 2.
// Runs with the job's batch, budget and options (its own time and memory:
// a rank's worth of the job).
Result<StepPayload> SimulateStepPayload(const Config& config, int world_size, int steps = 4);

}  // namespace pstar
