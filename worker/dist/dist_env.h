// The rank's place in the job, from the torchrun-style environment that
// `pstar launch` (or torchrun, or a Kubernetes operator) sets, and the
// communicator built from it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"

namespace pstar {

struct DistEnv {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK: the rank among this node's ranks
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: where rank 0 hosts the store
  int master_port = 29500;                // MASTER_PORT
  std::string rdzv_id = "pstar";          // PSTAR_RDZV_ID: keeps jobs on one store apart
  std::string store_token;                // PSTAR_STORE_TOKEN: the store's shared secret (store.h)
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, PSTAR_RDZV_ID and PSTAR_STORE_TOKEN; unset (or empty) ones keep the defaults
// above. Bad values fail with InvalidArgument naming the variable.
Result<DistEnv> ReadDistEnv();
// The same over any lookup (nullptr: unset), for tests.
Result<DistEnv> ParseDistEnv(const std::function<const char*(const char*)>& lookup);

// Which transport a world of several ranks uses: Gloo over host memory (CPU
// runs), or NCCL over GPU LOCAL_RANK's memory (runtime.device cuda).
enum class Transport { kGloo, kNccl };

// A world of one gets MakeSingleRankCommunicator(); otherwise the rank
// rendezvouses through the Store at MASTER_ADDR:MASTER_PORT (hosted by rank 0)
// and connects a communicator of `transport`, which keeps the Store alive,
// queued (MakeQueuedCommunicator) so that collectives can run under compute.
// `timeout` bounds the rendezvous and every collective step. NCCL fails with
// FailedPrecondition in a build without it.
Result<std::unique_ptr<Communicator>> ConnectCommunicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                          Transport transport = Transport::kGloo);

}  // namespace pstar
