// pstar train: runs a training job from a config file or the built-in default.
#include <omp.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "worker/cli/commands.h"
#include "worker/config/config.h"
#include "worker/core/bytes.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

namespace pstar::cli {

namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void OnStopSignal(int) { g_stop_requested.store(true); }

// The Prometheus endpoint the config asks for: port + LOCAL_RANK, labelled
// with the job, namespace and rank from the environment.
Result<std::unique_ptr<WorkerMetrics>> StartMetrics(const MetricsSection& m) {
  auto env = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr && *v != '\0' ? v : fallback);
  };
  MetricsOptions options;
  options.bind_address = m.bind_address;
  options.port = int(m.port) + std::atoi(env("LOCAL_RANK", "0").c_str());
  options.job = env("PSTAR_JOB_NAME", "pstar");
  options.ns = env("PSTAR_NAMESPACE", "default");
  options.rank = env("RANK", "0");
  return WorkerMetrics::Start(options);
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  auto job = ParseJobArgs("train", args, {"--print-config"});
  if (!job.ok()) return UsageError(job.status().message());
  Result<Config> config = LoadJobConfig(*job);
  if (!config.ok()) return ReportError(config.status());
  if (job->Has("--print-config")) {
    std::fputs(ConfigToYaml(*config).c_str(), stdout);
    return kExitOk;
  }
  const std::string& config_path = job->config_path;
  const Config& c = *config;
  if (c.train.threads > 0) omp_set_num_threads(int(c.train.threads));

  std::unique_ptr<WorkerMetrics> metrics;
  if (c.metrics.port > 0) {
    auto started = StartMetrics(c.metrics);
    if (!started.ok()) return ReportError(started.status().WithPrefix("metrics"));
    metrics = std::move(started).value();
    std::printf("metrics: http://%s:%d/metrics\n", c.metrics.bind_address.c_str(), metrics->port());
  }
  auto data = OpenDataSource(c);
  if (!data.ok()) return ReportError(data.status());
  auto trainer = Trainer::Create(c, **data);
  if (!trainer.ok()) return ReportError(trainer.status());
  Trainer& t = **trainer;
  // The endpoint reads the trainer's counters: stop it before the trainer goes.
  struct StopMetricsFirst {
    std::unique_ptr<WorkerMetrics>& metrics;
    ~StopMetricsFirst() { metrics.reset(); }
  } stop_metrics_first{metrics};

  const GptConfig& g = c.model.gpt;
  std::printf("pstar train: %s\n", config_path.empty() ? "built-in default job" : config_path.c_str());
  std::printf("model: %lld layers, %lld heads, %lld wide, vocab %lld | %.2fM parameters in %d chunks of %lld elements\n",
              (long long)g.n_layer, (long long)g.n_head, (long long)g.n_embd, (long long)g.vocab_size,
              double(g.NumParameters()) / 1e6, t.store().layout().num_chunks(),
              (long long)t.store().layout().chunk_elems());
  if (metrics) metrics->AttachRuntimeCounters(&t.store().chunks().counters());
  const MemoryPlan& plan = t.plan();
  const ChunkManager& chunks = t.store().chunks();
  std::printf("memory: model data %s, activations %s%s | device tier %s (%s), %d chunk slots, "
              "eviction %s, prefetch %lld | host budget %s (%s) | %d threads\n",
              FormatBytes(plan.model_bytes).c_str(), FormatBytes(plan.activation_bytes).c_str(),
              c.train.activation_checkpointing ? " (checkpointed)" : "",
              FormatBytes(chunks.device_capacity_bytes()).c_str(),
              chunks.device_capacity_bytes() >= plan.all_resident_device_bytes ? "all resident" : "chunks move",
              chunks.device_slots(), c.runtime.eviction.c_str(), (long long)c.runtime.prefetch_depth,
              FormatBytes(t.host_budget().bytes).c_str(), t.host_budget().source.c_str(),
              omp_get_max_threads());
  std::printf("data: %lld tokens | batch %lld x %lld x %lld accum = %lld tokens per step\n",
              (long long)(*data)->size(), (long long)c.train.batch_size, (long long)c.train.seq_len,
              (long long)c.train.grad_accum_steps,
              (long long)(c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps));
  std::fflush(stdout);

  std::fflush(stdout);

  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  ProgressReporter progress(stdout, c.train.steps, c.train.log_every);
  // Chunk traffic, totals and per step after the first (warm-up) step.
  int64_t moved_at_warmup[kNumDirections] = {0, 0};
  auto print_chunk_summary = [&](int64_t steps) {
    const RuntimeCounters& rc = chunks.counters();
    int64_t evictions = 0;
    for (const auto& e : rc.evictions) evictions += e;
    const int64_t later = steps > 1 ? steps - 1 : 1;
    std::printf("chunks: h2d_bytes=%lld d2h_bytes=%lld h2d_bytes_per_step=%lld d2h_bytes_per_step=%lld "
                "evictions=%lld prefetches=%lld prefetch_hits=%lld peak_device_bytes=%lld trace_recordings=%lld\n",
                (long long)rc.moved_bytes[0].load(), (long long)rc.moved_bytes[1].load(),
                (long long)((rc.moved_bytes[0] - moved_at_warmup[0]) / later),
                (long long)((rc.moved_bytes[1] - moved_at_warmup[1]) / later), (long long)evictions,
                (long long)rc.prefetches.load(), (long long)rc.prefetch_hits.load(),
                (long long)chunks.peak_device_bytes(), (long long)chunks.trace_recordings());
  };
  for (int64_t s = 0; s < c.train.steps; ++s) {
    auto start = std::chrono::steady_clock::now();
    auto stats = t.Step();
    if (!stats.ok()) return ReportError(stats.status());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.OnStep(*stats, seconds);
    if (s == 0) {
      for (int d = 0; d < kNumDirections; ++d) moved_at_warmup[d] = chunks.counters().moved_bytes[size_t(d)];
    }
    if (metrics) {
      // MFU needs a device peak; the CPU backend has none to compare with.
      metrics->RecordStep(seconds, stats->tokens, stats->loss, stats->lr, stats->grad_norm,
                          /*loss_scale=*/1.0, /*mfu=*/0.0);
    }
    if (g_stop_requested.load()) {
      std::fprintf(stderr, "pstar: stopping after step %lld on request\n", (long long)(s + 1));
      progress.PrintSummary();
      print_chunk_summary(s + 1);
      return kExitInterrupted;
    }
  }
  progress.PrintSummary();
  print_chunk_summary(c.train.steps);
  return kExitOk;
}

}  // namespace pstar::cli
