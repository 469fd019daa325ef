#include "worker/runtime/host_memory.h"

#include <fstream>
#include <sstream>

namespace pstar {

namespace {

// The first line of `path`, or empty when it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

bool ParseCount(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

Result<HostBudget> DetectHostBudget(int64_t configured, const std::string& cgroup_memory_max,
                                    const std::string& meminfo) {
  if (configured > 0) return HostBudget{configured, "config"};
  std::string limit = FirstLine(cgroup_memory_max);
  int64_t bytes = 0;
  if (limit != "max" && ParseCount(limit, &bytes)) {
    return HostBudget{bytes, "cgroup v2 limit (" + cgroup_memory_max + ")"};
  }
  std::ifstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    int64_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB" && kib > 0) {
      return HostBudget{kib * 1024, "physical RAM"};
    }
  }
  return Status::Internal("cannot determine host memory: no cgroup v2 limit in " + cgroup_memory_max +
                          " and no MemTotal in " + meminfo + " (set runtime.host_memory)");
}

}  // namespace pstar
