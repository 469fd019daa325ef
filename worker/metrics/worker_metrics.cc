#include "worker/metrics/worker_metrics.h"

#include <atomic>
#include <cerrno>
#include <exception>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "worker/core/build_info.h"
#include "worker/metrics/process_metrics.h"
#include "worker/metrics/http_endpoint.h"

namespace pstar {
namespace {

using prometheus::ClientMetric;
using prometheus::Labels;
using prometheus::MetricFamily;
using prometheus::MetricType;

#ifdef PSTAR_WITH_CUDA
constexpr const char* kCudaBuilt = "true";
#else
constexpr const char* kCudaBuilt = "false";
#endif

// Step durations from a millisecond (tiny CPU tests) to ten minutes (large
// models offloading most of their state).
std::vector<double> StepBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1,     2.5,    5,     10,   25,    50,   100, 250,  600};
}

double Load(const RuntimeCounters::Counter& c) {
  return static_cast<double>(c.load(std::memory_order_relaxed));
}

}  // namespace

// The chunk series, built from the runtime's counters at each scrape.
class WorkerMetrics::RuntimeCollector : public prometheus::Collectable {
 public:
  RuntimeCollector(Labels constant, bool device_label)
      : constant_(std::move(constant)), device_label_(device_label) {}

  bool Attach(const RuntimeCounters* counters) {
    const RuntimeCounters* none = nullptr;
    return counters_.compare_exchange_strong(none, counters);
  }
  bool Attach(const CollectiveCounters* counters) {
    const CollectiveCounters* none = nullptr;
    return collectives_.compare_exchange_strong(none, counters);
  }

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out = CollectChunks();
    for (MetricFamily& f : CollectCollectives()) out.push_back(std::move(f));
    for (MetricFamily& f : CollectProcess()) out.push_back(std::move(f));
    return out;
  }

 private:
  // The standard process series, with the worker's constant labels.
  std::vector<MetricFamily> CollectProcess() const { return ProcessMetricFamilies(constant_); }

  // Per op that has run: payload bytes sent and seconds spent.
  std::vector<MetricFamily> CollectCollectives() const {
    const CollectiveCounters* c = collectives_.load(std::memory_order_acquire);
    if (c == nullptr) return {};
    MetricFamily bytes = Family("patrickstar_collective_bytes_total",
                                "Payload bytes of collectives on this rank, by op.", MetricType::Counter);
    MetricFamily seconds = Family("patrickstar_collective_seconds_total", "Seconds spent in collectives, by op.",
                                  MetricType::Counter);
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      if (c->calls[size_t(op)].load(std::memory_order_relaxed) == 0) continue;
      const Labels labels = {{"op", CollectiveOpName(static_cast<CollectiveOp>(op))}};
      bytes.metric.push_back(Sample(labels, Load(c->bytes[size_t(op)]), MetricType::Counter));
      seconds.metric.push_back(Sample(labels, Load(c->nanoseconds[size_t(op)]) * 1e-9, MetricType::Counter));
    }
    if (bytes.metric.empty()) return {};
    std::vector<MetricFamily> out;
    out.push_back(std::move(bytes));
    out.push_back(std::move(seconds));
    return out;
  }

  std::vector<MetricFamily> CollectChunks() const {
    const RuntimeCounters* c = counters_.load(std::memory_order_acquire);
    if (c == nullptr) return {};

    MetricFamily bytes = Family("patrickstar_chunk_resident_bytes",
                                "Bytes of chunk copies held on each tier, by state kind.",
                                MetricType::Gauge);
    MetricFamily chunks = Family("patrickstar_chunk_resident_chunks",
                                 "Chunk copies held on each tier, by state kind.", MetricType::Gauge);
    for (int t = 0; t < kNumTiers; ++t) {
      if (!Exported(static_cast<Tier>(t), *c)) continue;
      for (int k = 0; k < kNumStateKinds; ++k) {
        Labels labels = TierLabels(static_cast<Tier>(t));
        labels["kind"] = StateKindName(static_cast<StateKind>(k));
        bytes.metric.push_back(Sample(labels, Load(c->resident_bytes[t][k]), MetricType::Gauge));
        chunks.metric.push_back(Sample(labels, Load(c->resident_chunks[t][k]), MetricType::Gauge));
      }
    }

    MetricFamily non_model = Family("patrickstar_non_model_bytes",
                                    "Bytes of activations and workspaces held on each tier.",
                                    MetricType::Gauge);
    for (int t = 0; t < kNumTiers; ++t) {
      if (static_cast<Tier>(t) == Tier::kDisk) continue;  // activations never go to disk
      non_model.metric.push_back(Sample(TierLabels(static_cast<Tier>(t)), Load(c->non_model_bytes[t]),
                                        MetricType::Gauge));
    }
    MetricFamily capacity = Family("patrickstar_device_capacity_bytes",
                                   "Capacity of the device tier in bytes.", MetricType::Gauge);
    capacity.metric.push_back(Sample({}, Load(c->device_capacity_bytes), MetricType::Gauge));
    MetricFamily budget = Family("patrickstar_chunk_budget_bytes",
                                 "Bytes of the device tier that chunks may use now.", MetricType::Gauge);
    budget.metric.push_back(Sample({}, Load(c->chunk_budget_bytes), MetricType::Gauge));

    MetricFamily moves = Family("patrickstar_chunk_moves_total",
                                "Chunk copies between the tiers, by direction.", MetricType::Counter);
    MetricFamily moved = Family("patrickstar_chunk_moved_bytes_total",
                                "Bytes of chunk copies between the tiers, by direction.",
                                MetricType::Counter);
    for (int d = 0; d < kNumDirections; ++d) {
      const Labels labels = {{"direction", DirectionName(static_cast<Direction>(d))}};
      moves.metric.push_back(Sample(labels, Load(c->moves[d]), MetricType::Counter));
      moved.metric.push_back(Sample(labels, Load(c->moved_bytes[d]), MetricType::Counter));
    }

    MetricFamily evictions = Family("patrickstar_chunk_evictions_total",
                                    "Device chunk copies evicted to make room, by state kind.",
                                    MetricType::Counter);
    for (int k = 0; k < kNumStateKinds; ++k) {
      evictions.metric.push_back(Sample({{"kind", StateKindName(static_cast<StateKind>(k))}},
                                        Load(c->evictions[k]), MetricType::Counter));
    }
    MetricFamily prefetches = Family("patrickstar_chunk_prefetches_total",
                                     "Chunks brought to the device ahead of their use.",
                                     MetricType::Counter);
    prefetches.metric.push_back(Sample({}, Load(c->prefetches), MetricType::Counter));
    MetricFamily hits = Family("patrickstar_chunk_prefetch_hits_total",
                               "Chunk accesses that found a prefetched copy on the device.",
                               MetricType::Counter);
    hits.metric.push_back(Sample({}, Load(c->prefetch_hits), MetricType::Counter));

    std::vector<MetricFamily> out;
    for (MetricFamily* f : {&bytes, &chunks, &non_model, &capacity, &budget, &moves, &moved,
                            &evictions, &prefetches, &hits}) {
      out.push_back(std::move(*f));
    }
    if (Load(c->disk_tier) != 0) {
      const Labels disk = TierLabels(Tier::kDisk);
      MetricFamily read = Family("patrickstar_chunk_tier_read_bytes_total",
                                 "Bytes of chunk homes read from the disk tier into host windows.",
                                 MetricType::Counter);
      read.metric.push_back(Sample(disk, Load(c->disk_read_bytes), MetricType::Counter));
      MetricFamily written = Family("patrickstar_chunk_tier_written_bytes_total",
                                    "Bytes of chunk homes written from host windows to the disk tier.",
                                    MetricType::Counter);
      written.metric.push_back(Sample(disk, Load(c->disk_written_bytes), MetricType::Counter));
      MetricFamily wait = Family("patrickstar_chunk_tier_wait_seconds_total",
                                 "Seconds the training thread waited for the disk tier's reads and writes.",
                                 MetricType::Counter);
      wait.metric.push_back(Sample(disk, Load(c->disk_wait_ns) * 1e-9, MetricType::Counter));
      out.push_back(std::move(read));
      out.push_back(std::move(written));
      out.push_back(std::move(wait));
    }
    for (MetricFamily& f : CollectStep(*c)) out.push_back(std::move(f));
    return out;
  }

  // The last whole step's residency and movement; none before a step ends.
  std::vector<MetricFamily> CollectStep(const RuntimeCounters& c) const {
    if (c.steps_recorded.load(std::memory_order_acquire) == 0) return {};
    MetricFamily resident = Family("patrickstar_chunk_step_resident_bytes",
                                   "Bytes of chunk copies on each tier at the end of each phase of the last step, "
                                   "by state kind.",
                                   MetricType::Gauge);
    MetricFamily moved = Family("patrickstar_chunk_step_moved_bytes",
                                "Bytes each phase of the last step copied between the tiers, by direction and "
                                "state kind.",
                                MetricType::Gauge);
    for (int p = 0; p < kNumStepPhases; ++p) {
      const char* phase = StepPhaseName(static_cast<StepPhase>(p));
      for (int t = 0; t < kNumTiers; ++t) {
        if (!Exported(static_cast<Tier>(t), c)) continue;
        for (int k = 0; k < kNumStateKinds; ++k) {
          Labels labels = TierLabels(static_cast<Tier>(t));
          labels["kind"] = StateKindName(static_cast<StateKind>(k));
          labels["phase"] = phase;
          resident.metric.push_back(
              Sample(labels, Load(c.step_resident_bytes[size_t(p)][size_t(t)][size_t(k)]), MetricType::Gauge));
        }
      }
      for (int d = 0; d < kNumDirections; ++d) {
        for (int k = 0; k < kNumStateKinds; ++k) {
          const Labels labels = {{"direction", DirectionName(static_cast<Direction>(d))},
                                 {"kind", StateKindName(static_cast<StateKind>(k))},
                                 {"phase", phase}};
          moved.metric.push_back(
              Sample(labels, Load(c.step_moved_bytes[size_t(p)][size_t(d)][size_t(k)]), MetricType::Gauge));
        }
      }
    }
    MetricFamily peak = Family("patrickstar_chunk_step_peak_bytes",
                               "Most bytes of chunk copies each tier held at once during the last step.",
                               MetricType::Gauge);
    for (int t = 0; t < kNumTiers; ++t) {
      if (!Exported(static_cast<Tier>(t), c)) continue;
      peak.metric.push_back(Sample(TierLabels(static_cast<Tier>(t)), Load(c.step_peak_bytes[size_t(t)]),
                                   MetricType::Gauge));
    }
    std::vector<MetricFamily> out;
    out.push_back(std::move(resident));
    out.push_back(std::move(moved));
    out.push_back(std::move(peak));
    return out;
  }

  static MetricFamily Family(const char* name, const char* help, MetricType type) {
    return MetricFamily{name, help, type, {}};
  }

  ClientMetric Sample(const Labels& labels, double value, MetricType type) const {
    Labels all = constant_;
    all.insert(labels.begin(), labels.end());
    ClientMetric m;
    for (const auto& [name, label_value] : all) m.label.push_back({name, label_value});
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    return m;
  }

  // Whether a tier's series are exported: the disk tier's only where the job has one.
  static bool Exported(Tier tier, const RuntimeCounters& c) { return tier != Tier::kDisk || Load(c.disk_tier) != 0; }

  // The tier of a series: `tier`, and with the deprecated option `device` too.
  Labels TierLabels(Tier tier) const {
    Labels labels = {{"tier", TierName(tier)}};
    if (device_label_) labels["device"] = TierName(tier);
    return labels;
  }

  const Labels constant_;
  const bool device_label_;
  std::atomic<const RuntimeCounters*> counters_{nullptr};
  std::atomic<const CollectiveCounters*> collectives_{nullptr};
};

