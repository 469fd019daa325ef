#include "worker/plan/plan_verdict.h"

#include <cstdio>

#include "worker/core/bytes.h"

namespace pstar {

namespace {

std::string Bytes(int64_t b) { return FormatBytes(b); }

std::string Ratio(double r) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", r);
  return text;
}

// "fits" or "still short by X" for a budget of `have` against `need`.
std::string Against(int64_t need, int64_t have) {
  return need <= have ? "which fits" : "still short by " + Bytes(need - have);
}

void DeviceChanges(const Config& config, const MemoryPlan& plan, const PlanVerdict::Tier& device,
                   std::vector<std::string>* changes) {
  changes->push_back("runtime.device_memory: at least " + Bytes(device.need) +
                     (config.runtime.device == ComputeDevice::kCuda ? ", on a GPU with that much free" : ""));
  if (!config.train.activation_checkpointing) {
    changes->push_back("train.activation_checkpointing: true, or a smaller train.batch_size or train.seq_len: the " +
                       Bytes(plan.activation_bytes) + " of activations are part of the device minimum");
  } else {
    changes->push_back("a smaller train.batch_size or train.seq_len: the " + Bytes(plan.activation_bytes) +
                       " of activations are part of the device minimum");
  }
}

// The what-if plans are the job's with one change; one the planner refuses
// is simply not offered.
void HostChanges(const Config& config, int world_size, const PlanVerdict::Tier& host,
                 std::vector<std::string>* changes) {
  if (host.source == "config") {
    changes->push_back("runtime.host_memory: at least " + Bytes(host.need) + ", on a host (or pod) with that much");
  } else {
    // A detected budget is overall_cpu_mem_ratio of the host's memory.
    const double ratio = config.mem_tracer.overall_cpu_mem_ratio;
    changes->push_back("a host (or pod memory limit) of at least " + Bytes(int64_t(double(host.need) / ratio) + 1) +
                       ", of which overall_cpu_mem_ratio " + Ratio(ratio) + " is the budget");
  }
  if (config.runtime.nvme_path.empty() || config.runtime.nvme_spill != DiskSpill::kAll) {
    // Everything the disk tier may home, as a job that names one would plan it.
    Config disk = config;
    if (disk.runtime.nvme_path.empty()) disk.runtime.nvme_path = "/nvme";
    disk.runtime.nvme_spill = DiskSpill::kAll;
    disk.runtime.nvme_memory = 0;
    auto planned = PlanMemory(disk, world_size);
    const MemoryPlan* on_disk = planned.ok() ? &*planned : nullptr;
    if (on_disk != nullptr && on_disk->min_host_bytes < host.need) {
      changes->push_back(
          std::string(config.runtime.nvme_path.empty() ? "the disk tier (runtime.nvme_path: a directory on a fast disk)"
                                                       : "runtime.nvme_spill: all") +
          ", homing the optimizer's moments" + (on_disk->disk_master_chunks > 0 ? " and fp32 masters" : "") +
          " on disk (" + Bytes(on_disk->disk_bytes) + "): the host then needs " + Bytes(on_disk->min_host_bytes) +
          ", " + Against(on_disk->min_host_bytes, host.have));
    }
  }
  // ZeRO shards the host's chunk homes: the fewest ranks, one per host, whose
  // share fits (as far as the planner plans them).
  for (int n = world_size * 2; n <= 65536; n *= 2) {
    auto more = PlanMemory(config, n);
    if (!more.ok()) break;
    if (more->min_host_bytes <= host.have) {
      changes->push_back("more ranks: at " + std::to_string(n) + " ranks, one per host, each needs " +
                         Bytes(more->min_host_bytes) + " of host memory");
      break;
    }
  }
}

}  // namespace

bool PlanVerdict::fits() const {
  for (const Tier& t : checked) {
    if (!t.fits()) return false;
  }
  return true;
}

PlanVerdict JudgePlan(const Config& config, int world_size, const MemoryPlan& plan, const HostBudget& host,
                       int64_t device_tier_bytes) {
  PlanVerdict v;
  // A CPU job's tier without a budget holds every chunk in host memory, where
  // the host minimum counts it.
  if (config.runtime.device_memory > 0) {
    v.checked.push_back({"device", plan.min_device_bytes, config.runtime.device_memory, "runtime.device_memory"});
  } else if (config.runtime.device == ComputeDevice::kCuda && device_tier_bytes > 0) {
    v.checked.push_back({"device", plan.min_device_bytes, device_tier_bytes,
                         "overall_gpu_mem_ratio " + Ratio(config.mem_tracer.overall_gpu_mem_ratio) +
                             " of the GPU's memory"});
  } else if (config.runtime.device == ComputeDevice::kCuda) {
    v.unchecked.push_back("device: no GPU seen here; the tier will be overall_gpu_mem_ratio " +
                          Ratio(config.mem_tracer.overall_gpu_mem_ratio) + " of the GPU's memory and needs at least " +
                          Bytes(plan.min_device_bytes));
  }
  v.checked.push_back({"host", plan.min_host_bytes, host.bytes, host.source});
  for (const PlanVerdict::Tier& t : v.checked) {
    if (t.fits()) continue;
    if (t.tier == "device") {
      DeviceChanges(config, plan, t, &v.changes);
    } else {
      HostChanges(config, world_size, t, &v.changes);
    }
  }
  return v;
}

std::string FormatVerdict(const PlanVerdict& v) {
  std::string out = v.fits() ? "verdict: fits:" : "verdict: does not fit:";
  bool first = true;
  for (const PlanVerdict::Tier& t : v.checked) {
    out += first ? " " : "; ";
    first = false;
    out += t.tier + " needs " + Bytes(t.need) + " of " + Bytes(t.have) + " (" + t.source + ")";
    if (!t.fits()) out += ", short by " + Bytes(t.need - t.have);
  }
  out += "\n";
  for (const std::string& u : v.unchecked) out += "  unchecked: " + u + "\n";
  for (const std::string& c : v.changes) out += "  change: " + c + "\n";
  return out;
}

}  // namespace pstar
