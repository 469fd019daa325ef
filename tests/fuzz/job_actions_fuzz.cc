// The operator's reading of what the Kubernetes API returns, on arbitrary
// JSON: a PatrickStarJob, its pods, its ConfigMap, the cluster's nodes and
// rank 0's progress, as one object {"job", "pods", "nodes", "configMap",
// "progress", "flags"}, decided on by DecideJobActions (which parses the
// job, plans its memory and reads every pod's status). A user's CR or a
// broken API server must never crash the operator: whatever the input, a
// decision comes back (an invalid job becomes a Failed condition).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/reconciler/job_actions.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pstar::op::Json;
  const Json in = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) return 0;
  pstar::op::JobObservation o;
  o.job = in.value("job", Json());
  if (in.contains("pods") && in["pods"].is_array()) {
    for (const Json& p : in["pods"]) o.pods.push_back(p);
  }
  if (in.contains("nodes") && in["nodes"].is_array()) {
    for (const Json& n : in["nodes"]) o.nodes.push_back(n);
  }
  o.config_map = in.value("configMap", Json());
  o.progress = in.value("progress", Json());
  const uint64_t flags = in.contains("flags") && in["flags"].is_number_unsigned() ? in["flags"].get<uint64_t>() : 0;
  o.service_exists = flags & 1;
  o.store_token_exists = flags & 2;
  o.network_policy_exists = flags & 4;
  o.create_failure = (flags & 8) ? "pods \"x\" is forbidden: exceeded quota" : "";
  o.fresh_store_token = "fuzz-token";
  o.now = pstar::op::WallTime(std::chrono::seconds(1767225600 + int64_t(flags >> 4) % 1000000));
  pstar::op::OperatorDefaults defaults;
  defaults.network_policy.enabled = flags & 16;
  (void)pstar::op::DecideJobActions(o, defaults);
  return 0;
}
