#include "operator/metrics/operator_metrics.h"

#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "worker/core/build_info.h"
#include "worker/metrics/process_metrics.h"

namespace pstar::op {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const std::string& name, const std::string& help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

ClientMetric Sample(const std::map<std::string, std::string>& labels, double value, MetricType type) {
  ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// The phases every job can be in: each is exported (0 when empty) so that
// dashboards see a stable set of series.
constexpr const char* kPhases[] = {"Pending", "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"};

}  // namespace

class OperatorMetrics::SnapshotCollector : public prometheus::Collectable {
 public:
  explicit SnapshotCollector(std::function<OperatorSnapshot()> snapshot) : snapshot_(std::move(snapshot)) {}

  std::vector<MetricFamily> Collect() const override {
    if (!snapshot_) return {};
    const OperatorSnapshot s = snapshot_();
    std::vector<MetricFamily> out;
    MetricFamily depth = Family("patrickstar_operator_workqueue_depth", "Jobs waiting in the work queue.", MetricType::Gauge);
    depth.metric.push_back(Sample({}, double(s.queue_depth), MetricType::Gauge));
    out.push_back(std::move(depth));
    MetricFamily jobs = Family("patrickstar_operator_jobs", "PatrickStarJobs by status.phase.", MetricType::Gauge);
    std::map<std::string, int64_t> phases = s.jobs_by_phase;
    for (const char* p : kPhases) phases.emplace(p, 0);
    for (const auto& [phase, n] : phases) jobs.metric.push_back(Sample({{"phase", phase}}, double(n), MetricType::Gauge));
    out.push_back(std::move(jobs));
    // Per job: only the current phase has a series (value 1), so each job
    // costs one series here and one for its restarts.
    MetricFamily job_phase = Family("patrickstar_operator_job_phase",
                                    "1 for each PatrickStarJob's current status.phase, by namespace and name.",
                                    MetricType::Gauge);
    MetricFamily job_restarts = Family("patrickstar_operator_job_restarts",
                                       "Each PatrickStarJob's gang restarts (status.restarts), by namespace and name.",
                                       MetricType::Gauge);
    for (const JobSnapshot& j : s.jobs) {
      job_phase.metric.push_back(
          Sample({{"namespace", j.ns}, {"name", j.name}, {"phase", j.phase}}, 1, MetricType::Gauge));
      job_restarts.metric.push_back(Sample({{"namespace", j.ns}, {"name", j.name}}, double(j.restarts), MetricType::Gauge));
    }
    out.push_back(std::move(job_phase));
    out.push_back(std::move(job_restarts));
    MetricFamily watches = Family("patrickstar_operator_watch_restarts_total",
                                  "Watch streams restarted after they ended or failed, by resource.",
                                  MetricType::Counter);
    for (const auto& [r, n] : s.watch_restarts) watches.metric.push_back(Sample({{"resource", r}}, double(n), MetricType::Counter));
    out.push_back(std::move(watches));
    MetricFamily relists = Family("patrickstar_operator_relists_total",
                                  "Lists after the first (a watch's resourceVersion expired, or a failed list retried), by resource.",
                                  MetricType::Counter);
    for (const auto& [r, n] : s.relists) relists.metric.push_back(Sample({{"resource", r}}, double(n), MetricType::Counter));
    out.push_back(std::move(relists));
    MetricFamily leader = Family("patrickstar_operator_leader", "1 while this replica holds the leader lease.", MetricType::Gauge);
    leader.metric.push_back(Sample({}, s.leader ? 1 : 0, MetricType::Gauge));
    out.push_back(std::move(leader));
    MetricFamily info = Family("patrickstar_operator_build_info", "The operator's version.", MetricType::Gauge);
    info.metric.push_back(Sample({{"version", kPstarVersion}}, 1, MetricType::Gauge));
    out.push_back(std::move(info));
    // The standard process series, as the workers export them.
    for (MetricFamily& f : ProcessMetricFamilies()) out.push_back(std::move(f));
    return out;
  }

