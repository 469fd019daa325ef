// pstar train: runs a training job from a config file or the built-in default.
#include "worker/cli/train_command.h"

#include <omp.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/hf_export.h"
#include "worker/config/config.h"
#include "worker/core/file_util.h"

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

// The value of `--name VALUE` or `--name=VALUE` at args[*i] (advancing *i
// past a separate value); nullopt when args[*i] is another argument.
Result<std::optional<std::string>> FlagValue(const std::vector<std::string>& args, size_t* i,
                                             const std::string& name, const std::string& needs) {
  const std::string& a = args[*i];
  if (a == name) {
    if (*i + 1 >= args.size()) return Status::InvalidArgument(name + " needs " + needs);
    return std::optional<std::string>(args[++*i]);
  }
  if (a.rfind(name + "=", 0) == 0) return std::optional<std::string>(a.substr(name.size() + 1));
  return std::optional<std::string>();
}

// Text with GPT-2's tokenizer is encoded here; shards only record it.
Status OpenData(const Config& c, TrainingRank& rank) {
  if (c.data.source == DataSourceKind::kText || c.data.source == DataSourceKind::kJsonl) {
    auto loaded = LoadDataTokenizer(c);
    if (!loaded.ok()) return loaded.status();
    rank.text_tokenizer = std::move(*loaded);
  }
  if (c.data.source == DataSourceKind::kJsonl) {
    PSTAR_ASSIGN_OR_RETURN(rank.rows, OpenPackedExamples(c, *rank.text_tokenizer, false, &rank.rows_note));
    PSTAR_ASSIGN_OR_RETURN(rank.val_rows, OpenPackedExamples(c, *rank.text_tokenizer, true, &rank.val_rows_note));
    return Status::Ok();
  }
  auto data = OpenDataSource(c, rank.text_tokenizer.get());
  if (!data.ok()) return data.status();
  rank.data = std::move(*data);
  auto val_data = OpenValidationSource(c, rank.text_tokenizer.get());
  if (!val_data.ok()) return val_data.status();
  rank.val_data = std::move(*val_data);
  return Status::Ok();
}

// The step's text sample: a BPE tokenizer samples after its document start
// until its end-of-text token; bytes after the prompt.
Result<std::string> SampleText(Trainer& t, const Config& c, int64_t step) {
  const BpeTokenizer* bpe = t.tokenizer();
  std::vector<int32_t> prompt = bpe != nullptr ? bpe->Encode(c.train.sample_prompt) : ByteTokenize(c.train.sample_prompt);
  if (bpe != nullptr) prompt.insert(prompt.begin(), bpe->DocumentStart().begin(), bpe->DocumentStart().end());
  SampleOptions o;
  o.tokens = c.train.sample_tokens;
  o.top_k = 40;
  o.seed = uint64_t(step);
  o.stop_token = bpe != nullptr ? bpe->eot() : -1;
  o.vocab_limit = bpe != nullptr ? bpe->vocab_size() : 256;
  auto sampled = t.Sample(prompt, o);
  if (!sampled.ok()) return sampled.status();
  if (bpe == nullptr) return ByteDetokenize(*sampled);
  return bpe->Decode(*sampled);
}

// Saves a checkpoint when checkpoint.dir is set; rank 0 says where.
Status SaveCheckpoint(TrainingRank& rank, const Config& c) {
  if (c.checkpoint.dir.empty()) return Status::Ok();
  Trainer& t = *rank.trainer;
  if (Status saved = t.SaveCheckpoint(); !saved.ok()) return saved;
  if (rank.lead()) std::printf("checkpoint: step %lld saved in %s\n", (long long)t.steps_taken(), c.checkpoint.dir.c_str());
  return Status::Ok();
}

