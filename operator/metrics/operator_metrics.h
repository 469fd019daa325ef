// OperatorMetrics: the operator's Prometheus series and its health endpoints.
// One HTTP endpoint serves /metrics, /healthz (the process and its loops are
// alive) and /readyz (the caches are synced). Counters are recorded as work
// happens; the queue depth, jobs by phase, each job's phase and restarts, watch
// restarts and leadership are read from the running parts at scrape time.
// docs/operator.md lists them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/core/status.h"
#include "worker/metrics/http_endpoint.h"

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pstar::op {

// One job as the operator's cache holds it: exported per job so dashboards
// can pick one job (one series per job and metric, the current phase only).
struct JobSnapshot {
  std::string ns, name;
  std::string phase;     // status.phase ("Pending" before the first status)
  int64_t restarts = 0;  // status.restarts
};

// What the scrape reads from the running operator.
struct OperatorSnapshot {
  int64_t queue_depth = 0;
  std::map<std::string, int64_t> jobs_by_phase;     // phase -> jobs
  std::vector<JobSnapshot> jobs;                    // every job in the cache
  std::map<std::string, int64_t> watch_restarts;    // resource -> watch restarts
  std::map<std::string, int64_t> relists;           // resource -> relists after 410
  bool leader = false;
};

struct OperatorMetricsOptions {
  std::string bind_address = "0.0.0.0";
  int port = 8080;  // 0: the OS picks one (tests)
  std::function<OperatorSnapshot()> snapshot;
  std::function<bool()> healthy;  // /healthz
  std::function<bool()> ready;    // /readyz
  // Also serve every series under its name before the one prefix of both
  // binaries (pstar_operator_* for patrickstar_operator_*), so dashboards
  // and alerts written against the old names keep working while they move.
  // Deprecated: to be removed.
  bool legacy_names = false;
};

class OperatorMetrics {
 public:
  static Result<std::unique_ptr<OperatorMetrics>> Start(OperatorMetricsOptions options);
  ~OperatorMetrics();
  OperatorMetrics(const OperatorMetrics&) = delete;
  OperatorMetrics& operator=(const OperatorMetrics&) = delete;

  int port() const { return endpoint_->port(); }

  // One reconcile of one job: "success", "requeue" (a conflict or a stale
  // view) or "error".
  void RecordReconcile(const std::string& result, std::chrono::nanoseconds took);
  // An API call that failed, by verb and resource.
  void RecordApiError(const std::string& verb, const std::string& resource);
  void RecordGangRestart();
  void RecordEvent(const std::string& type);

  // The exposition text, as /metrics serves it (tests).
  std::string Render() const;

 private:
  class SnapshotCollector;
  OperatorMetrics() = default;

  bool legacy_names_ = false;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<SnapshotCollector> collector_;
  prometheus::Family<prometheus::Counter>* reconciles_ = nullptr;
  prometheus::Family<prometheus::Counter>* api_errors_ = nullptr;
  prometheus::Family<prometheus::Counter>* events_ = nullptr;
  prometheus::Counter* restarts_ = nullptr;
  prometheus::Histogram* durations_ = nullptr;
  std::unique_ptr<HttpEndpoint> endpoint_;
};

}  // namespace pstar::op
