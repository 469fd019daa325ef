// The standard process series (process_cpu_seconds_total and the rest, as
// Prometheus' client libraries name them), read from /proc/self now, for any
// binary's /metrics. Both pstar and pstar-operator export them.
#pragma once

#include <vector>

#include <prometheus/labels.h>
#include <prometheus/metric_family.h>

namespace pstar {

// One family per series, each sample carrying `labels`; empty where /proc
// cannot be read.
std::vector<prometheus::MetricFamily> ProcessMetricFamilies(const prometheus::Labels& labels = {});

}  // namespace pstar