// checkpoint.export_dir: rank 0 writes the final checkpoint (step `step`,
// saved above) as a Hugging Face model directory.
Status ExportFinalCheckpoint(TrainingRank& rank, const Config& c, int64_t step) {
  if (c.checkpoint.export_dir.empty() || !rank.lead()) return Status::Ok();
  HfExportOptions options;
  const std::string& d = c.checkpoint.export_dtype;
  if (d != "auto") options.dtype = d == "fp32" ? Dtype::kF32 : d == "bf16" ? Dtype::kBF16 : Dtype::kF16;
  const auto start = std::chrono::steady_clock::now();
  auto summary = ExportHuggingFace(c.checkpoint.dir + "/" + StepDirName(step), c.checkpoint.export_dir, options);
  if (!summary.ok()) return summary.status().WithPrefix("checkpoint.export_dir");
  std::printf("export: step %lld (%lld parameters, %s) written to %s in %zu weight file(s), %.1f s\n",
              (long long)summary->step, (long long)summary->parameters, DtypeName(summary->dtype),
              c.checkpoint.export_dir.c_str(), summary->weight_paths.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return Status::Ok();
}

void RecordStepMetrics(WorkerMetrics& metrics, const StepStats& stats, double seconds, int world_size, int64_t step) {
  // MFU needs a device peak; the CPU backend has none to compare with.
  metrics.RecordStep(seconds, stats.tokens / world_size, stats.loss, stats.lr, stats.grad_norm, stats.loss_scale,
                     /*mfu=*/0.0);
  metrics.RecordCollectiveWait(stats.collective_wait_seconds);
  metrics.RecordStepWaits(stats.compute_seconds, stats.host_adam_seconds, stats.update_wait_seconds,
                          stats.speculated_chunks, stats.rolled_back);
  metrics.RecordProgress(step, seconds > 0 ? double(stats.tokens) / seconds : 0.0);
}

// --profile's table, when profiling.
void PrintProfile(const Trainer& t) {
  if (t.profiler() == nullptr) return;
  std::fputs(FormatProfile(t.profiler()->Summary()).c_str(), stdout);
  std::fflush(stdout);
}

// --comm-alone: the last step's gathers and reduce-scatters, replayed
// without compute (every rank the same list).
Status ReplayLastStep(TrainingRank& rank, const std::vector<CollectiveCall>& calls) {
  ChunkManager& chunks = rank.trainer->store().chunks();
  chunks.RecordCollectives(nullptr);
  chunks.WaitCollectives();
  constexpr int kRepeats = 3;
  auto replay = ReplayCollectives(*rank.comm, calls, kRepeats);
  if (!replay.ok()) return replay.status();
  std::printf("comm_alone: seconds_per_step=%.4f calls=%zu payload_bytes_per_step=%lld repeats=%d\n",
              replay->seconds_per_repeat, calls.size(), (long long)replay->payload_bytes, kRepeats);
  return Status::Ok();
}

bool Due(int64_t every, int64_t step) { return every > 0 && step % every == 0; }

}  // namespace

TrainingRank::~TrainingRank() {
  metrics.reset();
  if (chunk_events == nullptr || trainer == nullptr) return;
  trainer->FinishUpdates();
  if (Status s = chunk_events->WriteCsv(chunk_events_path); !s.ok()) {
    std::fprintf(stderr, "pstar: --chunk-events: %s\n", s.message().c_str());
  } else {
    std::printf("chunk events: %s (%zu events)\n", chunk_events_path.c_str(), chunk_events->Events().size());
  }
}

Result<TrainFlags> ParseTrainFlags(const std::vector<std::string>& args) {
  TrainFlags flags;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    auto events = FlagValue(args, &i, "--chunk-events", "a file to write");
    if (!events.ok()) return events.status();
    if (events->has_value()) {
      flags.chunk_events_path = **events;
      if (flags.chunk_events_path.empty()) return Status::InvalidArgument("--chunk-events needs a file to write");
      continue;
    }
    auto format = FlagValue(args, &i, "--log-format", "a value (text or json)");
    if (!format.ok()) return format.status();
    if (!format->has_value()) {
      rest.push_back(args[i]);
    } else if (**format == "json") {
      flags.log_format = LogFormat::kJson;
    } else if (**format != "text") {
      return Status::InvalidArgument("--log-format: expected text or json, got '" + **format + "'");
    }
  }
  auto job = ParseJobArgs("train", rest, {"--print-config", "--profile", "--comm-alone"});
  if (!job.ok()) return job.status();
  flags.job = std::move(*job);
  return flags;
}

