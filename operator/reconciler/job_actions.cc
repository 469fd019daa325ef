#include "operator/reconciler/job_actions.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"
#include "operator/reconciler/gang_pods.h"

namespace pstar::op {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::seconds;

// How often a job that fits no node looks at the nodes again (node changes
// do not enqueue jobs).
constexpr milliseconds kNodeFitRetry{30000};

// Condition types, in the order status.conditions lists them.
constexpr const char* kConditionOrder[] = {"Created", "Schedulable", "Running", "Restarting", "Suspended",
                                           "Succeeded", "Failed"};

int64_t Int(const Json& j, const char* pointer, int64_t fallback) {
  const Json& v = JsonAt(j, pointer);
  return v.is_number_integer() ? v.get<int64_t>() : fallback;
}

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// One line for an OOM-killed rank: which ranks, the limit they had, what the
// plan needed, and what to change. The same limit fails the same way, so the
// job is not restarted.
std::string OutOfMemoryText(const Json& pod, const JobSpec& spec, const PodSizing& sizing) {
  const int index = PodLabelInt(pod, kNodeIndexLabel);
  std::string ranks;
  if (index >= 0) {
    const int first = index * spec.nproc_per_node;
    ranks = spec.nproc_per_node == 1 ? "rank " + std::to_string(first)
                                     : "ranks " + std::to_string(first) + "-" +
                                           std::to_string(first + spec.nproc_per_node - 1);
  }
  // The limit the pods were created with (the cache keeps no pod specs).
  return (ranks.empty() ? "" : ranks + " (") + "pod " + NameOf(pod) + (ranks.empty() ? "" : ")") +
         " was killed at its memory limit of " + HumanBytes(sizing.limit_bytes) +
         " (OOMKilled, exit 137); the plan needs " + HumanBytes(sizing.need_bytes) + " per pod (" +
         HumanBytes(sizing.host_bytes_per_rank) + " per rank), so the rank held more than its plan: raise "
         "spec.hostMemory.limit or "
         "spec.hostMemory.headroomPercent, or shrink what the plan does not count (a text data file is read "
         "whole); the job is not restarted, the same limit would fail the same way";
}

// Status with Kubernetes condition semantics: lastTransitionTime changes only
// when a condition's status flips.
class StatusBuilder {
 public:
  StatusBuilder(Json status, std::string now, int64_t generation)
      : status_(std::move(status)), now_(std::move(now)), generation_(generation) {
    if (!status_.is_object()) status_ = Json::object();
    if (!status_.contains("conditions") || !status_["conditions"].is_array()) status_["conditions"] = Json::array();
  }

  bool IsTrue(const std::string& type) const {
    const Json* c = Find(type);
    return c != nullptr && c->value("status", "") == "True";
  }
  const Json* Find(const std::string& type) const {
    for (const Json& c : status_["conditions"]) {
      if (c.value("type", "") == type) return &c;
    }
    return nullptr;
  }

  // A condition that was never true is listed as false only when `list` says
  // so (a reason worth showing); otherwise it stays absent.
  void Set(const std::string& type, bool value, const std::string& reason, const std::string& message,
           bool list = false) {
    const std::string wanted = value ? "True" : "False";
    Json* existing = nullptr;
    for (Json& c : status_["conditions"]) {
      if (c.value("type", "") == type) existing = &c;
    }
    if (existing == nullptr) {
      if (!value && !list) return;
      Json c = {{"type", type}, {"status", wanted}, {"reason", reason}, {"message", message},
                {"lastTransitionTime", now_}, {"lastUpdateTime", now_}, {"observedGeneration", generation_}};
      status_["conditions"].push_back(std::move(c));
      SortConditions();
      return;
    }
    Json& c = *existing;
    if (c.value("status", "") != wanted) c["lastTransitionTime"] = now_;
    if (c.value("status", "") != wanted || c.value("reason", "") != reason || c.value("message", "") != message) {
      c["lastUpdateTime"] = now_;
    }
    c["status"] = wanted;
    c["reason"] = reason;
    c["message"] = message;
    c["observedGeneration"] = generation_;
  }

