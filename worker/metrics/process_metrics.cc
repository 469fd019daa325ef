#include "worker/metrics/process_metrics.h"

#include <optional>
#include <utility>

#include "worker/core/process_stats.h"

namespace pstar {

std::vector<prometheus::MetricFamily> ProcessMetricFamilies(const prometheus::Labels& labels) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::optional<ProcessStats> p = ReadProcessStats();
  if (!p) return out;
  auto one = [&](const char* name, const char* help, MetricType type, double value) {
    prometheus::ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    out.push_back(prometheus::MetricFamily{name, help, type, {std::move(m)}});
  };
  one("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter,
      p->cpu_seconds);
  one("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge, p->resident_bytes);
  one("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge, p->virtual_bytes);
  one("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
      p->start_time_seconds);
  one("process_threads", "Number of OS threads in the process.", MetricType::Gauge, p->threads);
  one("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, p->open_fds);
  if (p->max_fds) one("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge, *p->max_fds);
  return out;
}

}  // namespace pstar
