// pstar train: runs a training job from a config file or the built-in default.
#include <omp.h>
#include <sys/resource.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "worker/cli/commands.h"
#include "worker/config/config.h"
#include "worker/core/file_util.h"
#include "worker/core/bytes.h"
#include "worker/dist/collective_replay.h"
#include "worker/dist/dist_env.h"
#include "worker/data/token_source.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/runtime/nvtx_range.h"
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
  options.device_label = m.device_label;
  options.job_labels = m.job_labels;
  return WorkerMetrics::Start(options);
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  // --log-format text|json (a value, so taken out before the shared options).
  LogFormat log_format = LogFormat::kText;
  std::string chunk_events_path;  // --chunk-events FILE
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--chunk-events" || args[i].rfind("--chunk-events=", 0) == 0) {
      if (args[i] == "--chunk-events") {
        if (i + 1 >= args.size()) return UsageError("--chunk-events needs a file to write");
        chunk_events_path = args[++i];
      } else {
        chunk_events_path = args[i].substr(15);
      }
      if (chunk_events_path.empty()) return UsageError("--chunk-events needs a file to write");
      continue;
    }
    if (args[i] == "--log-format") {
      if (i + 1 >= args.size()) return UsageError("--log-format needs a value (text or json)");
      value = args[++i];
    } else if (args[i].rfind("--log-format=", 0) == 0) {
      value = args[i].substr(13);
    } else {
      rest.push_back(args[i]);
      continue;
    }
    if (value == "json") log_format = LogFormat::kJson;
    else if (value != "text") return UsageError("--log-format: expected text or json, got '" + value + "'");
  }
  auto job = ParseJobArgs("train", rest, {"--print-config", "--profile", "--comm-alone"});
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
  // The rank's place in the job (torchrun-style env; one rank without it).
  auto env = ReadDistEnv();
  if (!env.ok()) return ReportError(env.status());
  if (Status usable = CheckComputeDevice(c.runtime.device, env->local_rank); !usable.ok()) {
    return ReportError(usable.WithPrefix("runtime.device"));
  }
  // GPU ranks exchange chunks in GPU memory over NCCL; CPU ranks over Gloo.
  const Transport transport = c.runtime.device == "cuda" ? Transport::kNccl : Transport::kGloo;
  auto comm = ConnectCommunicator(*env, std::chrono::seconds(c.dist.timeout_seconds), transport);
  if (!comm.ok()) return ReportError(comm.status());
  const bool lead = env->rank == 0;  // rank 0 prints progress; every rank prints its errors

  // Text with GPT-2's tokenizer is encoded here; shards only record it.
  std::unique_ptr<BpeTokenizer> text_tokenizer;
  if (c.data.source == DataSourceKind::kText) {
    auto loaded = LoadDataTokenizer(c);
    if (!loaded.ok()) return ReportError(loaded.status());
    text_tokenizer = std::move(*loaded);
  }
  auto data = OpenDataSource(c, text_tokenizer.get());
  if (!data.ok()) return ReportError(data.status());
  auto val_data = OpenValidationSource(c, text_tokenizer.get());
  if (!val_data.ok()) return ReportError(val_data.status());
  // Outlives the trainer, whose update thread records into it.
  std::unique_ptr<ChunkEventLog> chunk_events;
  if (!chunk_events_path.empty()) chunk_events = std::make_unique<ChunkEventLog>();
  // With several ranks each writes its own file: FILE.rank<K>.
  if (!chunk_events_path.empty() && env->world_size > 1) chunk_events_path += ".rank" + std::to_string(env->rank);
  auto trainer = Trainer::Create(c, **data, comm->get(), env->local_world_size, env->local_rank);
  if (!trainer.ok()) return ReportError(trainer.status());
  Trainer& t = **trainer;
  // --chunk-events: every step's chunk uses and updates, written however the run ends.
  struct WriteChunkEvents {
    Trainer& t;
    ChunkEventLog* log;
    const std::string& path;
    ~WriteChunkEvents() {
      if (log == nullptr) return;
      t.FinishUpdates();
      if (Status s = log->WriteCsv(path); !s.ok()) {
        std::fprintf(stderr, "pstar: --chunk-events: %s\n", s.message().c_str());
      } else {
        std::printf("chunk events: %s (%zu events)\n", path.c_str(), log->Events().size());
      }
    }
  } write_chunk_events{t, chunk_events.get(), chunk_events_path};
  if (chunk_events != nullptr) t.SetEventLog(chunk_events.get());
  if (*val_data != nullptr) {
    if (Status s = t.SetValidationData(**val_data); !s.ok()) return ReportError(s);
  }
  // The endpoint reads the trainer's counters: stop it before the trainer goes.
  struct StopMetricsFirst {
    std::unique_ptr<WorkerMetrics>& metrics;
    ~StopMetricsFirst() { metrics.reset(); }
  } stop_metrics_first{metrics};

  int64_t first_step = 0;
  if (!c.checkpoint.dir.empty()) {
    // Found now, not when the first save fails after hours of training.
    Status writable = CheckWritableDirectory(c.checkpoint.dir, "rank-" + std::to_string(env->rank));
    if (!writable.ok()) return ReportError(writable.WithPrefix("checkpoint.dir"));
  }
  if (!c.checkpoint.dir.empty() && !c.checkpoint.resume &&
      std::filesystem::exists(std::filesystem::path(c.checkpoint.dir) / "latest")) {
    // A fresh run's first save would prune the newer checkpoints there.
    return ReportError(Status::FailedPrecondition(
        "checkpoint.dir " + c.checkpoint.dir +
        " already holds checkpoints and checkpoint.resume is false: resume from them or choose another dir"));
  }
  if (!c.checkpoint.dir.empty() && c.checkpoint.resume) {
    std::vector<std::string> warnings;
    auto resumed = t.Resume(&warnings);
    for (const std::string& w : warnings) std::fprintf(stderr, "pstar: warning: rank %d: %s\n", env->rank, w.c_str());
    if (!resumed.ok()) return ReportError(resumed.status());
    first_step = *resumed;
    if (first_step >= c.train.steps) {
      if (lead) {
        std::printf("nothing to train: the checkpoint in %s is at step %lld and train.steps is %lld\n",
                    c.checkpoint.dir.c_str(), (long long)first_step, (long long)c.train.steps);
      }
      return kExitOk;
    }
  }
  auto save = [&]() -> bool {
    if (c.checkpoint.dir.empty()) return true;
    Status saved = t.SaveCheckpoint();
    if (!saved.ok()) {
      ReportError(saved);
      return false;
    }
    if (lead) std::printf("checkpoint: step %lld saved in %s\n", (long long)t.steps_taken(), c.checkpoint.dir.c_str());
    return true;
  };
  if (!lead) std::freopen("/dev/null", "w", stdout);  // errors still reach stderr

  const GptConfig& g = c.model.gpt;
  std::printf("pstar train: %s\n", config_path.empty() ? "built-in default job" : config_path.c_str());
  std::printf("model: %lld layers, %lld heads, %lld wide, vocab %lld | %.2fM parameters in %d chunks of %lld elements\n",
              (long long)g.n_layer, (long long)g.n_head, (long long)g.n_embd, (long long)g.vocab_size,
              double(g.NumParameters()) / 1e6, t.store().layout().num_chunks(),
              (long long)t.store().layout().chunk_elems());
  std::printf("compute: %s | %s linear layers, fp32 accumulation and master weights%s%s\n",
              c.runtime.device == "cuda" ? ("cuda, GPU " + std::to_string(env->local_rank)).c_str() : "cpu",
              c.train.precision.c_str(),
              c.train.precision == "fp16" ? (c.fp16.loss_scale > 0 ? ", static loss scale" : ", dynamic loss scale")
                                          : "",
              c.train.grad_precision == "16bit" ? (", " + c.train.precision + " gradients").c_str() : "");
  if (metrics) {
    metrics->AttachRuntimeCounters(&t.store().chunks().counters());
    metrics->AttachCollectiveCounters(&(*comm)->counters());
    metrics->SetTarget(c.train.steps, first_step, env->world_size);
  }
  const MemoryPlan& plan = t.plan();
  const ChunkManager& chunks = t.store().chunks();
  std::printf(
      "memory: model data %s, activations %s%s | device tier %s (%s), %d chunk slots, "
      "Adam moments of %d/%d chunks homed there, eviction %s, prefetch %lld | host budget %s (%s) | "
      "%d threads\n",
      FormatBytes(plan.model_bytes).c_str(), FormatBytes(plan.activation_bytes).c_str(),
      c.train.activation_checkpointing ? " (checkpointed)"
      : plan.gelu_outputs_kept         ? " (GELU outputs kept)"
                                       : "",
      FormatBytes(chunks.device_capacity_bytes()).c_str(),
      chunks.device_capacity_bytes() >= plan.all_resident_device_bytes ? "all resident" : "chunks move",
      chunks.device_slots(), chunks.device_adam_chunks(), chunks.num_chunks(), c.runtime.eviction.c_str(),
      (long long)c.runtime.prefetch_depth, FormatBytes(t.host_budget().bytes).c_str(), t.host_budget().source.c_str(),
      omp_get_max_threads());
  if (const DiskTier* disk = chunks.disk(); disk != nullptr) {
    std::printf("disk tier: Adam moments of %d/%d chunks%s in %s, %s (%s), %s of host windows\n",
                chunks.disk_moment_chunks(), chunks.num_chunks(),
                chunks.disk_master_chunks() > 0
                    ? (", fp32 masters of " + std::to_string(chunks.disk_master_chunks())).c_str()
                    : "",
                disk->path().c_str(),
                FormatBytes(plan.disk_bytes).c_str(), disk->direct() ? "O_DIRECT" : "buffered: no O_DIRECT here",
                FormatBytes(disk->host_bytes()).c_str());
  }
  std::printf("data: %lld tokens (tokenizer %s) | %d ranks x batch %lld x %lld x %lld accum = %lld tokens per step\n",
              (long long)(*data)->size(), c.data.tokenizer.c_str(), env->world_size, (long long)c.train.batch_size,
              (long long)c.train.seq_len, (long long)c.train.grad_accum_steps,
              (long long)(env->world_size * c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps));
  if (*val_data != nullptr) {
    std::printf("validation: %lld tokens | %lld batches (%lld tokens) every %lld steps\n",
                (long long)(*val_data)->size(), (long long)c.train.eval_batches,
                (long long)(c.train.eval_batches * env->world_size * c.train.batch_size * c.train.seq_len),
                (long long)c.train.eval_every);
  }
  if (first_step > 0) std::printf("resumed: from the checkpoint of step %lld\n", (long long)first_step);
  std::fflush(stdout);

  // --profile: every step after the first, warm-up one (when more follow).
  if (job->Has("--profile")) t.EnableProfiling(c.train.steps - first_step > 1 ? 1 : 0);
  auto print_profile = [&] {
    if (t.profiler() == nullptr) return;
    std::fputs(FormatProfile(t.profiler()->Summary()).c_str(), stdout);
    std::fflush(stdout);
  };

  t.SetStopFlag(&g_stop_requested);
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  ProgressReporter progress(stdout, c.train.steps, c.train.log_every, log_format);
  // Chunk traffic, totals and per step after the first (warm-up) step.
  int64_t moved_at_warmup[kNumDirections] = {0, 0};
  int64_t param_h2d_at_warmup = 0;
  int64_t disk_read_at_warmup = 0, disk_written_at_warmup = 0;
  std::array<int64_t, kNumCollectiveOps> comm_at_warmup{};
  auto later_steps = [](int64_t steps) { return steps > 1 ? steps - 1 : int64_t{1}; };
  // The optimizer: its host time (any thread), the step's waits for
  // pending updates, and what speculation did.
  auto print_overlap_summary = [&] {
    t.FinishUpdates();
    const Trainer::SpeculationTotals& sp = t.speculation_totals();
    std::printf("optimizer: overlap=%s host_adam_s=%.3f waited_for_updates_s=%.3f undo_chunks=%d "
                "speculated_steps=%lld speculated_chunks=%lld rolled_back_steps=%lld\n",
                c.runtime.optimizer_overlap.c_str(), sp.host_adam_seconds, sp.update_wait_seconds, t.undo_chunks(),
                (long long)sp.steps, (long long)sp.chunks, (long long)sp.rolled_back);
  };
  // The rank's peak resident memory against its plan: what the operator's
  // pod sizing promised this rank (tests hold one to the other).
  auto print_memory_summary = [&] {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    std::printf("host_memory: peak_rss_bytes=%lld planned_host_bytes=%lld\n", (long long)usage.ru_maxrss * 1024,
                (long long)t.plan().min_host_bytes);
  };
  auto print_chunk_summary = [&](int64_t steps) {
    print_overlap_summary();
    t.store().chunks().WaitCollectives();  // the last step's queued ones, counted
    const RuntimeCounters& rc = chunks.counters();
    int64_t evictions = 0;
    for (const auto& e : rc.evictions) evictions += e;
    const int64_t later = later_steps(steps);
    const int64_t param_h2d = rc.moved_kind_bytes[0][size_t(StateKind::kParam)];
    std::printf("chunks: h2d_bytes=%lld d2h_bytes=%lld h2d_bytes_per_step=%lld d2h_bytes_per_step=%lld "
                "param_h2d_bytes_per_step=%lld "
                "evictions=%lld prefetches=%lld prefetch_hits=%lld peak_device_bytes=%lld trace_recordings=%lld\n",
                (long long)rc.moved_bytes[0].load(), (long long)rc.moved_bytes[1].load(),
                (long long)((rc.moved_bytes[0] - moved_at_warmup[0]) / later),
                (long long)((rc.moved_bytes[1] - moved_at_warmup[1]) / later),
                (long long)((param_h2d - param_h2d_at_warmup) / later), (long long)evictions,
                (long long)rc.prefetches.load(), (long long)rc.prefetch_hits.load(),
                (long long)chunks.peak_device_bytes(), (long long)chunks.trace_recordings());
    if (chunks.disk() != nullptr) {
      std::printf("disk: read_bytes=%lld written_bytes=%lld read_bytes_per_step=%lld written_bytes_per_step=%lld "
                  "wait_s=%.3f\n",
                  (long long)rc.disk_read_bytes.load(), (long long)rc.disk_written_bytes.load(),
                  (long long)((rc.disk_read_bytes - disk_read_at_warmup) / later),
                  (long long)((rc.disk_written_bytes - disk_written_at_warmup) / later), double(rc.disk_wait_ns) * 1e-9);
    }
    if (env->world_size > 1) {
      // Bytes this rank sent per step after the warm-up step, against what
      // ZeRO-3 moves with ring collectives: each param chunk gathered for every
      // forward and every backward, each grad chunk reduce-scattered once:
      // (2*accum + 1) * (N-1)/N * param bytes. Chunks that stay resident are
      // not gathered again, so a roomy device tier sends less.
      const CollectiveCounters& cc = (*comm)->counters();
      const int64_t n = env->world_size;
      const int64_t param_bytes = int64_t(t.store().layout().num_chunks()) * chunks.chunk_bytes();
      const double zero3 = double(2 * c.train.grad_accum_steps + 1) * double(n - 1) / double(n) * double(param_bytes);
      int64_t sent = 0, ns = 0;
      std::string per_op;
      for (int op = 0; op < kNumCollectiveOps; ++op) {
        const int64_t b = (cc.bytes[size_t(op)].load() - comm_at_warmup[size_t(op)]) / later_steps(steps);
        sent += b;
        ns += cc.nanoseconds[size_t(op)].load();
        per_op += std::string(" ") + CollectiveOpName(CollectiveOp(op)) + "_bytes_per_step=" + std::to_string(b);
      }
      std::printf("collectives:%s sent_bytes_per_step=%lld zero3_bytes_per_step=%.0f ratio=%.3f seconds_total=%.3f "
                  "waited_s=%.3f overlap=%s\n",
                  per_op.c_str(), (long long)sent, zero3, zero3 > 0 ? double(sent) / zero3 : 0.0, double(ns) * 1e-9,
                  double((*comm)->waited_nanoseconds()) * 1e-9, c.runtime.comm_overlap ? "on" : "off");
    }
    print_memory_summary();
  };
  // --comm-alone: the last step's gathers and reduce-scatters, replayed
  // without compute once training ends (every rank the same list).
  const bool comm_alone = job->Has("--comm-alone") && env->world_size > 1;
  std::vector<CollectiveCall> last_step_calls;
  auto print_comm_alone = [&]() -> bool {
    if (!comm_alone) return true;
    t.store().chunks().RecordCollectives(nullptr);
    t.store().chunks().WaitCollectives();
    constexpr int kRepeats = 3;
    auto replay = ReplayCollectives(**comm, last_step_calls, kRepeats);
    if (!replay.ok()) {
      ReportError(replay.status());
      return false;
    }
    std::printf("comm_alone: seconds_per_step=%.4f calls=%zu payload_bytes_per_step=%lld repeats=%d\n",
                replay->seconds_per_repeat, last_step_calls.size(), (long long)replay->payload_bytes, kRepeats);
    return true;
  };
  for (int64_t s = first_step; s < c.train.steps; ++s) {
    if (comm_alone && s + 1 == c.train.steps) t.store().chunks().RecordCollectives(&last_step_calls);
    auto start = std::chrono::steady_clock::now();
    auto stats = t.Step();
    if (!stats.ok()) return ReportError(env->world_size > 1 ? stats.status().WithPrefix("rank " + std::to_string(env->rank))
                                                           : stats.status());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.OnStep(*stats, seconds, chunks.counters().moved_bytes[0].load(), chunks.counters().moved_bytes[1].load());
    if (s == first_step) {
      // The step's collectives still queued (the next step's first gathers)
      // are counted with it, whenever the communicator's thread runs them.
      t.store().chunks().WaitCollectives();
      for (int d = 0; d < kNumDirections; ++d) moved_at_warmup[d] = chunks.counters().moved_bytes[size_t(d)];
      param_h2d_at_warmup = chunks.counters().moved_kind_bytes[0][size_t(StateKind::kParam)];
      disk_read_at_warmup = chunks.counters().disk_read_bytes;
      disk_written_at_warmup = chunks.counters().disk_written_bytes;
      for (int op = 0; op < kNumCollectiveOps; ++op) comm_at_warmup[size_t(op)] = (*comm)->counters().bytes[size_t(op)];
    }
    // A stop signal may reach the ranks at different steps; the step agrees
    // on it, so that all stop after the same step (and save the same checkpoint).
    const bool stopping = stats->stop;
    const bool last = s + 1 == c.train.steps;
    if (c.train.sample_every > 0 && ((s + 1) % c.train.sample_every == 0 || last)) {
      // GPT-2's tokenizer: after <|endoftext|>, until the next; bytes: after the prompt.
      const BpeTokenizer* bpe = t.tokenizer();
      std::vector<int32_t> prompt = bpe != nullptr ? bpe->Encode(c.train.sample_prompt) : ByteTokenize(c.train.sample_prompt);
      if (bpe != nullptr) prompt.insert(prompt.begin(), bpe->eot());
      SampleOptions o;
      o.tokens = c.train.sample_tokens;
      o.top_k = 40;
      o.seed = uint64_t(s + 1);
      o.stop_token = bpe != nullptr ? bpe->eot() : -1;
      o.vocab_limit = bpe != nullptr ? bpe->vocab_size() : 256;
      auto sampled = t.Sample(prompt, o);
      if (!sampled.ok()) return ReportError(sampled.status());
      std::string text;
      if (bpe != nullptr) {
        auto d = bpe->Decode(*sampled);
        if (!d.ok()) return ReportError(d.status());
        text = std::move(*d);
      } else {
        text = ByteDetokenize(*sampled);
      }
      progress.OnSample(s + 1, c.train.sample_prompt + text);
    }
    if (c.train.eval_every > 0 && ((s + 1) % c.train.eval_every == 0 || last)) {
      const auto eval_start = std::chrono::steady_clock::now();
      auto val_loss = t.Evaluate();
      if (!val_loss.ok()) return ReportError(val_loss.status());
      const double eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
      progress.OnValidation(s + 1, *val_loss, eval_seconds);
      if (metrics) metrics->RecordValidation(s + 1, *val_loss);
    }
    if ((c.checkpoint.every_steps > 0 && (s + 1) % c.checkpoint.every_steps == 0) || stopping || last) {
      if (!save()) return kExitFailure;
      if (metrics && !c.checkpoint.dir.empty()) metrics->RecordCheckpoint(s + 1);
    }
    if (metrics) {
      // MFU needs a device peak; the CPU backend has none to compare with.
      metrics->RecordStep(seconds, stats->tokens / env->world_size, stats->loss, stats->lr, stats->grad_norm,
                          stats->loss_scale, /*mfu=*/0.0);
      metrics->RecordCollectiveWait(stats->collective_wait_seconds);
      metrics->RecordStepWaits(stats->compute_seconds, stats->host_adam_seconds, stats->update_wait_seconds,
                               stats->speculated_chunks, stats->rolled_back);
      metrics->RecordProgress(s + 1, seconds > 0 ? double(stats->tokens) / seconds : 0.0);
    }
    if (stopping) {
      std::fprintf(stderr, "pstar: stopping after step %lld on request\n", (long long)(s + 1));
      progress.PrintSummary();
      print_chunk_summary(s + 1 - first_step);
      print_profile();
      return kExitInterrupted;
    }
  }
  progress.PrintSummary();
  print_chunk_summary(c.train.steps - first_step);
  print_profile();
  if (!print_comm_alone()) return kExitFailure;
  return kExitOk;
}

}  // namespace pstar::cli
