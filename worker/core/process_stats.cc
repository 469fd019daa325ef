#include "worker/core/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace pstar {

std::optional<ProcessStats> ReadProcessStats() {
  std::ifstream stat_file("/proc/self/stat");
  const std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // The command (field 2) is in parentheses and may hold spaces: count from after it.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 2));
  std::vector<std::string> f;
  for (std::string x; fields >> x;) f.push_back(x);
  // Field n (1-based, as proc(5) numbers them) is f[n - 3]: utime 14,
  // stime 15, num_threads 20, starttime 22, vsize 23, rss 24 (pages).
  auto field = [&](int n) { return size_t(n - 3) < f.size() ? std::strtod(f[size_t(n - 3)].c_str(), nullptr) : 0.0; };
  if (f.size() < 22) return std::nullopt;
  const double ticks = double(::sysconf(_SC_CLK_TCK));
  const double page = double(::sysconf(_SC_PAGESIZE));
  double boot_time = 0;
  std::ifstream proc_stat("/proc/stat");
  for (std::string line; std::getline(proc_stat, line);) {
    if (line.rfind("btime ", 0) == 0) boot_time = std::strtod(line.c_str() + 6, nullptr);
  }
  ProcessStats s;
  s.cpu_seconds = (field(14) + field(15)) / ticks;
  s.resident_bytes = field(24) * page;
  s.virtual_bytes = field(23);
  s.start_time_seconds = boot_time + field(22) / ticks;
  s.threads = field(20);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.open_fds;
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) s.max_fds = double(limit.rlim_cur);
  return s;
}

}  // namespace pstar