  void Remove(const std::string& type) {
    Json kept = Json::array();
    for (Json& c : status_["conditions"]) {
      if (c.value("type", "") != type) kept.push_back(std::move(c));
    }
    status_["conditions"] = std::move(kept);
  }

  Json& status() { return status_; }
  const std::string& now() const { return now_; }

 private:
  void SortConditions() {
    auto rank = [](const Json& c) {
      const std::string t = c.value("type", "");
      for (size_t i = 0; i < std::size(kConditionOrder); ++i) {
        if (t == kConditionOrder[i]) return int(i);
      }
      return int(std::size(kConditionOrder));
    };
    std::stable_sort(status_["conditions"].begin(), status_["conditions"].end(),
                     [&](const Json& a, const Json& b) { return rank(a) < rank(b); });
  }

  Json status_;
  std::string now_;
  int64_t generation_;
};

// One event per condition that became true, with the condition's reason.
void AddTransitionEvents(const Json& before, const Json& after, std::vector<JobEvent>* events) {
  auto was_true = [&](const std::string& type) {
    const Json& conds = JsonAt(before, "/conditions");
    if (!conds.is_array()) return false;
    for (const Json& c : conds) {
      if (c.value("type", "") == type) return c.value("status", "") == "True";
    }
    return false;
  };
  for (const Json& c : after["conditions"]) {
    const std::string type = c.value("type", "");
    if (c.value("status", "") != "True" || was_true(type)) continue;
    const bool warning = type == "Failed" || type == "Restarting";
    events->push_back({warning ? "Warning" : "Normal", c.value("reason", type), c.value("message", "")});
  }
}

class Decider {
 public:
  Decider(const JobObservation& o, const OperatorDefaults& d)
      : o_(o),
        defaults_(d),
        generation_(Int(o.job, "/metadata/generation", 1)),
        before_(o.job.contains("status") && o.job["status"].is_object() ? o.job["status"] : Json::object()),
        st_(before_, FormatTime(o.now), generation_),
        plan_(o.plan != nullptr || o.plan_pending ? o.plan : PlanJob(o.job)) {}

  JobActions Run();

 private:
  JobActions Finish() {
    Json& s = st_.status();
    s["observedGeneration"] = generation_;
    if (s != before_) {
      AddTransitionEvents(before_, s, &a_.events);
      a_.status = s;
    }
    return std::move(a_);
  }

  void SetPhase(const char* phase) { st_.status()["phase"] = phase; }

  // Ends the job: Failed with the reason; pods go by the clean-up policy.
  JobActions Fail(const std::string& reason, const std::string& message, CleanPodPolicy policy) {
    st_.Set("Failed", true, reason, message);
    st_.Set("Running", false, reason, message);
    st_.Set("Restarting", false, reason, message);
    SetPhase(kPhaseFailed);
    Json& s = st_.status();
    if (!s.contains("completionTime")) s["completionTime"] = st_.now();
    s["readyRanks"] = 0;
    // READY in `kubectl get` says the same: no rank runs.
    if (s.contains("worldSize") && s["worldSize"].is_number_integer()) {
      s["ready"] = "0/" + std::to_string(s["worldSize"].get<int64_t>());
    } else {
      s.erase("ready");
    }
    CleanUp(policy);
    return Finish();
  }

  void CleanUp(CleanPodPolicy policy) {
    for (const Json& pod : o_.pods) {
      if (Terminating(pod)) continue;
      const std::string phase = PodPhase(pod);
      const bool active = phase == "Running" || phase == "Pending" || phase.empty() || phase == "Unknown";
      if (policy == CleanPodPolicy::kAll || (policy == CleanPodPolicy::kRunning && active)) {
        a_.delete_pods.push_back(NameOf(pod));
      }
    }
  }

