// JobReconciler: the PatrickStarJob controller loop. Informers keep caches of
// the jobs, of the pods, services, config maps, secrets and network policies
// the operator manages, and of the nodes; every change enqueues the owning job's key, and workers reconcile
// keys one at a time each: observe from the caches, DecideJobActions, then
// write the status (with the job's resourceVersion), delete, create and record
// events. Level-triggered and idempotent: children have deterministic names,
// so a reconcile repeated after a crash or a stale cache creates nothing twice.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/informer.h"
#include "operator/controller/work_queue.h"
#include "operator/job/desired_objects.h"
#include "operator/kube/kube_client.h"
#include "operator/metrics/operator_metrics.h"
#include "operator/reconciler/job_actions.h"
#include "operator/reconciler/job_planner.h"
#include "operator/reconciler/progress_poller.h"

namespace pstar::op {

struct ReconcilerOptions {
  std::string watch_namespace;  // "" = every namespace
  int workers = 4;
  OperatorDefaults defaults;
  std::string identity = "pstar-operator";  // the events' reportingInstance
  bool watch_nodes = true;  // check pods' host memory against the nodes
  // Jobs are parsed and sized by these threads, off the workers (PlanJob
  // when `planner` is empty; tests give their own).
  int planner_threads = 2;
  JobPlanner::PlanFn planner;
  // status.progress from each running job's rank-0 metrics endpoint.
  bool poll_progress = true;
  ProgressPoller::Options progress;
};

class JobReconciler {
 public:
  // `metrics` may be null. The client must outlive the reconciler.
  JobReconciler(KubeClient& client, ReconcilerOptions options, OperatorMetrics* metrics);
  ~JobReconciler();
  JobReconciler(const JobReconciler&) = delete;
  JobReconciler& operator=(const JobReconciler&) = delete;

  // Starts the informers, waits for their first lists, then the workers.
  // Fails when the caches do not sync within `sync_timeout`.
  Status Start(std::chrono::milliseconds sync_timeout);
  // Stops the workers and informers (a reconcile in progress finishes), and
  // a Start still waiting for the caches. Safe to call from another thread.
  void Stop();

  bool Synced() const;
  OperatorSnapshot Snapshot() const;

  // Reconciles one job now, on the calling thread ("ns/name"); what the
  // workers do for each key. Returns when to look again (nullopt: only on
  // the next change); errors are returned for the queue's backoff.
  Result<std::optional<std::chrono::milliseconds>> ReconcileKey(const std::string& key);

 private:
  void RunWorker();
  void EnqueueOwner(const Json& child);
  // An event on the owning job when a pod's phase turns Succeeded or Failed:
  // ExitedWithCode, with the exit code and the container's reason (OOMKilled).
  void RecordPodExit(const Json& before, const Json& after);
  JobObservation Observe(const Json& job);
  // Whether the cluster serves the gang scheduler's API, looked up at most
  // once per kGangApiRecheck (a scheduler installed later is picked up).
  bool GangApiServed();
  static constexpr std::chrono::seconds kGangApiRecheck{30};
  void RecordEvents(const Json& job, const std::vector<JobEvent>& events);
  Status ApiFailure(const std::string& verb, const ResourceRef& ref, const ApiResponse& response);

  KubeClient& client_;
  const ReconcilerOptions options_;
  OperatorMetrics* metrics_;
  WorkQueue queue_;
  std::unique_ptr<Informer> jobs_, pods_, services_, config_maps_, secrets_, network_policies_, nodes_;
  std::vector<std::thread> workers_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  std::mutex lifecycle_mu_;  // Start's launch of the workers vs Stop

  // A job's resourceVersion just before this operator wrote its status: while
  // the cache still shows it, the cache has not caught up with the write and
  // acting on it could repeat the write's decision (a second restart).
  mutable std::mutex mu_;
  std::map<std::string, std::string> superseded_rv_;
  // Per job key: why its pods' last create was refused (JobObservation::
  // create_failure), and per job key and kind the refusal last reported as
  // an event, so that a create refused on every retry is reported once.
  std::map<std::string, std::string> create_failures_;
  std::map<std::string, std::string> reported_refusals_;
  std::atomic<uint64_t> event_seq_{0};
  std::mutex gang_mu_;
  bool gang_checked_ = false;
  bool gang_api_served_ = false;
  std::chrono::steady_clock::time_point gang_checked_at_;
  std::unique_ptr<JobPlanner> planner_;  // declared last: their threads call into the queue
  std::unique_ptr<ProgressPoller> progress_;
};

}  // namespace pstar::op
