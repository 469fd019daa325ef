#include "operator/job/sizing.h"

#include <algorithm>
#include <cstdio>

#include "operator/job/worker_overrides.h"
#include "operator/kube/quantity.h"
#include "worker/config/config.h"
#include "worker/plan/memory_plan.h"

namespace pstar::op {

namespace {

int64_t RoundUp(int64_t bytes, int64_t granule) { return (bytes + granule - 1) / granule * granule; }

// "124.4M params": parameter counts for the printer column.
std::string FormatParameters(int64_t n) {
  char text[32];
  if (n < 1000) {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(n));
  } else {
    static constexpr const char* kUnits[] = {"K", "M", "B", "T"};
    double v = static_cast<double>(n) / 1000.0;
    int u = 0;
    while (v >= 999.95 && u < 3) {
      v /= 1000.0;
      ++u;
    }
    std::snprintf(text, sizeof text, "%.1f%s", v, kUnits[u]);
  }
  return std::string(text) + " params";
}

std::string StringAt(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A node's label value, or nullptr without it.
const Json* NodeLabel(const Json& node, const std::string& key) {
  auto meta = node.find("metadata");
  if (meta == node.end() || !meta->is_object()) return nullptr;
  auto labels = meta->find("labels");
  if (labels == meta->end() || !labels->is_object()) return nullptr;
  auto v = labels->find(key);
  return v != labels->end() && v->is_string() ? &*v : nullptr;
}

std::string NodeName(const Json& node) {
  auto meta = node.find("metadata");
  return meta != node.end() && meta->is_object() ? StringAt(*meta, "name") : std::string();
}

// Allocatable of one resource as an integer quantity; 0 when absent or bad.
int64_t Allocatable(const Json& node, const char* resource) {
  auto status = node.find("status");
  if (status == node.end() || !status->is_object()) return 0;
  auto alloc = status->find("allocatable");
  if (alloc == status->end() || !alloc->is_object()) return 0;
  auto v = alloc->find(resource);
  if (v == alloc->end()) return 0;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (!v->is_string()) return 0;
  auto q = ParseQuantity(v->get<std::string>());
  return q.ok() ? *q : 0;
}

bool Schedulable(const Json& node) {
  auto spec = node.find("spec");
  if (spec != node.end() && spec->is_object()) {
    auto u = spec->find("unschedulable");
    if (u != spec->end() && u->is_boolean() && u->get<bool>()) return false;
  }
  auto status = node.find("status");
  if (status == node.end() || !status->is_object()) return true;
  auto conditions = status->find("conditions");
  if (conditions == status->end() || !conditions->is_array()) return true;
  for (const Json& c : *conditions) {
    if (c.is_object() && StringAt(c, "type") == "Ready") return StringAt(c, "status") == "True";
  }
  return true;  // no Ready condition reported: not known to be down
}

bool Tolerates(const Json& toleration, const Json& taint) {
  const std::string op = StringAt(toleration, "operator");
  const std::string key = StringAt(toleration, "key");
  const std::string effect = StringAt(toleration, "effect");
  if (!effect.empty() && effect != StringAt(taint, "effect")) return false;
  if (op == "Exists") return key.empty() || key == StringAt(taint, "key");
  return key == StringAt(taint, "key") && StringAt(toleration, "value") == StringAt(taint, "value");
}

bool TaintsTolerated(const Json& node, const Json& tolerations) {
  auto spec = node.find("spec");
  if (spec == node.end() || !spec->is_object()) return true;
  auto taints = spec->find("taints");
  if (taints == spec->end() || !taints->is_array()) return true;
  for (const Json& taint : *taints) {
    if (!taint.is_object()) continue;
    const std::string effect = StringAt(taint, "effect");
    if (effect != "NoSchedule" && effect != "NoExecute") continue;
    bool tolerated = false;
    if (tolerations.is_array()) {
      for (const Json& t : tolerations) tolerated = tolerated || (t.is_object() && Tolerates(t, taint));
    }
    if (!tolerated) return false;
  }
  return true;
}

// One node selector requirement (matchExpressions / matchFields entry).
bool RequirementHolds(const Json& req, const Json* value) {
  const std::string op = StringAt(req, "operator");
  std::vector<std::string> values;
  auto vs = req.find("values");
  if (vs != req.end() && vs->is_array()) {
    for (const Json& v : *vs) {
      if (v.is_string()) values.push_back(v.get<std::string>());
    }
  }
  const bool has = value != nullptr;
  const std::string v = has ? value->get<std::string>() : std::string();
  const bool listed = has && std::find(values.begin(), values.end(), v) != values.end();
  if (op == "In") return listed;
  if (op == "NotIn") return !listed;
  if (op == "Exists") return has;
  if (op == "DoesNotExist") return !has;
  if ((op == "Gt" || op == "Lt") && has && values.size() == 1) {
    try {
      const long long node_value = std::stoll(v), bound = std::stoll(values[0]);
      return op == "Gt" ? node_value > bound : node_value < bound;
    } catch (...) {
      return false;
    }
  }
  return false;
}

bool TermMatches(const Json& term, const Json& node) {
  auto exprs = term.find("matchExpressions");
  if (exprs != term.end() && exprs->is_array()) {
    for (const Json& req : *exprs) {
      if (!req.is_object() || !RequirementHolds(req, NodeLabel(node, StringAt(req, "key")))) return false;
    }
  }
  auto fields = term.find("matchFields");
  if (fields != term.end() && fields->is_array()) {
    const Json name = NodeName(node);
    for (const Json& req : *fields) {
      if (!req.is_object()) return false;
      const bool by_name = StringAt(req, "key") == "metadata.name";
      if (!RequirementHolds(req, by_name ? &name : nullptr)) return false;
    }
  }
  return true;
}

// nodeSelector and requiredDuringSchedulingIgnoredDuringExecution node affinity.
bool Selected(const Json& node, const PodOverrides& o) {
  if (o.node_selector.is_object()) {
    for (auto it = o.node_selector.begin(); it != o.node_selector.end(); ++it) {
      const Json* label = NodeLabel(node, it.key());
      if (label == nullptr || *label != it.value()) return false;
    }
  }
  if (!o.affinity.is_object()) return true;
  const Json* required = nullptr;
  auto na = o.affinity.find("nodeAffinity");
  if (na != o.affinity.end() && na->is_object()) {
    auto r = na->find("requiredDuringSchedulingIgnoredDuringExecution");
    if (r != na->end() && r->is_object()) required = &*r;
  }
  if (required == nullptr) return true;
  auto terms = required->find("nodeSelectorTerms");
  if (terms == required->end() || !terms->is_array() || terms->empty()) return true;
  for (const Json& term : *terms) {
    if (term.is_object() && TermMatches(term, node)) return true;  // terms are ORed
  }
  return false;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
    return text;
  }
  std::snprintf(text, sizeof text, "%.1f", value);
  std::string number = text;
  if (number.size() > 2 && number.compare(number.size() - 2, 2, ".0") == 0) number.resize(number.size() - 2);
  return number + " " + kUnits[unit];
}

Result<PodSizing> SizePods(const JobSpec& spec) {
  // What the pods set beyond spec.config, as they set it.
  PSTAR_ASSIGN_OR_RETURN(Config config, ParseConfig(spec.config.dump(), "spec.config", PlannedOverrides(spec),
                                                    ConfigOptions{.read_init_from = false}));
  auto planned = PlanMemory(config, spec.world_size());
  if (!planned.ok()) return planned.status().WithPrefix("spec.config");
  const MemoryPlan& plan = *planned;
  if (spec.disk_tier.enabled()) {
    const __int128 need = __int128(plan.disk_bytes) * spec.nproc_per_node;
    if (need > spec.disk_tier.size_bytes) {
      return Status::InvalidArgument(
          "spec.diskTier.size " + FormatBytesQuantity(spec.disk_tier.size_bytes) + " (" +
          HumanBytes(spec.disk_tier.size_bytes) + ") is below what the plan homes on disk for the pod's " +
          std::to_string(spec.nproc_per_node) + (spec.nproc_per_node == 1 ? " rank: " : " ranks: ") +
          HumanBytes(int64_t(need)) + " (" + std::to_string(plan.disk_moment_chunks) + " chunks' moments" +
          (plan.disk_master_chunks > 0 ? " and " + std::to_string(plan.disk_master_chunks) + " masters" : "") +
          " per rank)");
    }
  }

  PodSizing s;
  s.parameters = plan.parameters;
  s.model_bytes = plan.model_bytes;
  s.chunk_bytes = plan.chunk_bytes;
  s.num_chunks = plan.num_chunks;
  s.disk_bytes_per_rank = plan.disk_bytes;
  // The plan counts the device tier into host memory on the CPU backend (an
  // emulated tier in RAM) and not on CUDA (GPU memory).
  const int64_t host = plan.min_host_bytes;
  s.host_bytes_per_rank = RoundUp(host, kSizingGranuleBytes);
  s.device_bytes_per_rank = plan.device_bytes;
  s.min_device_bytes_per_rank = plan.min_device_bytes;

  s.ranks_per_pod = spec.nproc_per_node;
  if (spec.host_memory.shm_bytes > 0) {
    s.shm_bytes = spec.host_memory.shm_bytes;
  } else if (spec.device == JobDevice::kCuda) {
    s.shm_bytes = kShmBaseBytes + kShmPerRankBytes * spec.nproc_per_node;
  } else {
    s.shm_bytes = kShmCpuBytes;
  }
  s.launcher_overhead_bytes = kLauncherOverheadBytes;
  s.need_bytes = s.host_bytes_per_rank * spec.nproc_per_node + s.shm_bytes + s.launcher_overhead_bytes;

  // A fixed request or limit comes from spec.hostMemory or the template's
  // resources (ParseJob made sure the two agree when both are given).
  const bool request_from_host_memory = spec.host_memory.request_bytes > 0;
  const int64_t fixed_request = std::max(spec.host_memory.request_bytes, spec.overrides.memory_request_bytes);
  const int64_t fixed_limit = std::max(spec.host_memory.limit_bytes, spec.overrides.memory_limit_bytes);
  auto too_small = [&](const char* what, const std::string& field, int64_t fixed) {
    return Status::InvalidArgument(field + " " + FormatBytesQuantity(fixed) + " (" + HumanBytes(fixed) + ") is below the " +
                                   what + " each pod needs: " + DescribePodNeed(s));
  };
  if (fixed_request > 0 && fixed_request < s.need_bytes) {
    return too_small("memory", request_from_host_memory ? "spec.hostMemory.request"
                                                        : spec.overrides.worker_path + ".resources.requests.memory",
                     fixed_request);
  }
  if (fixed_limit > 0 && fixed_limit < s.need_bytes) {
    return too_small("memory", spec.host_memory.limit_bytes > 0 ? "spec.hostMemory.limit"
                                                                : spec.overrides.worker_path + ".resources.limits.memory",
                     fixed_limit);
  }
  s.request_fixed = fixed_request > 0;
  s.request_bytes = s.request_fixed ? fixed_request : s.need_bytes;
  if (fixed_limit > 0) {
    s.limit_bytes = fixed_limit;
  } else {
    const __int128 with_headroom = __int128(s.need_bytes) * (100 + spec.host_memory.headroom_percent) / 100;
    if (with_headroom > __int128(int64_t(1) << 62)) {
      return Status::InvalidArgument("spec.hostMemory.headroomPercent: the limit would overflow");
    }
    s.limit_bytes = std::max(RoundUp(int64_t(with_headroom), kSizingGranuleBytes), s.request_bytes);
  }
  const int64_t per_rank = (s.limit_bytes - s.shm_bytes - s.launcher_overhead_bytes) / spec.nproc_per_node;
  s.worker_host_budget_bytes = std::max(per_rank / kSizingGranuleBytes * kSizingGranuleBytes, s.host_bytes_per_rank);
  return s;
}

namespace {

// "2 ranks x 18 GiB + 1 GiB shm + 512 MiB launcher"
std::string NeedBreakdown(const PodSizing& s) {
  return std::to_string(s.ranks_per_pod) + (s.ranks_per_pod == 1 ? " rank x " : " ranks x ") +
         HumanBytes(s.host_bytes_per_rank) + " + " + HumanBytes(s.shm_bytes) + " shm + " +
         HumanBytes(s.launcher_overhead_bytes) + " launcher";
}

}  // namespace

std::string DescribePodNeed(const PodSizing& s) {
  return HumanBytes(s.need_bytes) + " of host memory (" + NeedBreakdown(s) + ")";
}

NodeFit CheckNodeFit(const JobSpec& spec, const PodSizing& sizing, const std::vector<Json>& nodes) {
  NodeFit fit;
  fit.needed_bytes = sizing.request_bytes;
  std::string each = "each pod needs " + DescribePodNeed(sizing);
  if (sizing.request_fixed) {
    each = "each pod requests " + HumanBytes(sizing.request_bytes) + " of host memory (fixed in the spec; the plan needs " +
           HumanBytes(sizing.need_bytes) + ": " + NeedBreakdown(sizing) + ")";
  }
  if (nodes.empty()) {
    fit.fits = true;
    fit.message = "node fit unchecked: no nodes were listed; " + each;
    return fit;
  }
  const bool cuda = spec.device == JobDevice::kCuda;
  int down = 0, tainted = 0, unselected = 0, no_gpus = 0;
  int64_t slots = 0;  // pods the eligible nodes could hold at most
  for (const Json& node : nodes) {
    if (!node.is_object()) continue;
    if (!Schedulable(node)) {
      ++down;
      continue;
    }
    if (!Selected(node, spec.overrides)) {
      ++unselected;
      continue;
    }
    if (!TaintsTolerated(node, spec.overrides.tolerations)) {
      ++tainted;
      continue;
    }
    const int64_t gpus = Allocatable(node, "nvidia.com/gpu");
    if (cuda && gpus < spec.nproc_per_node) {
      ++no_gpus;
      continue;
    }
    ++fit.eligible_nodes;
    const int64_t memory = Allocatable(node, "memory");
    const std::string name = NodeName(node);
    if (fit.best_node.empty() || memory > fit.largest_allocatable_bytes ||
        (memory == fit.largest_allocatable_bytes && name < fit.best_node)) {
      fit.best_node = name;
      fit.largest_allocatable_bytes = memory;
    }
    int64_t node_slots = sizing.request_bytes > 0 ? memory / sizing.request_bytes : 0;
    if (cuda) node_slots = std::min<int64_t>(node_slots, gpus / spec.nproc_per_node);
    slots += node_slots;
  }

  if (fit.eligible_nodes == 0) {
    fit.fits = false;
    std::string why;
    auto add = [&](int n, const std::string& what) {
      if (n > 0) why += (why.empty() ? "" : ", ") + std::to_string(n) + " " + what;
    };
    add(down, down == 1 ? "is unschedulable or not ready" : "are unschedulable or not ready");
    add(unselected, std::string(unselected == 1 ? "does" : "do") + " not match the node selector or affinity");
    add(tainted, std::string(tainted == 1 ? "has" : "have") + " taints the job does not tolerate");
    add(no_gpus, std::string(no_gpus == 1 ? "has" : "have") + " fewer than " + std::to_string(spec.nproc_per_node) +
                     " allocatable nvidia.com/gpu");
    fit.message = "no node can run the job's pods: of " + std::to_string(nodes.size()) + " node" +
                  (nodes.size() == 1 ? "" : "s") + ", " + why;
    // The cause that ruled out the most nodes names the reason.
    const int most = std::max({down, unselected, tainted, no_gpus});
    fit.reason = no_gpus == most ? "InsufficientGPUs" : (unselected == most || tainted == most) ? "NoMatchingNode"
                                                                                               : "NoReadyNode";
    return fit;
  }
  const std::string largest = "the largest eligible node, " + fit.best_node + ", has " +
                              HumanBytes(fit.largest_allocatable_bytes) + " allocatable";
  if (fit.largest_allocatable_bytes < sizing.request_bytes) {
    fit.fits = false;
    fit.reason = "InsufficientHostMemory";
    fit.message = each + "; " + largest;
    return fit;
  }
  if (slots < spec.num_nodes) {
    fit.fits = false;
    fit.reason = "InsufficientNodes";
    fit.message = each + "; the job has " + std::to_string(spec.num_nodes) + " pods but the " +
                  std::to_string(fit.eligible_nodes) + " eligible node" + (fit.eligible_nodes == 1 ? "" : "s") +
                  " can hold only " + std::to_string(slots) + " (" + largest + ")";
    return fit;
  }
  fit.fits = true;
  fit.message = "fits: " + each + "; " + std::to_string(fit.eligible_nodes) + " eligible node" +
                (fit.eligible_nodes == 1 ? "" : "s") + ", " + largest;
  return fit;
}

// One form for every byte count in status: whole MiB (rounded up), as "Gi"
// when a whole number of GiB, else "Mi" ("48Gi", "13284Mi"); never bare bytes
// or "Ki". The pods' own quantities are whole MiB already, so these equal
// them unless the spec fixed an odd one.
std::string StatusQuantity(int64_t bytes) {
  constexpr int64_t kMiB = int64_t(1) << 20;
  if (bytes <= 0) return "0";
  const int64_t mib = bytes / kMiB + (bytes % kMiB != 0 ? 1 : 0);
  return mib % 1024 == 0 ? std::to_string(mib / 1024) + "Gi" : std::to_string(mib) + "Mi";
}

Json SizingStatus(const PodSizing& s) {
  Json j = Json::object();
  j["hostMemoryPerPod"] = StatusQuantity(s.request_bytes);
  j["hostMemoryLimitPerPod"] = StatusQuantity(s.limit_bytes);
  j["hostMemoryPerRank"] = StatusQuantity(s.host_bytes_per_rank);
  j["workerHostBudget"] = StatusQuantity(s.worker_host_budget_bytes);
  j["shmSize"] = StatusQuantity(s.shm_bytes);
  j["launcherOverhead"] = StatusQuantity(s.launcher_overhead_bytes);
  j["deviceMemoryPerRank"] = StatusQuantity(s.device_bytes_per_rank);
  j["minDeviceMemoryPerRank"] = StatusQuantity(s.min_device_bytes_per_rank);
  j["diskPerRank"] = StatusQuantity(s.disk_bytes_per_rank);
  j["diskPerPod"] = StatusQuantity(s.disk_bytes_per_rank * s.ranks_per_pod);
  j["modelParameters"] = s.parameters;
  j["model"] = FormatParameters(s.parameters);
  j["modelBytes"] = StatusQuantity(s.model_bytes);
  j["chunkBytes"] = StatusQuantity(s.chunk_bytes);
  j["chunks"] = s.num_chunks;
  return j;
}

}  // namespace pstar::op
