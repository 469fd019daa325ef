#include "operator/job/worker_overrides.h"

namespace pstar::op {

std::vector<WorkerOverride> WorkerOverrides(const JobSpec& spec, const PodSizing* sizing) {
  // runtime.device, so that what follows from it (the precision, the
  // kernels' scratch) is planned as the worker will run.
  std::vector<WorkerOverride> out = {
      {"runtime.device", spec.device == JobDevice::kCuda ? "cuda" : "cpu", /*planned=*/true}};
  if (sizing != nullptr) out.push_back({"runtime.host_memory", std::to_string(sizing->worker_host_budget_bytes)});
  if (spec.disk_tier.enabled()) {
    // Everything the plan may put on disk goes there, as the pod was sized
    // (the pods' memory drops by it): the budget (the limit's share) is a
    // check, its headroom stays headroom.
    out.push_back({"runtime.nvme_path", spec.disk_tier.mount_path, true});
    out.push_back({"runtime.nvme_memory", std::to_string(spec.disk_tier.size_bytes / spec.nproc_per_node)});
    out.push_back({"runtime.nvme_spill", "all", true});
  }
  // The export's buffers are in the plan.
  if (!spec.export_dir.empty()) out.push_back({"checkpoint.export_dir", spec.export_dir, true});
  if (spec.metrics_port > 0) {
    out.push_back({"metrics.port", std::to_string(spec.metrics_port)});
    out.push_back({"metrics.bind_address", "$(POD_IP)"});
  }
  return out;
}

std::vector<std::string> PlannedOverrides(const JobSpec& spec) {
  std::vector<std::string> sets;
  for (const WorkerOverride& o : WorkerOverrides(spec, nullptr)) {
    if (o.planned) sets.push_back(o.Set());
  }
  return sets;
}

}  // namespace pstar::op
