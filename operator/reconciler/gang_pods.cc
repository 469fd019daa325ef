#include "operator/reconciler/gang_pods.h"

#include <algorithm>

#include "operator/job/desired_objects.h"
#include "operator/kube/kube_time.h"

namespace pstar::op {

namespace {

// When a terminated pod's worker container finished (RFC 3339), or "" when unknown.
std::string FinishedAt(const Json& pod) {
  const Json& statuses = JsonAt(pod, "/status/containerStatuses");
  if (!statuses.is_array()) return "";
  for (const Json& c : statuses) {
    const Json& at = JsonAt(c, "/state/terminated/finishedAt");
    if (at.is_string()) return at.get<std::string>();
  }
  return "";
}

}  // namespace

const Json& JsonAt(const Json& j, const char* pointer) {
  static const Json kNull;
  const Json::json_pointer p(pointer);
  return j.is_object() && j.contains(p) ? j.at(p) : kNull;
}

std::string JsonString(const Json& j, const char* pointer) {
  const Json& v = JsonAt(j, pointer);
  return v.is_string() ? v.get<std::string>() : std::string();
}

int PodLabelInt(const Json& pod, const std::string& key) {
  const Json& labels = JsonAt(pod, "/metadata/labels");
  if (!labels.is_object() || !labels.contains(key) || !labels[key].is_string()) return -1;
  const std::string& text = labels[key].get_ref<const std::string&>();
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), ::isdigit)) return -1;
  return std::stoi(text);
}

bool Terminating(const Json& object) { return JsonAt(object, "/metadata/deletionTimestamp").is_string(); }
std::string NameOf(const Json& object) { return JsonString(object, "/metadata/name"); }
std::string PodPhase(const Json& pod) { return JsonString(pod, "/status/phase"); }

bool FinishedBefore(const Json& a, const Json& b) {
  auto ta = ParseTime(FinishedAt(a)), tb = ParseTime(FinishedAt(b));
  return ta.ok() && (!tb.ok() || *ta < *tb);
}

bool PodReady(const Json& pod) {
  const Json& conditions = JsonAt(pod, "/status/conditions");
  if (conditions.is_array()) {
    for (const Json& c : conditions) {
      if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
    }
  }
  return PodPhase(pod) == "Running";
}

int PodExitCode(const Json& pod) {
  const Json& statuses = JsonAt(pod, "/status/containerStatuses");
  if (!statuses.is_array()) return -1;
  for (const Json& c : statuses) {
    const Json& code = JsonAt(c, "/state/terminated/exitCode");
    if (code.is_number_integer()) return code.get<int>();
  }
  return -1;
}

std::string FailureText(const Json& pod) {
  const int code = PodExitCode(pod);
  if (code >= 0) {
    std::string text = "pod " + NameOf(pod) + " exited with code " + std::to_string(code);
    if (code > 128 && code < 160) text += " (signal " + std::to_string(code - 128) + ")";
    return text;
  }
  std::string why = JsonString(pod, "/status/reason");
  std::string message = JsonString(pod, "/status/message");
  std::replace(message.begin(), message.end(), '\n', ' ');
  if (!message.empty()) why += (why.empty() ? "" : ": ") + message;
  return "pod " + NameOf(pod) + " failed" + (why.empty() ? "" : " (" + why + ")");
}

bool OomKilled(const Json& pod) {
  const Json& statuses = JsonAt(pod, "/status/containerStatuses");
  if (!statuses.is_array()) return false;
  for (const Json& c : statuses) {
    if (JsonString(c, "/name") == kContainerName && JsonString(c, "/state/terminated/reason") == "OOMKilled") {
      return true;
    }
  }
  return false;
}

GangPods ClassifyPods(const std::vector<Json>& pods, int64_t attempt, int num_nodes) {
  GangPods g;
  for (const Json& pod : pods) {
    const int pod_attempt = PodLabelInt(pod, kAttemptLabel);
    const int index = PodLabelInt(pod, kNodeIndexLabel);
    if (pod_attempt > attempt) {
      g.ahead = true;
      continue;
    }
    if (pod_attempt < attempt || index < 0 || index >= num_nodes) {
      g.stale = true;
      if (!Terminating(pod)) g.stale_to_delete.push_back(NameOf(pod));
      continue;
    }
    if (Terminating(pod) && PodPhase(pod) != "Succeeded") g.deleted = &pod;
    g.gang[index] = &pod;
  }
  return g;
}

GangFailure FirstFailure(const std::map<int, const Json*>& gang, const RunPolicy& policy) {
  auto is_permanent = [&](const Json& pod) {
    const int code = PodExitCode(pod);
    return policy.restart_policy == RestartPolicy::kNever ||
           (policy.restart_policy == RestartPolicy::kExitCode &&
            std::find(policy.permanent_exit_codes.begin(), policy.permanent_exit_codes.end(), code) !=
                policy.permanent_exit_codes.end());
  };
  GangFailure f;
  for (const auto& [index, pod] : gang) {
    if (PodPhase(*pod) != "Failed") continue;
    const bool pod_permanent = is_permanent(*pod);
    if (f.pod == nullptr || (pod_permanent && !f.permanent) ||
        (pod_permanent == f.permanent && FinishedBefore(*pod, *f.pod))) {
      f.pod = pod;
      f.permanent = pod_permanent;
    }
  }
  return f;
}

const Json* OomKilledPod(const std::map<int, const Json*>& gang) {
  for (const auto& [index, pod] : gang) {
    if (PodPhase(*pod) == "Failed" && OomKilled(*pod)) return pod;
  }
  return nullptr;
}

GangCounts CountGang(const std::map<int, const Json*>& gang) {
  GangCounts n;
  for (const auto& [index, pod] : gang) {
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded") ++n.succeeded;
    if (phase == "Running") {
      ++n.running;
      if (PodReady(*pod)) ++n.ready;
    }
  }
  return n;
}

}  // namespace pstar::op