  void DeleteAllPods() {
    for (const Json& pod : o_.pods) {
      if (!Terminating(pod)) a_.delete_pods.push_back(NameOf(pod));
    }
  }

  void RequeueWithin(milliseconds delay) {
    delay = std::max(delay, milliseconds(100));
    if (!a_.requeue_after || *a_.requeue_after > delay) a_.requeue_after = delay;
  }

  JobActions Finished();

  // Run's phases, in order.
  void LookAgainAtARejectedSpec();
  JobActions AwaitPlan();
  void RecordPlan();  // sizing, world size and restarts into the status
  JobActions Suspend();
  void Resume();
  // What ends this attempt ("" when nothing does): a failed rank, a spec
  // changed under a live pod, a pod deleted from outside, a vanished pod.
  std::string AttemptEndingEvent(const GangFailure& failure, bool* spec_changed) const;
  std::optional<JobActions> EndAttemptOnFailure();  // the job fails, or the gang restarts
  JobActions Succeed();
  std::optional<JobActions> FailPastDeadline();
  bool AddChildren();  // false: nothing more to do this time
  void CheckNodeFitOfTheGang();
  int AddMissingPods();  // the PodGroup and the pods the gang lacks; how many
  void SetCreated(int missing);
  void SetRunning(const GangCounts& counts);
  void SetNoRankReady();

  // The pod of node `index` as created, with the hash of what it is made of.
  Json PodWithHash(const JobSpec& spec, const PodSizing& sizing, int index, int attempt) const {
    Json pod = DesiredPod(spec, sizing, index, attempt, defaults_);
    // The store token's env entry is left out: it names the Secret, not
    // anything of the spec, and pods made before it existed must not restart.
    Json hashed = pod;
    // Nor the restricted securityContext default (only what the job sets):
    // an operator that starts adding it restarts no running gang.
    Json& worker = hashed["spec"]["containers"][0];
    if (spec.overrides.security_context.is_object()) {
      worker["securityContext"] = spec.overrides.security_context;
    } else {
      worker.erase("securityContext");
    }
    Json& env = worker["env"];
    for (auto it = env.begin(); it != env.end(); ++it) {
      if (it->value("name", "") == "PSTAR_STORE_TOKEN") {
        env.erase(it);
        break;
      }
    }
    const std::string made_of = hashed.dump() + DesiredConfigMap(spec)["data"].dump();
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(Fnv1a(made_of)));
    pod["metadata"]["annotations"][kSpecHashAnnotation] = hash;
    return pod;
  }

  // A live pod of the gang whose spec hash differs from the spec's now.
  const Json* ChangedPod(const std::map<int, const Json*>& gang, const JobSpec& spec, const PodSizing& sizing,
                         int attempt) const {
    for (const auto& [index, pod] : gang) {
      const std::string phase = PodPhase(*pod);
      if (phase == "Succeeded" || phase == "Failed" || Terminating(*pod)) continue;
      const Json& had = JsonAt(*pod, "/metadata/annotations");
      if (!had.is_object() || !had.contains(kSpecHashAnnotation)) continue;  // made before hashes
      const Json want = PodWithHash(spec, sizing, index, attempt);
      if (had[kSpecHashAnnotation] != want["metadata"]["annotations"][kSpecHashAnnotation]) return pod;
    }
    return nullptr;
  }

  const JobObservation& o_;
  const OperatorDefaults& defaults_;
  const int64_t generation_;
  const Json before_;
  StatusBuilder st_;
  const std::shared_ptr<const JobPlan> plan_;
  JobActions a_;
  // Set by Run once the plan is valid.
  const JobSpec* spec_ = nullptr;
  const PodSizing* sizing_ = nullptr;
  int64_t restarts_ = 0, failed_restarts_ = 0;
  GangPods pods_;
};