Result<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Start(const MetricsOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return Status::InvalidArgument("metrics port " + std::to_string(options.port) +
                                   " is outside 0..65535");
  }
  if (options.bind_address.empty()) return Status::InvalidArgument("metrics bind address is empty");

  Labels constant = {{"rank", options.rank.empty() ? "0" : options.rank}};
  if (options.job_labels) {
    constant["job"] = options.job;
    constant["namespace"] = options.ns.empty() ? "default" : options.ns;
  }
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->runtime_ = std::make_shared<RuntimeCollector>(constant, options.device_label);
  prometheus::Registry& reg = *m->registry_;

  m->step_duration_ = &prometheus::BuildHistogram()
                           .Name("patrickstar_step_duration_seconds")
                           .Help("Wall time of each optimizer step.")
                           .Labels(constant)
                           .Register(reg)
                           .Add({}, StepBuckets());
  auto counter = [&](const char* name, const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(reg);
  };
  auto gauge = [&](const char* name, const char* help) -> prometheus::Family<prometheus::Gauge>& {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(reg);
  };
  m->steps_ = &counter("patrickstar_steps_total", "Optimizer steps recorded.").Add({});
  m->tokens_ = &counter("patrickstar_tokens_total", "Training tokens consumed.").Add({});
  m->skipped_steps_ =
      &counter("patrickstar_skipped_steps_total",
               "Steps whose update was skipped because of non-finite gradients.")
           .Add({});
  m->compute_seconds_ = &counter("patrickstar_step_compute_seconds_total",
                                 "Compute stream time from each step's first forward op to its last backward op.")
                             .Add({});
  m->host_adam_seconds_ =
      &counter("patrickstar_optimizer_host_seconds_total", "Host Adam work, on any thread.").Add({});
  m->update_wait_seconds_ = &counter("patrickstar_optimizer_wait_seconds_total",
                                     "Time the step thread waited for pending optimizer updates.")
                                 .Add({});
  m->collective_wait_seconds_ =
      &counter("patrickstar_collective_wait_seconds_total",
               "Time the step waited for collectives: what running them under compute did not hide.")
           .Add({});
  m->speculated_chunks_ = &counter("patrickstar_optimizer_speculated_chunks_total",
                                   "Chunk updates begun during the backward pass (optimizer_overlap speculate).")
                               .Add({});
  m->rolled_back_steps_ = &counter("patrickstar_optimizer_rolled_back_steps_total",
                                   "Steps whose speculative updates were undone (the step clipped or skipped).")
                               .Add({});
  m->loss_family_ = &gauge("patrickstar_loss", "Training loss of the last step (nats per token).");
  m->learning_rate_family_ = &gauge("patrickstar_learning_rate", "Learning rate of the last step.");
  m->grad_norm_family_ =
      &gauge("patrickstar_grad_norm", "Global gradient norm of the last step, before clipping.");
  m->loss_scale_family_ = &gauge("patrickstar_loss_scale", "Loss scale of the last step.");
  m->mfu_family_ = &gauge("patrickstar_mfu",
                          "Model FLOPs utilization of the last step, as a ratio of peak (0..1).");
  m->step_ = &gauge("patrickstar_step",
                    "Training step reached; resumed steps count, so it does not drop after a restart.")
                  .Add({});
  m->target_steps_ = &gauge("patrickstar_target_steps", "Steps the run trains to (train.steps).").Add({});
  m->world_size_ = &gauge("patrickstar_world_size", "Ranks in the job (WORLD_SIZE).").Add({});
  m->tokens_per_second_ =
      &gauge("patrickstar_tokens_per_second", "Training tokens per second of the whole job over the last step.")
           .Add({});
  m->checkpoint_family_ = &gauge("patrickstar_last_checkpoint_step", "Step of the newest checkpoint saved.");
  m->val_loss_family_ = &gauge("patrickstar_val_loss", "Validation loss of the last evaluation (nats per token).");
  m->val_step_family_ = &gauge("patrickstar_val_step", "Training step after which the last validation ran.");
  gauge("patrickstar_build_info", "Always 1; the labels describe the build.")
      .Add({{"version", kPstarVersion}, {"cuda", kCudaBuilt}})
      .Set(1);

  std::vector<std::shared_ptr<prometheus::Collectable>> sources = {m->registry_, m->runtime_};
  auto body = [sources] {
    std::vector<MetricFamily> families;
    for (const auto& source : sources) {
      for (MetricFamily& f : source->Collect()) families.push_back(std::move(f));
    }
    return HttpEndpoint::Reply{200, prometheus::TextSerializer().Serialize(families)};
  };
  PSTAR_ASSIGN_OR_RETURN(m->endpoint_, HttpEndpoint::Start(options.bind_address, options.port, {{"/metrics", body}}));
  m->port_ = m->endpoint_->port();
  return m;
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::AttachRuntimeCounters(const RuntimeCounters* counters) {
  if (counters != nullptr) runtime_->Attach(counters);
}