 private:
  std::function<OperatorSnapshot()> snapshot_;
};

Result<std::unique_ptr<OperatorMetrics>> OperatorMetrics::Start(OperatorMetricsOptions options) {
  auto m = std::unique_ptr<OperatorMetrics>(new OperatorMetrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->reconciles_ = &prometheus::BuildCounter()
                        .Name("patrickstar_operator_reconciles_total")
                        .Help("Reconciles of PatrickStarJobs, by result (success, requeue, error).")
                        .Register(*m->registry_);
  for (const char* r : {"success", "requeue", "error"}) m->reconciles_->Add({{"result", r}});
  m->api_errors_ = &prometheus::BuildCounter()
                        .Name("patrickstar_operator_api_errors_total")
                        .Help("Kubernetes API calls that failed, by verb and resource.")
                        .Register(*m->registry_);
  m->events_ = &prometheus::BuildCounter()
                    .Name("patrickstar_operator_events_total")
                    .Help("Kubernetes Events recorded for jobs, by type (Normal, Warning).")
                    .Register(*m->registry_);
  m->restarts_ = &prometheus::BuildCounter()
                      .Name("patrickstar_operator_gang_restarts_total")
                      .Help("Gang restarts: every pod of a job deleted and recreated after a rank failed.")
                      .Register(*m->registry_)
                      .Add({});
  m->durations_ = &prometheus::BuildHistogram()
                       .Name("patrickstar_operator_reconcile_duration_seconds")
                       .Help("Time one reconcile of one job took.")
                       .Register(*m->registry_)
                       .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                        0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  m->collector_ = std::make_shared<SnapshotCollector>(std::move(options.snapshot));
  m->legacy_names_ = options.legacy_names;
  const OperatorMetrics* raw = m.get();
  auto probe = [](std::function<bool()> check, std::string what) {
    return [check = std::move(check), what = std::move(what)] {
      const bool ok = !check || check();
      return HttpEndpoint::Reply{ok ? 200 : 503, ok ? "ok\n" : what + "\n", "text/plain; charset=utf-8"};
    };
  };
  HttpEndpoint::Routes routes = {
      {"/metrics", [raw] { return HttpEndpoint::Reply{200, raw->Render()}; }},
      {"/healthz", probe(std::move(options.healthy), "unhealthy: a control loop stopped")},
      {"/readyz", probe(std::move(options.ready), "not ready: the caches are not synced yet")},
  };
  auto endpoint = HttpEndpoint::Start(options.bind_address, options.port, std::move(routes));
  if (!endpoint.ok()) return endpoint.status();
  m->endpoint_ = std::move(endpoint).value();
  return m;
}

OperatorMetrics::~OperatorMetrics() = default;

void OperatorMetrics::RecordReconcile(const std::string& result, std::chrono::nanoseconds took) {
  reconciles_->Add({{"result", result}}).Increment();
  durations_->Observe(std::chrono::duration<double>(took).count());
}

void OperatorMetrics::RecordApiError(const std::string& verb, const std::string& resource) {
  api_errors_->Add({{"verb", verb}, {"resource", resource}}).Increment();
}

void OperatorMetrics::RecordGangRestart() { restarts_->Increment(); }

void OperatorMetrics::RecordEvent(const std::string& type) { events_->Add({{"type", type}}).Increment(); }

std::string OperatorMetrics::Render() const {
  std::vector<MetricFamily> families = registry_->Collect();
  for (MetricFamily& f : collector_->Collect()) families.push_back(std::move(f));
  if (legacy_names_) {
    const std::string prefix = "patrickstar_operator_";
    const size_t count = families.size();
    for (size_t i = 0; i < count; ++i) {
      if (families[i].name.compare(0, prefix.size(), prefix) != 0) continue;
      MetricFamily old = families[i];
      old.name = "pstar_operator_" + old.name.substr(prefix.size());
      old.help = "Deprecated name of " + families[i].name + ". " + old.help;
      families.push_back(std::move(old));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace pstar::op
