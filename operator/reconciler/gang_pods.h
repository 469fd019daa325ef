// What a job's pods show, read from their JSON, and the gang they form: the
// steps of DecideJobActions (job_actions.h) that only read pods, each a pure
// function its tests call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/job/job_spec.h"

namespace pstar::op {

using Json = nlohmann::json;

const Json& JsonAt(const Json& j, const char* pointer);        // null when absent
std::string JsonString(const Json& j, const char* pointer);    // "" when absent or not a string
int PodLabelInt(const Json& pod, const std::string& key);      // -1 when absent or not a small number
bool Terminating(const Json& object);                          // has a deletionTimestamp
std::string NameOf(const Json& object);
std::string PodPhase(const Json& pod);
bool PodReady(const Json& pod);  // its Ready condition, or Running without one
// Whether the kernel killed the pod's worker container at its memory limit
// (the kubelet's terminated reason OOMKilled).
bool OomKilled(const Json& pod);
// The exit code of a terminated pod's worker container (-1 when unknown).
int PodExitCode(const Json& pod);
// Why a failed pod failed, for messages: its exit code, or the pod's reason.
std::string FailureText(const Json& pod);
// Whether pod `a` finished strictly before pod `b` (unknown times never do).
bool FinishedBefore(const Json& a, const Json& b);

// A job's pods sorted by the attempt they belong to.
struct GangPods {
  std::map<int, const Json*> gang;  // this attempt's pods by node index
  // Pods of older attempts or of node indices outside the job: any at all,
  // and those not yet going away (to delete).
  bool stale = false;
  std::vector<std::string> stale_to_delete;
  // A live pod of the gang someone else (a drain, an eviction, kubectl
  // delete) is deleting: only the operator deletes a live gang's pods, and
  // only after moving to the next attempt.
  const Json* deleted = nullptr;
  // A pod of an attempt past `attempt`: the cached job is behind its own pods.
  bool ahead = false;
};
GangPods ClassifyPods(const std::vector<Json>& pods, int64_t attempt, int num_nodes);

// The failure that ends an attempt: the first pod to fail (its peers' exits
// usually follow from it), unless a pod exited with a permanent code under
// `policy`: that decides, whichever order the exits came in.
struct GangFailure {
  const Json* pod = nullptr;  // null: no pod failed
  bool permanent = false;
};
GangFailure FirstFailure(const std::map<int, const Json*>& gang, const RunPolicy& policy);
// A failed pod killed at its memory limit, or null.
const Json* OomKilledPod(const std::map<int, const Json*>& gang);

struct GangCounts {
  int succeeded = 0, running = 0, ready = 0;  // ready: running with Ready true
};
GangCounts CountGang(const std::map<int, const Json*>& gang);

}  // namespace pstar::op