JobActions Decider::Finished() {
  // A job that ended stays ended; only its pods and TTL need care. The spec
  // may be invalid (that may be why it failed): then the defaults apply.
  const auto& spec = plan_->spec;
  const RunPolicy policy = spec.ok() ? spec->run_policy : RunPolicy{};
  CleanUp(policy.clean_pod_policy);
  if (policy.ttl_seconds_after_finished) {
    auto done = ParseTime(JsonString(o_.job, "/status/completionTime"));
    if (!done.ok()) {
      st_.status()["completionTime"] = st_.now();  // the TTL counts from now
      RequeueWithin(seconds(*policy.ttl_seconds_after_finished));
    } else {
      const WallTime due = *done + seconds(*policy.ttl_seconds_after_finished);
      if (o_.now >= due) {
        a_.delete_job = true;
      } else {
        RequeueWithin(duration_cast<milliseconds>(due - o_.now));
      }
    }
  }
  return Finish();
}

JobActions Decider::Run() {
  if (Terminating(o_.job)) return {};  // the garbage collector removes the children
  LookAgainAtARejectedSpec();
  if (plan_ == nullptr) return AwaitPlan();
  if (st_.IsTrue("Succeeded") || st_.IsTrue("Failed")) return Finished();
  const auto& spec = plan_->spec;
  if (!spec.ok()) return Fail("InvalidSpec", spec.status().message(), CleanPodPolicy::kAll);
  const auto& sizing = plan_->sizing;
  if (!sizing.ok()) return Fail("InvalidSpec", sizing.status().message(), CleanPodPolicy::kAll);
  spec_ = &*spec;
  sizing_ = &*sizing;
  RecordPlan();
  if (spec_->run_policy.suspend) return Suspend();
  if (st_.IsTrue("Suspended")) Resume();
  pods_ = ClassifyPods(o_.pods, restarts_, spec_->num_nodes);
  a_.delete_pods = pods_.stale_to_delete;
  if (pods_.ahead) {
    RequeueWithin(milliseconds(200));  // the cached job is behind its own pods
    return Finish();
  }
  if (std::optional<JobActions> ended = EndAttemptOnFailure()) return std::move(*ended);
  const GangCounts counts = CountGang(pods_.gang);
  if (counts.succeeded == spec_->num_nodes) return Succeed();
  if (std::optional<JobActions> late = FailPastDeadline()) return std::move(*late);
  if (!AddChildren()) return Finish();
  if (pods_.stale) {
    // Not while pods of an older attempt are still going away.
    SetPhase(restarts_ > 0 ? kPhaseRestarting : kPhasePending);
    SetNoRankReady();
    return Finish();
  }
  if (!st_.IsTrue("Running")) CheckNodeFitOfTheGang();
  const int missing = AddMissingPods();
  SetCreated(missing);
  SetRunning(counts);
  return Finish();
}

void Decider::LookAgainAtARejectedSpec() {
  // A spec rejected at an older generation is looked at afresh once edited.
  const Json* failed = st_.Find("Failed");
  if (failed != nullptr && failed->value("status", "") == "True" && failed->value("reason", "") == "InvalidSpec" &&
      failed->value("observedGeneration", int64_t(0)) < generation_) {
    st_.Remove("Failed");
    st_.status().erase("completionTime");
    SetPhase(kPhasePending);
  }
}

JobActions Decider::AwaitPlan() {
  // Being sized (JobPlanner): a new job shows Pending meanwhile; a known one
  // keeps its status until the new generation's plan is made. (Not
  // observedGeneration: nothing of the spec was acted on.)
  if (st_.status().contains("phase")) return {};
  SetPhase(kPhasePending);
  a_.status = st_.status();
  return std::move(a_);
}

void Decider::RecordPlan() {
  Json& s = st_.status();
  if (!o_.progress.is_null()) s["progress"] = o_.progress;
  s["worldSize"] = spec_->world_size();
  s["memory"] = SizingStatus(*sizing_);
  if (!s.contains("restarts")) s["restarts"] = 0;
  restarts_ = Int(s, "/restarts", 0);  // gang attempts so far: the pods' attempt label
  // Restarts that count against backoffLimit: those after a rank failed, not
  // those after a spec edit or a pod deleted from outside (a drain, an
  // eviction). A status written before this field existed counts them all.
  failed_restarts_ = s.contains("failedRestarts") ? Int(s, "/failedRestarts", 0) : restarts_;
}

