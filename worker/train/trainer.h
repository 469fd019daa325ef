// Trainer: one optimizer step = grad_accum_steps micro-batches of forward and
// backward, the global gradient norm, clipping fused into AdamW, and the LR
// schedule. Owns the model state, the activation arena and the data cursor.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/ckpt/checkpoint.h"
#include "worker/config/config.h"
#include "worker/core/arena.h"
#include "worker/data/batch_loader.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/chat_examples.h"
#include "worker/data/packed_rows.h"
#include "worker/data/token_source.h"
#include "worker/model/gpt.h"
#include "worker/model/param_store.h"
#include "worker/model/sampler.h"
#include "worker/optim/adam.h"
#include "worker/optim/async_updater.h"
#include "worker/optim/loss_scaler.h"
#include "worker/optim/lr_schedule.h"
#include "worker/plan/memory_plan.h"
#include "worker/runtime/host_memory.h"
#include "worker/train/profiler.h"

namespace pstar {

struct StepStats {
  int64_t step = 0;      // 0-based index of the step just taken
  float loss = 0.0f;     // mean over the step's counted positions, every micro-batch and rank
  float lr = 0.0f;
  double grad_norm = 0.0;  // before clipping (unscaled; inf when fp16 gradients overflowed)
  float loss_scale = 1.0f;  // the fp16 loss scale the step ran with (1 otherwise)
  bool skipped = false;     // fp16 gradients overflowed: no update, a lower scale next
  // optimizer_overlap speculate: chunks whose update began during the
  // backward pass, and whether the check undid them (a clip or a skip).
  int32_t speculated_chunks = 0;
  bool rolled_back = false;
  // Where the step waited, always measured (a pair of timing events and host
  // clocks): the compute stream's span over the forward and backward passes
  // (GPU time from its first op to its last), the host's Adam work during
  // this call on any thread (the update thread's and the step thread's), and
  // the step thread's waits for pending updates.
  double compute_seconds = 0.0;
  double host_adam_seconds = 0.0;
  double update_wait_seconds = 0.0;
  // With N ranks: the time the communicator spent in collectives during this
  // call (on its own thread where it has one), and the part of it the
  // step's threads waited for (not hidden under compute).
  double collective_seconds = 0.0;
  double collective_wait_seconds = 0.0;
  // Only under --profile (EnableProfiling), else -1: the compute stream's op
  // time (kernel time on a GPU), its idle time (waiting for the host, a copy
  // or a collective), and the chunk copies' time each way.
  double kernel_seconds = -1.0;
  double compute_idle_seconds = -1.0;
  double h2d_seconds = -1.0, d2h_seconds = -1.0;
  int64_t tokens = 0;    // tokens consumed by this step, all ranks
  // Some rank's stop flag (SetStopFlag) was set by this step's end: every
  // rank sees the same value, so all stop after the same step.
  bool stop = false;
};

class Trainer {
 public:
  // Plans memory, checks it against the device and host budgets, lays out and
  // initializes the model and carves activations; `data` must outlive the
  // trainer. With a communicator of N ranks (it must outlive the trainer too)
  // the model state is ZeRO-sharded and each rank reads its own data slice;
  // train.batch_size is per rank.
  // `local_ranks` processes share this node's memory: a detected host budget
  // (cgroup or RAM) is split evenly between them. With runtime.device cuda
  // the rank computes on GPU `local_rank`.
  static Result<std::unique_ptr<Trainer>> Create(const Config& config, TrainingData data,
                                                 Communicator* comm = nullptr, int local_ranks = 1,
                                                 int local_rank = 0);

  // Finishes the optimizer's pending updates first.
  ~Trainer();

  // One optimizer step (skipped, and counted as taken, when fp16 gradients
  // overflow: see LossScaler). With runtime.optimizer_overlap pipeline the
  // host's chunk updates may still run when it returns; every later use of a
  // chunk (the next step, a checkpoint, evaluation, a read of the store)
  // waits for that chunk's own update.
  Result<StepStats> Step();

  int64_t steps_taken() const { return step_; }

  // Validation data, which must outlive the trainer: each rank reads its
  // slice of the same global batches as in training. Fails when it holds too
  // few tokens for one batch.
  Status SetValidationData(TrainingData data);
  // The mean loss per counted position (every token of a stream, the
  // answers' of packed examples) over train.eval_batches micro-batches of
  // the validation data, from its start (the same batches every time), on
  // every rank. Forward passes only: parameters, gradients, the
  // optimizer and the training data's cursor are untouched.
  Result<double> Evaluate();

