// pstar train's phases, each a function of its own so that a test can call
// it. TrainCommand runs them in order: parse the flags, set up the rank,
// find the first step, print the job, train, summarise.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/cli/commands.h"
#include "worker/data/token_source.h"
#include "worker/dist/collective_replay.h"
#include "worker/dist/dist_env.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/runtime/chunk_event_log.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

namespace pstar::cli {

// The job's options (--config, --set, --print-config, --profile,
// --comm-alone) and train's own.
struct TrainFlags {
  JobArgs job;
  LogFormat log_format = LogFormat::kText;  // --log-format text|json
  std::string chunk_events_path;            // --chunk-events FILE; empty: none
};
// InvalidArgument naming the flag that is malformed.
Result<TrainFlags> ParseTrainFlags(const std::vector<std::string>& args);

// Everything one rank trains with. The members are built in the order they
// are declared and so go in reverse; before that, the destructor stops the
// metrics endpoint (it reads the trainer's counters) and writes
// --chunk-events' file (however the run ends).
struct TrainingRank {
  std::unique_ptr<WorkerMetrics> metrics;  // null when metrics.port is 0
  DistEnv env;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<BpeTokenizer> text_tokenizer;  // only for text and jsonl data
  // A token stream (data, val_data: null without data.val_path), or for
  // data.source jsonl packed examples (rows, val_rows) with a line on them.
  std::unique_ptr<TokenSource> data;
  std::unique_ptr<TokenSource> val_data;
  std::unique_ptr<PackedRows> rows, val_rows;
  std::string rows_note, val_rows_note;
  TrainingData training_data() const { return rows != nullptr ? TrainingData(*rows) : TrainingData(*data); }
  bool has_validation() const { return val_data != nullptr || val_rows != nullptr; }
  TrainingData validation_data() const {
    return val_rows != nullptr ? TrainingData(*val_rows) : TrainingData(*val_data);
  }
  std::unique_ptr<ChunkEventLog> chunk_events;  // null without --chunk-events
  std::string chunk_events_path;                // FILE, or FILE.rank<K> among several ranks
  std::unique_ptr<Trainer> trainer;

  TrainingRank() = default;
  TrainingRank(const TrainingRank&) = delete;
  TrainingRank& operator=(const TrainingRank&) = delete;
  ~TrainingRank();
  bool lead() const { return env.rank == 0; }  // prints progress; every rank prints its errors
};

// Metrics, the rank's place and communicator, the data, the trainer.
Result<std::unique_ptr<TrainingRank>> SetUpRank(const Config& c, const TrainFlags& flags);

// The step to train from: 0, or the checkpoint's when checkpoint.resume is
// set. Refuses an unwritable checkpoint.dir, and a fresh run into one that
// already holds checkpoints (its first save would prune them).
Result<int64_t> FirstStep(TrainingRank& rank, const Config& c);

// The lines before the first step: job, model, compute, memory, disk tier,
// data, validation, resume.
void PrintJob(const TrainingRank& rank, const Config& c, const std::string& config_path, int64_t first_step);

// Chunk and collective counters after the first (warm-up) step, so that the
// summary's per-step figures leave it out.
struct TrafficAtWarmup {
  std::array<int64_t, kNumDirections> moved{};
  int64_t param_h2d = 0;
  int64_t disk_read = 0, disk_written = 0;
  std::array<int64_t, kNumCollectiveOps> collective{};
};
TrafficAtWarmup ReadTrafficAtWarmup(const TrainingRank& rank);

// The closing lines after `steps` steps: optimizer, chunks, disk, collectives
// and host memory against the plan.
void PrintRunSummary(const TrainingRank& rank, const Config& c, const TrafficAtWarmup& warmup, int64_t steps);

// Trains steps [first_step, train.steps), sampling, validating, saving and
// recording metrics on their schedules; stops after the step at which some
// rank saw `stop` set. Returns the process exit code.
int TrainSteps(TrainingRank& rank, const Config& c, const TrainFlags& flags, int64_t first_step,
               const std::atomic<bool>* stop);

}  // namespace pstar::cli