void Decider::SetNoRankReady() {
  Json& s = st_.status();
  s["readyRanks"] = 0;
  s["ready"] = "0/" + std::to_string(spec_->world_size());
}

JobActions Decider::Suspend() {
  DeleteAllPods();
  st_.Set("Suspended", true, "JobSuspended", "the job is suspended; its pods are deleted");
  st_.Set("Running", false, "JobSuspended", "the job is suspended");
  st_.Set("Restarting", false, "JobSuspended", "the job is suspended");
  SetPhase(kPhaseSuspended);
  SetNoRankReady();
  return Finish();
}

void Decider::Resume() {
  st_.Set("Suspended", false, "JobResumed", "the job is resumed");
  st_.status().erase("startTime");  // the active deadline counts from the resume
}

std::string Decider::AttemptEndingEvent(const GangFailure& failure, bool* spec_changed) const {
  if (failure.pod != nullptr) return FailureText(*failure.pod);
  if (const Json* changed = ChangedPod(pods_.gang, *spec_, *sizing_, int(restarts_)); changed != nullptr) {
    *spec_changed = true;
    return "the spec changed since pod " + NameOf(*changed) + " was created";
  }
  if (pods_.deleted != nullptr) return "pod " + NameOf(*pods_.deleted) + " is being deleted";
  if (st_.IsTrue("Running") && !pods_.stale && int(pods_.gang.size()) < spec_->num_nodes) {
    // A pod of a running gang vanished (deleted, or its node was lost): the
    // others cannot go on without its ranks.
    for (int i = 0; i < spec_->num_nodes; ++i) {
      if (!pods_.gang.count(i)) return "pod " + PodName(*spec_, i) + " disappeared";
    }
  }
  return "";
}

std::optional<JobActions> Decider::EndAttemptOnFailure() {
  // A failed rank ends the attempt: the whole gang restarts or the job fails.
  const RunPolicy& policy = spec_->run_policy;
  const GangFailure failed = FirstFailure(pods_.gang, policy);
  // An OOM kill decides before any other failure: restarting with the same
  // limit would end the same way.
  if (const Json* oom = OomKilledPod(pods_.gang); oom != nullptr) {
    return Fail("OutOfMemory", OutOfMemoryText(*oom, *spec_, *sizing_), policy.clean_pod_policy);
  }
  bool spec_changed = false;  // restarts the gang whatever the backoff limit
  const std::string failure = AttemptEndingEvent(failed, &spec_changed);
  if (failure.empty()) return std::nullopt;
  const bool rank_failed = failed.pod != nullptr;  // counts against the backoff limit
  if (failed.permanent) {
    return Fail("PermanentFailure", failure + ", a permanent exit code; the job is not restarted",
                policy.clean_pod_policy);
  }
  if (rank_failed && failed_restarts_ >= policy.backoff_limit) {
    return Fail("BackoffLimitExceeded",
                failure + "; the gang was already restarted " + std::to_string(failed_restarts_) +
                    " times after a failure (backoffLimit " + std::to_string(policy.backoff_limit) + ")",
                policy.clean_pod_policy);
  }
  Json& s = st_.status();
  s["restarts"] = restarts_ + 1;
  s["failedRestarts"] = failed_restarts_ + (rank_failed ? 1 : 0);
  s["lastRestartTime"] = st_.now();
  const std::string message =
      failure + "; restarting all " + std::to_string(spec_->num_nodes) + " pods" +
      (rank_failed ? " (restart " + std::to_string(failed_restarts_ + 1) + " of " +
                         std::to_string(policy.backoff_limit) + " after failures)"
                   : " (not counted against backoffLimit)");
  const char* reason = spec_changed ? "SpecChanged" : rank_failed ? "RankFailed" : "PodDeleted";
  st_.Set("Restarting", true, reason, message);
  st_.Set("Running", false, reason, failure);
  SetPhase(kPhaseRestarting);
  SetNoRankReady();
  DeleteAllPods();
  return Finish();
}