void WorkerMetrics::RecordStep(double seconds, int64_t tokens, double loss, double learning_rate,
                               double grad_norm, double loss_scale, double mfu) {
  // Created with their first values, so no scrape sees a zero before them.
  std::call_once(step_gauges_once_, [&] {
    loss_ = &loss_family_->Add({}, loss);
    learning_rate_ = &learning_rate_family_->Add({}, learning_rate);
    grad_norm_ = &grad_norm_family_->Add({}, grad_norm);
    loss_scale_ = &loss_scale_family_->Add({}, loss_scale);
    mfu_ = &mfu_family_->Add({}, mfu);
  });
  step_duration_->Observe(seconds);
  steps_->Increment();
  tokens_->Increment(static_cast<double>(tokens));
  loss_->Set(loss);
  learning_rate_->Set(learning_rate);
  grad_norm_->Set(grad_norm);
  loss_scale_->Set(loss_scale);
  mfu_->Set(mfu);
}

void WorkerMetrics::RecordSkippedStep() { skipped_steps_->Increment(); }

void WorkerMetrics::RecordStepWaits(double compute_seconds, double host_adam_seconds, double update_wait_seconds,
                                    int64_t speculated_chunks, bool rolled_back) {
  compute_seconds_->Increment(std::max(0.0, compute_seconds));
  host_adam_seconds_->Increment(std::max(0.0, host_adam_seconds));
  update_wait_seconds_->Increment(std::max(0.0, update_wait_seconds));
  speculated_chunks_->Increment(double(std::max<int64_t>(0, speculated_chunks)));
  if (rolled_back) rolled_back_steps_->Increment();
}