Result<std::unique_ptr<TrainingRank>> SetUpRank(const Config& c, const TrainFlags& flags) {
  auto rank = std::make_unique<TrainingRank>();
  if (c.metrics.port > 0) {
    auto started = StartMetrics(c.metrics);
    if (!started.ok()) return started.status().WithPrefix("metrics");
    rank->metrics = std::move(started).value();
    std::printf("metrics: http://%s:%d/metrics\n", c.metrics.bind_address.c_str(), rank->metrics->port());
  }
  // The rank's place in the job (torchrun-style env; one rank without it).
  auto env = ReadDistEnv();
  if (!env.ok()) return env.status();
  rank->env = *env;
  if (Status usable = CheckComputeDevice(c.runtime.device, env->local_rank); !usable.ok()) {
    return usable.WithPrefix("runtime.device");
  }
  // GPU ranks exchange chunks in GPU memory over NCCL; CPU ranks over Gloo.
  const Transport transport = c.runtime.device == ComputeDevice::kCuda ? Transport::kNccl : Transport::kGloo;
  auto comm = ConnectCommunicator(*env, std::chrono::seconds(c.dist.timeout_seconds), transport);
  if (!comm.ok()) return comm.status();
  rank->comm = std::move(*comm);
  if (Status opened = OpenData(c, *rank); !opened.ok()) return opened;
  // The log outlives the trainer, whose update thread records into it.
  if (!flags.chunk_events_path.empty()) {
    rank->chunk_events = std::make_unique<ChunkEventLog>();
    rank->chunk_events_path = flags.chunk_events_path;
    if (env->world_size > 1) rank->chunk_events_path += ".rank" + std::to_string(env->rank);
  }
  auto trainer = Trainer::Create(c, rank->training_data(), rank->comm.get(), env->local_world_size, env->local_rank);
  if (!trainer.ok()) return trainer.status();
  rank->trainer = std::move(*trainer);
  if (rank->chunk_events != nullptr) rank->trainer->SetEventLog(rank->chunk_events.get());
  if (rank->has_validation()) {
    if (Status s = rank->trainer->SetValidationData(rank->validation_data()); !s.ok()) return s;
  }
  return rank;
}

Result<int64_t> FirstStep(TrainingRank& rank, const Config& c) {
  if (c.checkpoint.dir.empty()) return int64_t{0};
  // Found now, not when the first save fails after hours of training.
  Status writable = CheckWritableDirectory(c.checkpoint.dir, "rank-" + std::to_string(rank.env.rank));
  if (!writable.ok()) return writable.WithPrefix("checkpoint.dir");
  if (!c.checkpoint.resume) {
    if (std::filesystem::exists(std::filesystem::path(c.checkpoint.dir) / "latest")) {
      return Status::FailedPrecondition(
          "checkpoint.dir " + c.checkpoint.dir +
          " already holds checkpoints and checkpoint.resume is false: resume from them or choose another dir");
    }
    return int64_t{0};
  }
  std::vector<std::string> warnings;
  auto resumed = rank.trainer->Resume(&warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "pstar: warning: rank %d: %s\n", rank.env.rank, w.c_str());
  return resumed;
}

