// DecideJobActions: the heart of the reconciler as one pure function. From a
// PatrickStarJob and what the caches show of its children it computes what to
// create, what to delete, the status to write and the events to record. It
// makes no API calls, so every transition is unit-tested without a server;
// JobReconciler only carries the actions out.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/job/desired_objects.h"
#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"
#include "operator/kube/kube_time.h"
#include "operator/reconciler/gang_pods.h"

namespace pstar::op {

using Json = nlohmann::json;

// A job's parsed spec and pod sizing: pure functions of the job's spec, which
// the reconciler caches per (uid, generation) because parsing the worker
// config and planning its memory dominate a reconcile's cost.
struct JobPlan {
  Result<JobSpec> spec;
  Result<PodSizing> sizing;  // the spec's error when the spec is invalid
};
std::shared_ptr<const JobPlan> PlanJob(const Json& job);

// What the reconciler observed of one job.
struct JobObservation {
  Json job;                 // the PatrickStarJob
  std::vector<Json> pods;   // pods labelled with the job's name and owned by its uid
  bool service_exists = false;
  Json config_map;  // the job's ConfigMap, or null
  bool store_token_exists = false;     // the job's store-token Secret
  std::string fresh_store_token;       // random; used when the Secret must be made
  bool network_policy_exists = false;
  // Why the last attempt to create the job's pods was refused ("" when it
  // was not): the API's message, shown in the Created condition.
  std::string create_failure;
  // The training progress last read from rank 0 (ProgressStatus), or null.
  Json progress;
  std::vector<Json> nodes;  // every Node (empty: not known, fit unchecked)
  // Whether the cluster serves the API of the operator's gang scheduler
  // (OperatorDefaults::gang); without it pods are scheduled one by one.
  bool gang_api_served = false;
  WallTime now;
  std::shared_ptr<const JobPlan> plan;  // null: computed from `job`, unless pending
  // The plan is being made elsewhere (JobPlanner): nothing is decided yet.
  bool plan_pending = false;
};

struct JobEvent {
  std::string type;  // "Normal" or "Warning"
  std::string reason;
  std::string message;
};

struct JobActions {
  // Written first, with the job's resourceVersion: a conflict means the view
  // was stale, and nothing else is done before the job is read again.
  std::optional<Json> status;
  std::vector<std::string> delete_pods;
  std::vector<Json> create;  // Service, ConfigMap, Secret, NetworkPolicy, PodGroup and Pods, in that order
  std::vector<Json> replace; // objects to update (PUT with their resourceVersion)
  bool delete_job = false;   // ttlSecondsAfterFinished has passed
  std::vector<JobEvent> events;
  // Look again after this long even if nothing changes (deadlines, TTL).
  std::optional<std::chrono::milliseconds> requeue_after;
};

// Phases, as shown in status.phase.
inline constexpr const char* kPhasePending = "Pending";
inline constexpr const char* kPhaseCreated = "Created";
inline constexpr const char* kPhaseRunning = "Running";
inline constexpr const char* kPhaseRestarting = "Restarting";
inline constexpr const char* kPhaseSucceeded = "Succeeded";
inline constexpr const char* kPhaseFailed = "Failed";
inline constexpr const char* kPhaseSuspended = "Suspended";

JobActions DecideJobActions(const JobObservation& observed, const OperatorDefaults& defaults);

// Pods carry a hash of what they were made from (the pod as desired and the
// worker config): a gang whose hash differs from the spec's is restarted.
inline constexpr const char* kSpecHashAnnotation = "patrickstar.io/spec-hash";

}  // namespace pstar::op