void WorkerMetrics::RecordCollectiveWait(double seconds) { collective_wait_seconds_->Increment(std::max(0.0, seconds)); }

void WorkerMetrics::SetTarget(int64_t target_steps, int64_t start_step, int world_size) {
  target_steps_->Set(double(target_steps));
  world_size_->Set(double(world_size));
  step_->Set(double(start_step));
}

void WorkerMetrics::RecordProgress(int64_t step, double tokens_per_second) {
  step_->Set(double(step));
  tokens_per_second_->Set(tokens_per_second);
}

void WorkerMetrics::RecordCheckpoint(int64_t step) {
  // Its series appears with the first checkpoint: none saved, none shown.
  std::call_once(checkpoint_once_, [&] { last_checkpoint_step_ = &checkpoint_family_->Add({}, double(step)); });
  last_checkpoint_step_->Set(double(step));
}

void WorkerMetrics::RecordValidation(int64_t step, double loss) {
  // Its series appear with the first evaluation.
  std::call_once(val_once_, [&] {
    val_loss_ = &val_loss_family_->Add({}, loss);
    val_step_ = &val_step_family_->Add({}, double(step));
  });
  val_loss_->Set(loss);
  val_step_->Set(double(step));
}

void WorkerMetrics::AttachCollectiveCounters(const CollectiveCounters* counters) {
  if (counters != nullptr) runtime_->Attach(counters);
}

}  // namespace pstar
