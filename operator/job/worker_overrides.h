// The worker config keys the operator sets on a job's pods beyond
// spec.config (as `pstar train --set KEY=VALUE`). One list serves both the
// pods' arguments and the memory plan that sizes the pods, so the two cannot
// disagree about what the worker runs with.
#pragma once

#include <string>
#include <vector>

#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"

namespace pstar::op {

struct WorkerOverride {
  std::string key, value;
  // Whether the memory plan depends on it: SizePods plans with it. Those that
  // are not are the plan's outputs (the host budget), checks the sizing
  // makes in the spec's own terms (the disk tier's size), or known only in
  // the pod (its IP).
  bool planned = false;
  std::string Set() const { return key + "=" + value; }
};

// spec.device as runtime.device; with spec.diskTier its directory, each
// rank's share of its size, and every spill placed there; with
// spec.exportDir the export's directory; with spec.metricsPort the ranks'
// endpoint; and, once `sizing` is known (not null), the rank's host budget.
std::vector<WorkerOverride> WorkerOverrides(const JobSpec& spec, const PodSizing* sizing);

// The planned ones as KEY=VALUE, for ParseConfig.
std::vector<std::string> PlannedOverrides(const JobSpec& spec);

}  // namespace pstar::op
