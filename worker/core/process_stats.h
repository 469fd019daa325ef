// The process's own resource use, from /proc/self, for the standard process
// series both binaries export (process_cpu_seconds_total and the rest, as
// Prometheus' client libraries name them).
#pragma once

#include <optional>

namespace pstar {

struct ProcessStats {
  double cpu_seconds = 0;          // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_seconds = 0;   // since the Unix epoch
  double threads = 0;
  double open_fds = 0;
  std::optional<double> max_fds;   // the soft limit; none when unlimited
};

// Read now; nullopt where /proc/self cannot be read.
std::optional<ProcessStats> ReadProcessStats();

}  // namespace pstar