  // Tokens that follow `prompt` (its last seq_len tokens are seen), drawn as
  // SampleOptions say, from the model as it is now: each new token is one
  // forward pass of a training micro-batch whose first row holds the
  // context. Every rank calls it with the same arguments (ZeRO gathers the
  // parameters as in training) and gets the same tokens. Training state is
  // untouched.
  Result<std::vector<int32_t>> Sample(std::vector<int32_t> prompt, const SampleOptions& options);

  // The GPT-2 tokenizer the tokens came from (data.tokenizer gpt2), or null:
  // checkpoints carry it, for `pstar sample` and `pstar export`.
  const BpeTokenizer* tokenizer() const { return tokenizer_.get(); }

  // A flag (a signal handler's) that asks every rank to stop: read once a
  // step and agreed on with the step's loss (StepStats::stop). Not owned.
  void SetStopFlag(const std::atomic<bool>* flag) { stop_flag_ = flag; }

  // Times every op, chunk copy and collective of the steps from now on (see
  // Profiler), leaving out the first `warmup_steps` of them. Numerics are
  // untouched; each step waits once more for the device.
  void EnableProfiling(int64_t warmup_steps = 0);
  // The profiler, or null when profiling is off.
  const Profiler* profiler() const { return profiler_.get(); }

  // Records the steps' chunk events (uses, updates, waits) in `log`, which
  // must outlive the trainer; null stops.
  void SetEventLog(ChunkEventLog* log);
  // Waits for the optimizer's pending updates (Step may leave some running).
  void FinishUpdates();

  // The optimizer over the run so far: speculation's counts, the host's
  // Adam seconds (any thread) and the step thread's waits for pending
  // updates. And how many chunks' undo copies the host budget (or
  // runtime.undo_memory) holds: at most that many chunks speculate per step.
  struct SpeculationTotals {
    int64_t steps = 0;          // steps that speculated on at least one chunk
    int64_t chunks = 0;         // chunk updates begun during backward
    int64_t rolled_back = 0;    // steps whose speculation the check undid
    double host_adam_seconds = 0.0;
    double update_wait_seconds = 0.0;
  };
  const SpeculationTotals& speculation_totals() const { return speculation_; }
  int32_t undo_chunks() const { return undo_chunks_; }

  // Writes a sharded checkpoint of the current state under checkpoint.dir
  // (every rank calls it after the same step).
  Status SaveCheckpoint();
  // Loads the newest usable checkpoint under checkpoint.dir, if any: returns
  // the step it resumes after (0: none found, starting fresh). Damaged
  // checkpoints that were skipped are added to `warnings`.
  Result<int64_t> Resume(std::vector<std::string>* warnings);
  ParamStore& store() { return *store_; }
  Gpt& model() { return *model_; }
  const Arena& activations() const { return *arena_; }
  const MemoryPlan& plan() const { return plan_; }
  // Where the host budget came from and its size.
  const HostBudget& host_budget() const { return host_budget_; }
  const BatchLoader& loader() const { return *loader_; }

 private:
  Trainer() = default;
  // Create's phases, in order once the plan and budgets are checked.
  Status CreateStore(std::unique_ptr<DeviceBackend> backend);
  Status CreateModel(ComputeDevice device);
  Status CreateOptimizer();  // Adam, the update thread, speculation's undo copies, observers
  void StartUpdateThread();
  Status AllocateUndo();
  // Step's phases: the micro-batches' forward and backward passes; the loss,
  // the gradient norm and the stop vote, reduced over ranks; speculation kept
  // or undone (`as_assumed`: no clip and no skip); the profile's figures.
  void RunMicroBatches(float scale);
  Status ReduceLossAndNorm(float scale, StepStats* stats);
  Status SettleSpeculation(bool as_assumed, StepStats* stats);
  void ReadProfile(StepStats* stats);
  // This rank's pieces of every saved kind, at their home shards.
  std::vector<OwnedRange> CheckpointRanges();
  // A chunk's gradient became final in this step's last backward pass: with
  // N ranks its reduce-scatter starts (runtime.comm_overlap); its update
  // starts now when this step speculates and an undo slot is free.
  void OnGradFinal(int32_t chunk);
  AdamOptimizer::UndoSlot UndoSlotAt(size_t slot) const;
  // Puts every speculated chunk of this step back (waiting for their updates).
  void UndoSpeculation();
  // Adds the optimizer's host time and the waits for it since the last call
  // to the totals; returns this call's share.
  std::pair<double, double> TakeOptimizerTimes();