int TrainSteps(TrainingRank& rank, const Config& c, const TrainFlags& flags, int64_t first_step,
               const std::atomic<bool>* stop) {
  Trainer& t = *rank.trainer;
  ChunkManager& chunks = t.store().chunks();
  const int world_size = rank.env.world_size;
  // --profile: every step after the first, warm-up one (when more follow).
  if (flags.job.Has("--profile")) t.EnableProfiling(c.train.steps - first_step > 1 ? 1 : 0);
  t.SetStopFlag(stop);
  ProgressReporter progress(stdout, c.train.steps, c.train.log_every, flags.log_format);
  TrafficAtWarmup warmup;
  const bool comm_alone = flags.job.Has("--comm-alone") && world_size > 1;
  std::vector<CollectiveCall> last_step_calls;
  for (int64_t s = first_step; s < c.train.steps; ++s) {
    const int64_t done = s + 1;  // steps taken once this one ends (1-based)
    const bool last = done == c.train.steps;
    if (comm_alone && last) chunks.RecordCollectives(&last_step_calls);
    auto start = std::chrono::steady_clock::now();
    auto stats = t.Step();
    if (!stats.ok()) {
      return ReportError(world_size > 1 ? stats.status().WithPrefix("rank " + std::to_string(rank.env.rank))
                                        : stats.status());
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.OnStep(*stats, seconds, chunks.counters().moved_bytes[0].load(), chunks.counters().moved_bytes[1].load());
    if (s == first_step) warmup = ReadTrafficAtWarmup(rank);
    // A stop signal may reach the ranks at different steps; the step agrees
    // on it, so that all stop after the same step (and save the same checkpoint).
    const bool stopping = stats->stop;
    if (c.train.sample_every > 0 && (Due(c.train.sample_every, done) || last)) {
      auto text = SampleText(t, c, done);
      if (!text.ok()) return ReportError(text.status());
      progress.OnSample(done, c.train.sample_prompt + *text);
    }
    if (c.train.eval_every > 0 && (Due(c.train.eval_every, done) || last)) {
      const auto eval_start = std::chrono::steady_clock::now();
      auto val_loss = t.Evaluate();
      if (!val_loss.ok()) return ReportError(val_loss.status());
      const double eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
      progress.OnValidation(done, *val_loss, eval_seconds);
      if (rank.metrics) rank.metrics->RecordValidation(done, *val_loss);
    }
    if (Due(c.checkpoint.every_steps, done) || stopping || last) {
      if (Status saved = SaveCheckpoint(rank, c); !saved.ok()) {
        ReportError(saved);
        return kExitFailure;
      }
      if (rank.metrics && !c.checkpoint.dir.empty()) rank.metrics->RecordCheckpoint(done);
    }
    if (rank.metrics) RecordStepMetrics(*rank.metrics, *stats, seconds, world_size, done);
    if (stopping) {
      std::fprintf(stderr, "pstar: stopping after step %lld on request\n", (long long)done);
      progress.PrintSummary();
      PrintRunSummary(rank, c, warmup, done - first_step);
      PrintProfile(t);
      return kExitInterrupted;
    }
  }
  progress.PrintSummary();
  PrintRunSummary(rank, c, warmup, c.train.steps - first_step);
  PrintProfile(t);
  if (Status exported = ExportFinalCheckpoint(rank, c, c.train.steps); !exported.ok()) {
    ReportError(exported);
    return kExitFailure;
  }
  if (comm_alone) {
    if (Status replayed = ReplayLastStep(rank, last_step_calls); !replayed.ok()) {
      ReportError(replayed);
      return kExitFailure;
    }
  }
  return kExitOk;
}

int TrainCommand(const std::vector<std::string>& args) {
  auto flags = ParseTrainFlags(args);
  if (!flags.ok()) return UsageError(flags.status().message());
  Result<Config> config = LoadJobConfig(flags->job);
  if (!config.ok()) return ReportError(config.status());
  if (flags->job.Has("--print-config")) {
    std::fputs(ConfigToYaml(*config).c_str(), stdout);
    return kExitOk;
  }
  const Config& c = *config;
  if (c.train.threads > 0) omp_set_num_threads(int(c.train.threads));
  auto rank = SetUpRank(c, *flags);
  if (!rank.ok()) return ReportError(rank.status());
  auto first_step = FirstStep(**rank, c);
  if (!first_step.ok()) return ReportError(first_step.status());
  if (*first_step >= c.train.steps) {
    if ((*rank)->lead()) {
      std::printf("nothing to train: the checkpoint in %s is at step %lld and train.steps is %lld\n",
                  c.checkpoint.dir.c_str(), (long long)*first_step, (long long)c.train.steps);
    }
    return kExitOk;
  }
  if (!(*rank)->lead()) std::freopen("/dev/null", "w", stdout);  // errors still reach stderr
  PrintJob(**rank, c, flags->job.config_path, *first_step);
  if ((*rank)->metrics) {
    (*rank)->metrics->AttachRuntimeCounters(&(*rank)->trainer->store().chunks().counters());
    (*rank)->metrics->AttachCollectiveCounters(&(*rank)->comm->counters());
    (*rank)->metrics->SetTarget(c.train.steps, *first_step, (*rank)->env.world_size);
  }
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  return TrainSteps(**rank, c, *flags, *first_step, &g_stop_requested);
}

}  // namespace pstar::cli