JobActions Decider::Succeed() {
  const RunPolicy& policy = spec_->run_policy;
  const std::string message = "all " + std::to_string(spec_->world_size()) + " ranks finished";
  st_.Set("Succeeded", true, "JobSucceeded", message);
  st_.Set("Running", false, "JobSucceeded", message);
  st_.Set("Restarting", false, "JobSucceeded", message);
  SetPhase(kPhaseSucceeded);
  Json& s = st_.status();
  if (!s.contains("completionTime")) s["completionTime"] = st_.now();
  SetNoRankReady();
  CleanUp(policy.clean_pod_policy);
  if (policy.ttl_seconds_after_finished) RequeueWithin(seconds(*policy.ttl_seconds_after_finished));
  return Finish();
}

std::optional<JobActions> Decider::FailPastDeadline() {
  const std::optional<int64_t>& deadline = spec_->run_policy.active_deadline_seconds;
  if (!deadline) return std::nullopt;
  auto start = ParseTime(JsonString(st_.status(), "/startTime"));
  if (!start.ok()) return std::nullopt;
  const WallTime due = *start + seconds(*deadline);
  if (o_.now >= due) {
    return Fail("DeadlineExceeded",
                "the job ran longer than activeDeadlineSeconds (" + std::to_string(*deadline) + " s)",
                CleanPodPolicy::kRunning);
  }
  RequeueWithin(duration_cast<milliseconds>(due - o_.now));
  return std::nullopt;
}

bool Decider::AddChildren() {
  // Service and ConfigMap, the store token's Secret, the NetworkPolicy.
  if (!o_.service_exists) a_.create.push_back(DesiredService(*spec_));
  const Json config_map = DesiredConfigMap(*spec_);
  if (o_.config_map.is_null()) {
    a_.create.push_back(config_map);
  } else if (o_.config_map.value("data", Json::object()) != config_map["data"] && pods_.gang.empty()) {
    // The config changed: the next gang must read the new one.
    Json updated = o_.config_map;
    updated["data"] = config_map["data"];
    a_.replace.push_back(std::move(updated));
  }
  if (!o_.store_token_exists) {
    if (o_.fresh_store_token.empty()) return false;  // the shell always gives one; a unit test may not
    a_.create.push_back(DesiredStoreTokenSecret(*spec_, o_.fresh_store_token));
  }
  if (defaults_.network_policy.enabled && !o_.network_policy_exists) {
    a_.create.push_back(DesiredNetworkPolicy(*spec_, defaults_.network_policy));
  }
  return true;
}

void Decider::CheckNodeFitOfTheGang() {
  // Until the gang runs: can today's nodes hold it? Advisory only: the pods
  // are created either way, since a cluster autoscaler (or Karpenter) adds
  // nodes only for pods that wait. Nodes changing enqueue no job, so a gang
  // that does not fit is looked at again.
  const NodeFit fit = CheckNodeFit(*spec_, *sizing_, o_.nodes);
  st_.status()["nodeFit"] = fit.message;
  if (!fit.fits) {
    const std::string message = fit.message + "; the pods are created and wait for a node";
    const Json* before = st_.Find("Schedulable");
    if (before == nullptr || before->value("message", "") != message) {
      a_.events.push_back({"Warning", fit.reason, message});
    }
    st_.Set("Schedulable", false, fit.reason, message, /*list=*/true);
    RequeueWithin(kNodeFitRetry);
  } else if (st_.Find("Schedulable") != nullptr) {
    st_.Set("Schedulable", true, fit.reason, fit.message);
  }
}