  Config config_;
  MemoryPlan plan_;
  HostBudget host_budget_;
  std::unique_ptr<Communicator> own_comm_;  // a single rank's, when none was given
  Communicator* comm_ = nullptr;            // never null after Create
  int world_ = 1;
  // Before the store and the model, which point to it: destroyed after them.
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<BatchLoader> val_loader_;  // null without validation data
  std::unique_ptr<BpeTokenizer> tokenizer_;  // data.tokenizer gpt2's
  std::string tokenizer_file_;               // its file (SavedText), made once for every checkpoint
  std::vector<NamedFile> model_files_;       // model.init_from's own files, carried by every checkpoint
  std::unique_ptr<AdamOptimizer> optimizer_;
  // The host's chunk updates under optimizer_overlap pipeline, else null.
  // After the store: destroyed (its updates finished) before it.
  std::unique_ptr<AsyncUpdater> updater_;
  ChunkEventLog* event_log_ = nullptr;
  // Speculation: undo copies for undo_chunks_ chunks (3 shards each), the
  // chunks speculated this step in slot order and as a mask, whether the
  // backward pass under way may speculate, with what, and whether the next
  // step does (the last one needed neither clip nor skip).
  int32_t undo_chunks_ = 0;
  bool reduce_when_final_ = false;
  const std::atomic<bool>* stop_flag_ = nullptr;
  std::unique_ptr<float[]> undo_;
  std::vector<int32_t> speculated_;
  std::vector<uint8_t> speculated_mask_;
  bool speculating_ = false;
  bool speculate_next_ = true;
  float speculation_lr_ = 0.0f, speculation_grad_scale_ = 1.0f;
  SpeculationTotals speculation_;
  // The compute stream's forward-and-backward span, timed every step.
  std::unique_ptr<Event> compute_start_, compute_end_;
  LrSchedule schedule_;
  LossScaler scaler_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<int32_t> positions_;  // packed examples' positions (empty for a token stream)
  int64_t step_counted_ = 0;        // the step's counted positions, every rank's (BatchLoader::CountedAhead)
  int64_t step_ = 0;
};

// Whether `device` (runtime.device) can run here as rank LOCAL_RANK
// `local_rank`: the build has CUDA and the GPU exists. Checked before the
// communicator connects, whose NCCL rendezvous would claim the GPU first.
Status CheckComputeDevice(ComputeDevice device, int local_rank);

// The device tier rank LOCAL_RANK `local_rank` runs with: runtime.device_memory
// when set; unset on CUDA, mem_tracer.overall_gpu_mem_ratio of that GPU's
// memory (the rest left to CUDA's context and libraries); otherwise 0, a tier
// that holds every chunk (the CPU backend's, or CUDA's with no GPU seen).
int64_t RankDeviceTierBytes(const Config& config, int local_rank);

// The GPT-2 tokenizer data.tokenizer names, or null when it is byte or none.
Result<std::unique_ptr<BpeTokenizer>> LoadDataTokenizer(const Config& config);

// The token source a config names: the generated corpus, text (one token per
// byte, or encoded by `tokenizer` as one document when data.tokenizer is
// gpt2) or token shards.
Result<std::unique_ptr<TokenSource>> OpenDataSource(const Config& config, const BpeTokenizer* tokenizer = nullptr);
// data.source jsonl: the examples of data.path (`validation`: of
// data.val_path; null when it is unset) in data.chat_format, tokenized by
// `tokenizer` and packed into rows of train.seq_len (PackedRows). Any bad
// line refuses the whole file, naming it. `note` (may be null) gets one line
// saying what was packed.
Result<std::unique_ptr<PackedRows>> OpenPackedExamples(const Config& config, const BpeTokenizer& tokenizer,
                                                       bool validation, std::string* note = nullptr);
// The validation source (data.val_path, read as data.source says), or null
// when there is none.
Result<std::unique_ptr<TokenSource>> OpenValidationSource(const Config& config,
                                                          const BpeTokenizer* tokenizer = nullptr);

}  // namespace pstar
