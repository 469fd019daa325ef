// The host memory budget: the configured size, else the cgroup v2 limit of the
// container, else physical RAM. Plans are checked against it at start-up so a
// job too large for its pod fails with numbers instead of an OOM kill mid-run.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"

namespace pstar {

struct HostBudget {
  int64_t bytes = 0;
  std::string source;  // "config", "cgroup v2 limit (<path>)" or "physical RAM"
};

// `configured` > 0 wins; otherwise `cgroup_memory_max` (a cgroup v2 memory.max
// file: a byte count or "max"), otherwise MemTotal from `meminfo`.
Result<HostBudget> DetectHostBudget(int64_t configured,
                                    const std::string& cgroup_memory_max = "/sys/fs/cgroup/memory.max",
                                    const std::string& meminfo = "/proc/meminfo");

}  // namespace pstar
