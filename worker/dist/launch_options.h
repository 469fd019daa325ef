// What `pstar launch` parses and the environment it gives each rank it forks.
// The process supervision itself lives in the CLI (worker/cli/launch_command.cc).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

struct LaunchOptions {
  int nproc_per_node = 0;  // required
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string rdzv_id = "pstar";
  // torchrun's --standalone: one node, rendezvous on 127.0.0.1 at a port the
  // launcher picks free (master_port is then 0 until it does).
  bool standalone = false;
  // PSTAR_STORE_TOKEN for the ranks when non-empty (the launcher makes one
  // for a single-node job whose environment has none); empty: the ranks
  // inherit whatever the environment holds.
  std::string store_token;
  std::vector<std::string> command;  // the pstar subcommand and its arguments
  // After a rank fails, the others get SIGTERM, then SIGKILL this much later.
  std::chrono::milliseconds grace{10000};

  int world_size() const { return nnodes * nproc_per_node; }
};

// Parses `--nproc-per-node N [--nnodes M] [--node-rank K] [--master-addr A]
// [--master-port P] [--rdzv-id ID] [--standalone] -- <command...>` (also
// `--opt=value`, and torchrun's spellings with underscores: --nproc_per_node,
// --node_rank, --master_addr, --master_port, --rdzv_id). Errors are
// InvalidArgument with a one-line message.
Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

// The environment of local rank `local_rank`, as "NAME=value" entries: every
// entry of `environ` (a null-terminated array) except the variables set here,
// then RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, PSTAR_RDZV_ID and (when options.store_token is set)
// PSTAR_STORE_TOKEN. OMP_NUM_THREADS, when `environ` lacks it, is
// set to the hardware threads divided among the node's ranks (at least 1), so
// that N ranks do not each start a thread per core.
std::vector<std::string> RankEnvironment(const LaunchOptions& options, int local_rank,
                                         const char* const* environ);

}  // namespace pstar
