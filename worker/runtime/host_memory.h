// The host memory budget: the configured size, else the memory limit of the
// cgroup this process runs in (v2 memory.max or v1 memory.limit_in_bytes,
// where it is below physical RAM), else physical RAM. Plans are checked
// against it at start-up, so a job too large for its container fails with
// numbers instead of an OOM kill mid-run.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"

namespace pstar {

struct HostBudget {
  int64_t bytes = 0;
  // "config", "cgroup v2 limit (<file>)", "cgroup v1 limit (<file>)" or
  // "physical RAM".
  std::string source;
};

// Where the limits are read; tests point them at files of their own.
struct HostMemoryFiles {
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string meminfo = "/proc/meminfo";
};

// `configured` > 0 wins. Otherwise the process's own cgroup's limit (the path
// /proc/self/cgroup names under the cgroup mount, then the mount's root, which
// is the container's own cgroup inside a container), when it is below
// MemTotal; otherwise MemTotal.
Result<HostBudget> DetectHostBudget(int64_t configured, const HostMemoryFiles& files = {});

// What one rank is checked against: a configured budget as it is; a detected
// one times `ratio` (PatrickStar's overall_cpu_mem_ratio: headroom for the
// rest of the process), split among the `local_ranks` that share the host.
// The source says each step.
HostBudget RankHostBudget(HostBudget budget, double ratio, int local_ranks);

}  // namespace pstar
