// WorkerMetrics: the worker's Prometheus endpoint. One HTTP endpoint per process
// serves GET /metrics; the chunk series are read from the runtime's lock-free
// and collective counters at scrape time, the step series are recorded by the
// training loop. docs/metrics.md lists every series.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/metrics/http_endpoint.h"
#include "worker/runtime/runtime_counters.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pstar {

struct MetricsOptions {
  std::string bind_address = "0.0.0.0";
  int port = 0;  // the port to listen on; 0 lets the OS pick one (tests)
  // The constant label `rank` on every series (empty: "0"). `job` and
  // `namespace` come from the scrape target; with job_labels the worker sets
  // them itself too (deprecated; an empty ns becomes "default").
  std::string job, ns, rank;
  bool job_labels = false;
  // Tier series carry `tier`; with this also `device` (its deprecated name).
  bool device_label = false;
};

class WorkerMetrics {
 public:
  // Starts the HTTP endpoint. Fails with a one-line message naming
  // address:port when it cannot listen there.
  static Result<std::unique_ptr<WorkerMetrics>> Start(const MetricsOptions& options);
  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The port the endpoint listens on.
  int port() const { return port_; }

  // Serves the chunk series from `counters`, read at each scrape so they are
  // live within a step. `counters` must outlive this object. Attach once; a
  // later call is ignored.
  void AttachRuntimeCounters(const RuntimeCounters* counters);

  // Once per optimizer step. `mfu` is a ratio (0..1).
  void RecordStep(double seconds, int64_t tokens, double loss, double learning_rate,
                  double grad_norm, double loss_scale, double mfu);
  // Where a step waited (StepStats): the compute stream's forward and
  // backward span, the host's Adam seconds, the step thread's waits for
  // pending updates; chunks speculated and whether the step undid them.
  void RecordStepWaits(double compute_seconds, double host_adam_seconds, double update_wait_seconds,
                       int64_t speculated_chunks, bool rolled_back);
  // With N ranks, per step: the seconds its threads waited for collectives
  // (StepStats::collective_wait_seconds), what overlap did not hide.
  void RecordCollectiveWait(double seconds);
  // A step whose update was skipped (non-finite gradients).
  void RecordSkippedStep();
  // The run's place: the training step reached (resumed steps included, so
  // it does not fall back after a restart), the steps it trains to, and the
  // job's tokens per second over the last step. SetTarget once at start with
  // the step it starts from and the job's world size; RecordProgress after
  // each step.
  void SetTarget(int64_t target_steps, int64_t start_step, int world_size);
  void RecordProgress(int64_t step, double tokens_per_second);
  // The step of the newest checkpoint saved.
  void RecordCheckpoint(int64_t step);
  // The validation loss measured after `step` (train.eval_every).
  void RecordValidation(int64_t step, double loss);
  // Serves the collective series from `counters` (a communicator's), read at
  // each scrape like the chunk series; an op's series appear once it has run.
  // `counters` must outlive this object. Attach once; a later call is ignored.
  void AttachCollectiveCounters(const CollectiveCounters* counters);

 private:
  class RuntimeCollector;
  WorkerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<RuntimeCollector> runtime_;

  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Counter* skipped_steps_ = nullptr;
  prometheus::Counter* compute_seconds_ = nullptr;
  prometheus::Counter* host_adam_seconds_ = nullptr;
  prometheus::Counter* update_wait_seconds_ = nullptr;
  prometheus::Counter* collective_wait_seconds_ = nullptr;
  prometheus::Counter* speculated_chunks_ = nullptr;
  prometheus::Counter* rolled_back_steps_ = nullptr;
  // Per-step gauges get their series at the first step, so no made-up zero
  // loss is shown before it.
  prometheus::Family<prometheus::Gauge>* loss_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* learning_rate_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* grad_norm_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* loss_scale_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* mfu_family_ = nullptr;
  std::once_flag step_gauges_once_;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* learning_rate_ = nullptr;
  prometheus::Gauge* grad_norm_ = nullptr;
  prometheus::Gauge* loss_scale_ = nullptr;
  prometheus::Gauge* mfu_ = nullptr;
  prometheus::Gauge* step_ = nullptr;
  prometheus::Gauge* target_steps_ = nullptr;
  prometheus::Gauge* world_size_ = nullptr;
  prometheus::Gauge* tokens_per_second_ = nullptr;
  prometheus::Family<prometheus::Gauge>* checkpoint_family_ = nullptr;
  prometheus::Gauge* last_checkpoint_step_ = nullptr;
  prometheus::Family<prometheus::Gauge>* val_loss_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* val_step_family_ = nullptr;
  prometheus::Gauge* val_loss_ = nullptr;
  prometheus::Gauge* val_step_ = nullptr;
  std::once_flag val_once_;
  std::once_flag checkpoint_once_;

  int port_ = 0;
  // Last, so it stops serving before anything it reads is destroyed.
  std::unique_ptr<HttpEndpoint> endpoint_;
};

}  // namespace pstar
