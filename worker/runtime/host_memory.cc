#include "worker/runtime/host_memory.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

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
  if (text.empty() || text.size() > 19) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

int64_t MemTotal(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    int64_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB" && kib > 0) return kib * 1024;
  }
  return 0;
}

// The cgroup path of this process for the v2 hierarchy ("0::/path") or for
// v1's memory controller ("N:...memory...:/path"); empty when not listed.
std::string OwnCgroupPath(const std::string& proc_self_cgroup, bool v2) {
  std::ifstream in(proc_self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? std::string::npos : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (v2 && line.compare(0, a, "0") == 0 && controllers.empty()) return path;
    if (!v2) {
      std::istringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');) {
        if (c == "memory") return path;
      }
    }
  }
  return "";
}

}  // namespace

Result<HostBudget> DetectHostBudget(int64_t configured, const HostMemoryFiles& files) {
  if (configured > 0) return HostBudget{configured, "config"};
  const int64_t ram = MemTotal(files.meminfo);
  const bool v2 = std::filesystem::exists(files.cgroup_root + "/cgroup.controllers");
  const std::string base = v2 ? files.cgroup_root : files.cgroup_root + "/memory";
  const char* file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
  std::vector<std::string> candidates;
  if (const std::string own = OwnCgroupPath(files.proc_self_cgroup, v2); !own.empty() && own != "/") {
    candidates.push_back(base + own + file);
  }
  candidates.push_back(base + file);
  for (const std::string& path : candidates) {
    int64_t limit = 0;
    // v2 writes "max" for none; v1 a number near 2^63. A limit at or above
    // the machine's memory limits nothing.
    if (!ParseCount(FirstLine(path), &limit) || limit <= 0 || (ram > 0 && limit >= ram)) continue;
    return HostBudget{limit, std::string(v2 ? "cgroup v2" : "cgroup v1") + " limit (" + path + ")"};
  }
  if (ram > 0) return HostBudget{ram, "physical RAM"};
  return Status::Internal("cannot determine host memory: no cgroup limit under " + files.cgroup_root +
                          " and no MemTotal in " + files.meminfo + " (set runtime.host_memory)");
}

HostBudget RankHostBudget(HostBudget budget, double ratio, int local_ranks) {
  if (budget.source == "config") return budget;
  budget.bytes = int64_t(double(budget.bytes) * ratio);
  char text[64];
  std::snprintf(text, sizeof text, " x overall_cpu_mem_ratio %g", ratio);
  budget.source += text;
  if (local_ranks > 1) {
    budget.bytes /= local_ranks;
    budget.source += " / " + std::to_string(local_ranks) + " local ranks";
  }
  return budget;
}

}  // namespace pstar
