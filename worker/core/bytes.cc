#include "worker/core/bytes.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pstar {

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double b = double(bytes);
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", (long long)bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

Result<int64_t> ParseBytes(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) {
    return Status::InvalidArgument("'" + text + "' is not a byte count (e.g. 1073741824, 512MiB, 2GB)");
  }
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  struct Unit { const char* name; double scale; };
  static constexpr Unit kUnits[] = {
      {"", 1}, {"B", 1},
      {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bytes = value * u.scale;
      if (bytes > 9.0e18) return Status::InvalidArgument("'" + text + "' is too large");
      return int64_t(std::llround(bytes));
    }
  }
  return Status::InvalidArgument("'" + text + "': unknown unit '" + unit +
                                 "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

}  // namespace pstar