int Decider::AddMissingPods() {
  // Gang scheduling: the PodGroup goes before a new gang's pods (it is made
  // once per job and kept across attempts: 409 on a later gang).
  const GangSchedulingOptions& gang_options = defaults_.gang;
  const bool gang_scheduled = gang_options.scheduler != GangScheduler::kNone && o_.gang_api_served;
  if (pods_.gang.empty() && gang_options.scheduler != GangScheduler::kNone) {
    if (!gang_scheduled) {
      a_.events.push_back({"Warning", "GangSchedulingUnavailable",
                           std::string("the cluster does not serve ") + GangApiGroupVersion(gang_options.scheduler) +
                               " (" + GangSchedulerName(gang_options.scheduler) +
                               "): the pods are scheduled one by one"});
    } else if (gang_options.scheduler != GangScheduler::kKueue) {
      a_.create.push_back(DesiredPodGroup(*spec_, *sizing_, gang_options));
    }
  }
  int missing = 0;
  for (int i = 0; i < spec_->num_nodes; ++i) {
    if (pods_.gang.count(i)) continue;
    Json pod = PodWithHash(*spec_, *sizing_, i, int(restarts_));
    if (gang_scheduled) ApplyGangScheduling(*spec_, gang_options, int(restarts_), &pod);
    a_.create.push_back(std::move(pod));
    ++missing;
  }
  if (!st_.status().contains("startTime")) st_.status()["startTime"] = st_.now();
  return missing;
}

void Decider::SetCreated(int missing) {
  // Created says what the cluster shows: true once every pod of the gang is
  // seen, not when its creation is merely asked for. A refused create (a
  // quota, an admission webhook) stays visible here, one event per new error.
  auto pods_text = [](int n) { return std::to_string(n) + (n == 1 ? " pod" : " pods"); };
  const int world = spec_->world_size();
  if (missing == 0) {
    st_.Set("Created", true, "PodsCreated",
            "created " + pods_text(spec_->num_nodes) + " for " + std::to_string(world) +
                (world == 1 ? " rank" : " ranks"));
  } else if (!o_.create_failure.empty()) {
    const std::string message = "cannot create " + pods_text(missing) + ": " + o_.create_failure;
    const Json* created = st_.Find("Created");
    if (created == nullptr || created->value("message", "") != message) {
      a_.events.push_back({"Warning", "CreateFailed", message});
    }
    st_.Set("Created", false, "CreateFailed", message, /*list=*/true);
  } else if (!st_.IsTrue("Created")) {
    st_.Set("Created", false, "CreatingPods",
            "creating " + pods_text(missing) + " of " + std::to_string(spec_->num_nodes), /*list=*/true);
  }
}

void Decider::SetRunning(const GangCounts& counts) {
  Json& s = st_.status();
  const int world = spec_->world_size();
  s["readyRanks"] = counts.ready * spec_->nproc_per_node;
  s["ready"] = std::to_string(counts.ready * spec_->nproc_per_node) + "/" + std::to_string(world);
  if (counts.running + counts.succeeded == spec_->num_nodes && counts.running > 0) {
    const std::string message = "all " + std::to_string(world) + " ranks are running";
    st_.Set("Running", true, "AllRanksRunning", message);
    st_.Set("Restarting", false, "AllRanksRunning", message);
    SetPhase(kPhaseRunning);
  } else if (!st_.IsTrue("Running")) {
    SetPhase(st_.IsTrue("Restarting") ? kPhaseRestarting : st_.IsTrue("Created") ? kPhaseCreated : kPhasePending);
  }
}

}  // namespace

std::shared_ptr<const JobPlan> PlanJob(const Json& job) {
  Result<JobSpec> spec = ParseJob(job);
  Result<PodSizing> sizing = spec.ok() ? SizePods(*spec) : Result<PodSizing>(spec.status());
  return std::make_shared<const JobPlan>(JobPlan{std::move(spec), std::move(sizing)});
}

JobActions DecideJobActions(const JobObservation& observed, const OperatorDefaults& defaults) {
  return Decider(observed, defaults).Run();
}

}  // namespace pstar::op
