#include "worker/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <omp.h>
#include <thread>
#include <tuple>

#include "worker/ckpt/hf_config.h"
#include "worker/ckpt/hf_import.h"
#include "worker/core/bytes.h"
#include "worker/core/file_util.h"
#include "worker/data/generated_corpus.h"
#include "worker/runtime/nvtx_range.h"
#ifdef PSTAR_WITH_CUDA
#include "worker/runtime/cuda_backend.h"
#endif

namespace pstar {

Status CheckComputeDevice(ComputeDevice device, int local_rank) {
  if (device == ComputeDevice::kCpu) return Status();
#ifdef PSTAR_WITH_CUDA
  const int gpus = CudaDeviceCount();
  if (gpus == 0) return Status::FailedPrecondition("cuda needs a CUDA device, and this process sees none");
  if (local_rank >= gpus) {
    return Status::FailedPrecondition("cuda: LOCAL_RANK " + std::to_string(local_rank) + " needs GPU " +
                                      std::to_string(local_rank) + ", and this process sees only " +
                                      std::to_string(gpus));
  }
  return Status();
#else
  (void)local_rank;
  return Status::FailedPrecondition("cuda needs a pstar built with CUDA, and this one was built without");
#endif
}

namespace {

// Checkpoint copies of chunks the host does not hold. Those homed on the
// device: through the backend's copy streams, after every queued op (Adam
// writes the moments on the compute stream), and finished before the call
// returns. Those homed on disk: through the disk tier's windows, a chunk at a
// time in the order the checkpoint asks (reads ahead, writes behind).
class HomedChunkCopier final : public DeviceCopier {
 public:
  explicit HomedChunkCopier(ChunkManager& chunks) : chunks_(chunks), done_(chunks.backend().CreateEvent()) {}
  Status ToHost(void* host_dst, const OwnedRange& src, int64_t offset, size_t bytes) override {
    if (chunks_.DiskHomed({src.kind, src.chunk})) {
      const float* window = chunks_.HostRead({src.kind, src.chunk}) + src.chunk_offset;
      std::memcpy(host_dst, reinterpret_cast<const char*>(window) + offset, bytes);
      return Status::Ok();
    }
    return Copy(host_dst, reinterpret_cast<const char*>(src.data) + offset, bytes, StreamKind::kDeviceToHost);
  }
  Status ToDevice(const OwnedRange& dst, int64_t offset, const void* host_src, size_t bytes) override {
    if (chunks_.DiskHomed({dst.kind, dst.chunk})) {
      float* window = chunks_.HostWrite({dst.kind, dst.chunk}) + dst.chunk_offset;
      std::memcpy(reinterpret_cast<char*>(window) + offset, host_src, bytes);
      return Status::Ok();
    }
    return Copy(reinterpret_cast<char*>(dst.data) + offset, host_src, bytes, StreamKind::kHostToDevice);
  }

 private:
  Status Copy(void* dst, const void* src, size_t bytes, StreamKind stream) {
    chunks_.SynchronizeCompute();
    DeviceBackend& backend = chunks_.backend();
    backend.Copy(dst, src, bytes, stream);
    backend.Record(*done_, stream);
    backend.Synchronize(*done_);
    return backend.CheckErrors().WithPrefix("device copy");
  }

  ChunkManager& chunks_;
  std::unique_ptr<Event> done_;
};

// The backend of runtime.device: the emulated tier, or GPU `local_rank`.
Result<std::unique_ptr<DeviceBackend>> MakeBackend(ComputeDevice device, int local_rank) {
  PSTAR_RETURN_IF_ERROR(CheckComputeDevice(device, local_rank));
  if (device == ComputeDevice::kCpu) return MakeCpuBackend();
#ifdef PSTAR_WITH_CUDA
  return MakeCudaBackend(local_rank);
#else
  return Status::FailedPrecondition("cuda needs a pstar built with CUDA, and this one was built without");
#endif
}

}  // namespace

Result<std::unique_ptr<BpeTokenizer>> LoadDataTokenizer(const Config& config) {
  const DataSection& d = config.data;
  if (!BpeTokenizer::IsBpeKind(d.tokenizer)) return std::unique_ptr<BpeTokenizer>();
  auto t = d.tokenizer == "tiktoken"     ? BpeTokenizer::FromTiktokenFile(d.tokenizer_ranks)
           : d.tokenizer_json.empty() ? BpeTokenizer::FromGpt2Files(d.vocab, d.merges)
                                      : BpeTokenizer::FromTokenizerJson(d.tokenizer_json);
  if (!t.ok()) return t.status().WithPrefix("data.tokenizer");
  if (t->vocab_size() > config.model.gpt.vocab_size) {
    return Status::InvalidArgument("data.tokenizer: vocabulary mismatch: the tokenizer has " +
                                   std::to_string(t->vocab_size()) + " tokens but model.vocab_size is " +
                                   std::to_string(config.model.gpt.vocab_size));
  }
  return std::make_unique<BpeTokenizer>(std::move(*t));
}

namespace {

// A text file as tokens: one per byte, or GPT-2's BPE of it as one document.
Result<std::unique_ptr<TokenSource>> OpenText(const std::string& path, int64_t vocab, const BpeTokenizer* tokenizer) {
  if (tokenizer == nullptr) return OpenByteText(path, vocab);
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  return std::unique_ptr<TokenSource>(
      new VectorTokenSource(EncodeDocuments(*tokenizer, {std::string_view(text)}, /*threads=*/0)));
}

}  // namespace

Result<std::unique_ptr<TokenSource>> OpenValidationSource(const Config& config, const BpeTokenizer* tokenizer) {
  if (config.data.val_path.empty()) return std::unique_ptr<TokenSource>();
  const int64_t vocab = config.model.gpt.vocab_size;
  auto r = config.data.source == DataSourceKind::kText ? OpenText(config.data.val_path, vocab, tokenizer)
                                                       : OpenTokenShards(config.data.val_path, vocab);
  if (!r.ok()) return r.status().WithPrefix("data.val_path");
  return std::move(r).value();
}

Result<std::unique_ptr<TokenSource>> OpenDataSource(const Config& config, const BpeTokenizer* tokenizer) {
  const int64_t vocab = config.model.gpt.vocab_size;
  switch (config.data.source) {
    case DataSourceKind::kGenerated:
      return std::unique_ptr<TokenSource>(new VectorTokenSource(
          GenerateCorpus(vocab, config.data.generated_tokens, config.data.seed)));
    case DataSourceKind::kText: {
      auto r = OpenText(config.data.path, vocab, tokenizer);
      if (!r.ok()) return r.status().WithPrefix("data");
      return std::move(r).value();
    }
    case DataSourceKind::kTokens: {
      auto r = OpenTokenShards(config.data.path, vocab);
      if (!r.ok()) return r.status().WithPrefix("data");
      return std::move(r).value();
    }
    case DataSourceKind::kJsonl:
      return Status::Internal("data.source jsonl is packed rows (OpenPackedExamples), not a token stream");
  }
  return Status::Internal("unknown data source");
}

Result<std::unique_ptr<PackedRows>> OpenPackedExamples(const Config& config, const BpeTokenizer& tokenizer,
                                                       bool validation, std::string* note) {
  const std::string& path = validation ? config.data.val_path : config.data.path;
  const std::string key = validation ? "data.val_path" : "data";
  if (path.empty()) return std::unique_ptr<PackedRows>();
  auto text = ReadRegularFile(path);
  if (!text.ok()) return text.status().WithPrefix(key);
  auto examples = ParseJsonlExamples(*text, path);
  if (!examples.ok()) return examples.status().WithPrefix(key);
  ChatFormat format = ChatFormatFor(tokenizer);
  if (config.data.chat_format != "auto") {
    PSTAR_ASSIGN_OR_RETURN(format, ParseChatFormat(config.data.chat_format));
  }
  // Examples are independent: rendered and tokenized side by side, each
  // thread a contiguous share, into their own slots (the same ids at any
  // thread count).
  std::vector<TokenizedExample> tokenized(examples->size());
  std::vector<Status> failed(examples->size());
  const size_t threads = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), 64));
  std::vector<std::thread> pool;
  for (size_t w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < examples->size(); i += threads) {
        auto e = TokenizeExample((*examples)[i], format, tokenizer, config.data.chat_date);
        if (e.ok()) {
          tokenized[i] = std::move(e).value();
        } else {
          failed[i] = e.status();
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < failed.size(); ++i) {
    if (!failed[i].ok()) {
      return failed[i].WithPrefix(key + ": " + path + " line " + std::to_string((*examples)[i].line));
    }
  }
  const int64_t vocab = config.model.gpt.vocab_size;
  for (const TokenizedExample& e : tokenized) {
    for (int32_t id : e.ids) {
      if (id >= vocab) {
        return Status::InvalidArgument(key + ": " + path + " line " + std::to_string(e.line) + ": token " +
                                       std::to_string(id) + " is outside model.vocab_size " + std::to_string(vocab));
      }
    }
  }
  const OverlongPolicy overlong = config.data.overlong == "error" ? OverlongPolicy::kError : OverlongPolicy::kTruncate;
  const int32_t pad = tokenizer.eot() >= 0 && tokenizer.eot() < vocab ? tokenizer.eot() : 0;
  auto rows = PackedRows::Pack(tokenized, config.train.seq_len, overlong, config.data.seed, pad);
  if (!rows.ok()) return rows.status().WithPrefix(key + ": " + path);
  if (note != nullptr) {
    const PackedRows::Counts& n = rows->counts();
    int64_t counted = 0;
    for (int64_t r = 0; r < rows->rows(); ++r) counted += rows->Counted(r);
    *note = path + ": " + std::to_string(n.examples) + " examples (" + ChatFormatName(format) + ") in " +
            std::to_string(rows->rows()) + " rows of " + std::to_string(config.train.seq_len) + ", " +
            std::to_string(counted) + " counted tokens";
    if (n.truncated > 0) *note += ", " + std::to_string(n.truncated) + " truncated";
    if (n.dropped > 0) *note += ", " + std::to_string(n.dropped) + " left out (nothing counted after truncation)";
  }
  return std::make_unique<PackedRows>(std::move(rows).value());
}

int64_t RankDeviceTierBytes(const Config& config, int local_rank) {
  if (config.runtime.device_memory > 0) return config.runtime.device_memory;
#ifdef PSTAR_WITH_CUDA
  if (config.runtime.device == ComputeDevice::kCuda) {
    return GpuTierBytes(config, CudaDeviceMemoryBytes(local_rank));
  }
#else
  (void)local_rank;
#endif
  return 0;
}

namespace {

// The rank's plan checked against its host budget and disk room; `plan` and
// the budget are the trainer's.
Status CheckBudgets(const Config& config, const MemoryPlan& plan, const HostBudget& budget, int local_ranks) {
  if (plan.min_host_bytes > budget.bytes) {
    return Status::ResourceExhausted(
        "host memory budget too small: need " + std::to_string(plan.min_host_bytes) + " bytes (" +
        FormatBytes(plan.min_host_bytes) + ": chunks " + FormatBytes(plan.host_chunk_bytes) +
        ", emulated device " + FormatBytes(plan.device_is_host_memory ? plan.device_bytes : 0) +
        ", data " + FormatBytes(plan.host_data_bytes) + ", overhead " +
        FormatBytes(plan.host_overhead_bytes) + "), available " + std::to_string(budget.bytes) +
        " bytes (" + FormatBytes(budget.bytes) + ", " + budget.source + ")");
  }
  if (plan.disk_moment_chunks > 0) {
    // Every local rank keeps its own file in the one directory.
    PSTAR_RETURN_IF_ERROR(DiskTier::CheckRoom(config.runtime.nvme_path, plan.disk_bytes * std::max(1, local_ranks),
                                              config.runtime.nvme_memory));
  }
  return Status::Ok();
}

LrSchedule ScheduleFromConfig(const Config& c) {
  LrSchedule s;
  s.max_lr = c.optimizer.lr;
  s.min_lr = c.train.min_lr;
  s.warmup_steps = c.train.warmup_steps;
  s.total_steps = c.train.steps;
  s.decay = c.train.lr_decay == "constant" ? LrDecay::kConstant : LrDecay::kCosine;
  return s;
}

AdamConfig AdamFromConfig(const OptimizerSection& o) {
  AdamConfig adam;
  adam.decoupled_weight_decay = o.type == "AdamW";
  adam.beta1 = o.beta1;
  adam.beta2 = o.beta2;
  adam.eps = o.eps;
  adam.weight_decay = o.weight_decay;
  return adam;
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const Config& config, TrainingData data,
                                                 Communicator* comm, int local_ranks, int local_rank) {
  auto t = std::unique_ptr<Trainer>(new Trainer());
  const ComputeDevice device = config.runtime.device;
  auto backend = MakeBackend(device, local_rank);
  if (!backend.ok()) return backend.status().WithPrefix("runtime.device");
  t->config_ = config;
  if (comm == nullptr) comm = (t->own_comm_ = MakeSingleRankCommunicator()).get();
  t->comm_ = comm;
  t->world_ = comm->world_size();
  // The planner clamps a GPU's share to what every chunk needs.
  PSTAR_ASSIGN_OR_RETURN(t->plan_, PlanMemory(config, t->world_, RankDeviceTierBytes(config, local_rank)));
  PSTAR_ASSIGN_OR_RETURN(const HostBudget detected, DetectHostBudget(config.runtime.host_memory));
  t->host_budget_ = RankHostBudget(detected, config.mem_tracer.overall_cpu_mem_ratio, local_ranks);
  PSTAR_RETURN_IF_ERROR(CheckBudgets(config, t->plan_, t->host_budget_, local_ranks));
  PSTAR_RETURN_IF_ERROR(t->CreateStore(std::move(backend).value()));
  PSTAR_RETURN_IF_ERROR(t->CreateModel(device));
  auto loader = BatchLoader::Create(data, config.train.batch_size, config.train.seq_len, comm->rank(), t->world_,
                                    config.train.grad_accum_steps);
  if (!loader.ok()) return loader.status().WithPrefix("data");
  t->loader_ = std::make_unique<BatchLoader>(std::move(loader).value());
  PSTAR_RETURN_IF_ERROR(t->CreateOptimizer());
  t->schedule_ = ScheduleFromConfig(config);
  PSTAR_ASSIGN_OR_RETURN(t->tokenizer_, LoadDataTokenizer(config));
  if (t->tokenizer_ != nullptr) t->tokenizer_file_ = t->tokenizer_->SavedText();
  if (!config.model.init_from.empty()) {
    auto files = ReadHfCarriedFiles(config.model.init_from);
    if (!files.ok()) return files.status().WithPrefix("model.init_from");
    t->model_files_ = std::move(files).value();
  }
  t->tokens_.resize(size_t(config.train.batch_size * config.train.seq_len));
  t->targets_.resize(size_t(config.train.batch_size * config.train.seq_len));
  if (t->loader_->packed()) t->positions_.resize(size_t(config.train.batch_size * config.train.seq_len));
  return t;
}

Status Trainer::CreateStore(std::unique_ptr<DeviceBackend> backend) {
  PSTAR_ASSIGN_OR_RETURN(ParamLayout layout, BuildJobLayout(config_, world_));
  auto store = ParamStore::Create(std::move(layout), std::move(backend), plan_.runtime, comm_);
  if (!store.ok()) return store.status().WithPrefix("runtime.device_memory");
  store_ = std::move(store).value();
  InitParameters(*store_, config_.train.seed);
  if (!config_.model.init_from.empty()) {
    PSTAR_RETURN_IF_ERROR(
        ImportHuggingFace(config_.model.init_from, config_.model.gpt, *store_).WithPrefix("model.init_from"));
  }
  return Status::Ok();
}

Status Trainer::CreateModel(ComputeDevice device) {
  const TrainSection& tr = config_.train;
  arena_ = std::make_unique<Arena>("activations", store_->chunks().non_model_memory(), size_t(plan_.activation_bytes));
  const Precision precision = tr.precision;
  std::unique_ptr<ModelKernels> kernels = MakeCpuModelKernels(precision);
  if (device == ComputeDevice::kCuda) {
    PSTAR_ASSIGN_OR_RETURN(kernels, MakeCudaModelKernels(
                                        store_->chunks().backend().stream_handle(StreamKind::kCompute), precision));
  }
  scaler_ = LossScaler::FromConfig(config_.fp16, precision == Precision::kFp16);
  PSTAR_ASSIGN_OR_RETURN(Gpt model, Gpt::Create(config_.model.gpt, *store_, *arena_, tr.batch_size, tr.seq_len,
                                                tr.activation_checkpointing, std::move(kernels),
                                                plan_.gelu_outputs_kept));
  model_ = std::make_unique<Gpt>(std::move(model));
  if (plan_.runtime.grad_home.has_value()) {
    // Gradients homed in 16 bits hold only 16-bit values, wherever they are.
    store_->SetGradientRounding(
        [model = model_.get()](float* grad, int64_t n) { model->kernels().RoundToPrecision(grad, n); });
  }
  return Status::Ok();
}

Status Trainer::CreateOptimizer() {
  optimizer_ = std::make_unique<AdamOptimizer>(AdamFromConfig(config_.optimizer));
  const OptimizerOverlap overlap = config_.runtime.optimizer_overlap;
  if (overlap != OptimizerOverlap::kOff) StartUpdateThread();
  if (overlap == OptimizerOverlap::kSpeculate && world_ == 1) PSTAR_RETURN_IF_ERROR(AllocateUndo());
  // With N ranks a final gradient is reduce-scattered at once, under the
  // rest of the backward pass.
  reduce_when_final_ = world_ > 1 && config_.runtime.comm_overlap;
  if (reduce_when_final_ || undo_chunks_ > 0) {
    store_->SetGradFinalObserver([trainer = this](int32_t chunk) { trainer->OnGradFinal(chunk); });
  }
  speculated_mask_.assign(size_t(store_->layout().num_chunks()), 0);
  compute_start_ = store_->chunks().backend().CreateTimingEvent();
  compute_end_ = store_->chunks().backend().CreateTimingEvent();
  return Status::Ok();
}

void Trainer::StartUpdateThread() {
  ChunkManager& chunks = store_->chunks();
  // The update thread's kernels leave one core to the step's thread, which
  // queues the compute meanwhile (and on the CPU backend runs it).
  const int cores = config_.train.threads > 0 ? int(config_.train.threads) : omp_get_num_procs();
  updater_ = std::make_unique<AsyncUpdater>(store_->layout().num_chunks(), [backend = &chunks.backend(), cores] {
    backend->BindThread();
    omp_set_num_threads(std::max(1, cores - 1));
  });
  // An update reads the gradient and writes the rest: reading a gradient
  // beside it is safe, anything else waits for it.
  chunks.SetHostFence([updater = updater_.get()](int32_t chunk, StateKind kind, bool writes) {
    if (kind == StateKind::kGrad && !writes) return;
    updater->Wait(chunk);
  });
}

Status Trainer::AllocateUndo() {
  // As many chunks as the undo budget holds, of those that can be undone.
  int32_t speculable = 0;
  for (int32_t c = 0; c < store_->layout().num_chunks(); ++c) speculable += AdamOptimizer::Speculable(*store_, c);
  const int64_t per_chunk = 3 * store_->chunks().shard_bytes();
  const int64_t room = config_.runtime.undo_memory > 0 ? config_.runtime.undo_memory
                                                       : std::max<int64_t>(0, host_budget_.bytes - plan_.min_host_bytes);
  undo_chunks_ = int32_t(std::min<int64_t>(speculable, room / per_chunk));
  if (undo_chunks_ == 0) return Status::Ok();
  undo_.reset(new (std::nothrow) float[size_t(undo_chunks_) * size_t(per_chunk / int64_t(sizeof(float)))]);
  if (undo_ == nullptr) {
    return Status::ResourceExhausted("runtime.undo_memory: cannot allocate " +
                                     FormatBytes(int64_t(undo_chunks_) * per_chunk) +
                                     " of undo copies for speculation");
  }
  return Status::Ok();
}

std::vector<OwnedRange> Trainer::CheckpointRanges() {
  // Params and both Adam moments; gradients are rebuilt every step. Moments
  // homed on the device are copied through HomedChunkCopier (on the CPU
  // backend too, so that path is the one tests run).
  std::vector<OwnedRange> ranges;
  const ParamLayout& layout = store_->layout();
  ChunkManager& chunks = store_->chunks();
  for (StateKind kind : {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    for (int32_t c = 0; c < layout.num_chunks(); ++c) {
      const bool on_disk = chunks.DiskHomed({kind, c});
      const bool homed = chunks.DeviceHomed({kind, c});
      float* shard = on_disk ? nullptr : homed ? chunks.DeviceHome({kind, c}) : store_->HostShard(kind, c);
      for (TensorId id : layout.chunk_tensors(c)) {
        // Padding rows are not saved: they are zero, and stay zero. A row
        // part is saved as its element range of the whole tensor.
        const TensorSpec& spec = layout.spec(id);
        const ParamStore::Slice s = store_->OwnedSlice(id);
        const int64_t end = std::min(s.end, spec.visible_numel());
        if (s.begin >= end) continue;
        const int64_t at = spec.tensor_offset();
        ranges.push_back({kind, spec.tensor(), at + s.begin, at + end, on_disk ? nullptr : shard + s.shard_offset,
                          homed || on_disk, c, s.shard_offset});
      }
    }
  }
  return ranges;
}

Trainer::~Trainer() {
  if (updater_ == nullptr) return;
  updater_->Drain();
  store_->chunks().SetHostFence(nullptr);
}

void Trainer::FinishUpdates() {
  if (updater_ != nullptr) updater_->Drain();
  TakeOptimizerTimes();
}

std::pair<double, double> Trainer::TakeOptimizerTimes() {
  const AsyncUpdater::Times times = updater_ != nullptr ? updater_->TakeTimes() : AsyncUpdater::Times{};
  const double adam = times.busy_s + optimizer_->TakeHostSeconds();
  speculation_.host_adam_seconds += adam;
  speculation_.update_wait_seconds += times.waited_s;
  return {adam, times.waited_s};
}

AdamOptimizer::UndoSlot Trainer::UndoSlotAt(size_t slot) const {
  const size_t shard = size_t(store_->chunks().shard_bytes()) / sizeof(float);
  float* base = undo_.get() + slot * 3 * shard;
  return {base, base + shard, base + 2 * shard};
}

void Trainer::OnGradFinal(int32_t chunk) {
  if (reduce_when_final_) store_->chunks().StartGradReduce(chunk);
  if (!speculating_ || int32_t(speculated_.size()) >= undo_chunks_ || !AdamOptimizer::Speculable(*store_, chunk)) {
    return;
  }
  optimizer_->Speculate(*store_, chunk, speculation_lr_, speculation_grad_scale_, UndoSlotAt(speculated_.size()),
                        *updater_);
  speculated_.push_back(chunk);
  speculated_mask_[size_t(chunk)] = 1;
}

void Trainer::UndoSpeculation() {
  updater_->Drain();
  for (size_t slot = 0; slot < speculated_.size(); ++slot) {
    optimizer_->Undo(*store_, speculated_[slot], UndoSlotAt(slot));
    speculated_mask_[size_t(speculated_[slot])] = 0;
  }
  speculated_.clear();
}

void Trainer::SetEventLog(ChunkEventLog* log) {
  event_log_ = log;
  store_->SetEventLog(log);
  if (updater_ != nullptr) updater_->SetEventLog(log);
}

Status Trainer::SaveCheckpoint() {
  FinishUpdates();
  TrainingState state;
  state.step = step_;
  state.data_position = loader_->cursor();
  state.optimizer_steps = optimizer_->steps_taken();
  state.loss_scale = scaler_.scale();
  state.layout_fingerprint = ModelFingerprint(config_.model.gpt);
  state.model = config_.model.gpt;
  state.tokenizer = config_.data.tokenizer;
  HomedChunkCopier copier(store_->chunks());
  return pstar::SaveCheckpoint(config_.checkpoint.dir, config_.checkpoint.keep, CheckpointRanges(), state, *comm_,
                               &copier, tokenizer_file_, model_files_)
      .WithPrefix("checkpoint");
}

Result<int64_t> Trainer::Resume(std::vector<std::string>* warnings) {
  FinishUpdates();
  HomedChunkCopier copier(store_->chunks());
  auto state = LoadLatestCheckpoint(config_.checkpoint.dir, ModelFingerprint(config_.model.gpt),
                                    CheckpointRanges(), *comm_, warnings, &copier);
  if (!state.ok()) {
    if (state.status().code() == StatusCode::kNotFound) return int64_t{0};
    return state.status().WithPrefix("checkpoint");
  }
  step_ = state->step;
  loader_->set_cursor(state->data_position);
  optimizer_->set_steps_taken(state->optimizer_steps);
  scaler_.Restore(float(state->loss_scale));
  return step_;
}

void Trainer::EnableProfiling(int64_t warmup_steps) {
  if (profiler_ != nullptr) return;
  profiler_ = std::make_unique<Profiler>(store_->chunks().backend(), comm_, warmup_steps);
  model_->kernels().SetTimer(profiler_.get());
  store_->chunks().SetMoveObserver(profiler_.get());
}

Status Trainer::SetValidationData(TrainingData data) {
  auto loader = BatchLoader::Create(data, config_.train.batch_size, config_.train.seq_len, comm_->rank(), world_);
  if (!loader.ok()) return loader.status().WithPrefix("data.val_path");
  val_loader_ = std::make_unique<BatchLoader>(std::move(loader).value());
  return Status::Ok();
}

Result<double> Trainer::Evaluate() {
  if (val_loader_ == nullptr) return Status::FailedPrecondition("no validation data (data.val_path)");
  NvtxRange range("validation");
  val_loader_->set_cursor(0);
  for (int64_t b = 0; b < config_.train.eval_batches; ++b) {
    // Each forward pass is the first half of a step's access sequence, so the
    // chunk trace's eviction and prefetch choices hold for it.
    store_->BeginStep();
    if (val_loader_->packed()) positions_.resize(tokens_.size());
    val_loader_->Next(tokens_.data(), targets_.data(), positions_.data());
    model_->Forward({tokens_.data(), targets_.data(), val_loader_->packed() ? positions_.data() : nullptr});
  }
  // The mean over every rank's counted positions (all of them for a token
  // stream; the answers' for packed examples).
  const Gpt::LossTotals totals = model_->TakeLossTotals();
  double reduced[2] = {totals.sum, double(totals.positions)};
  if (world_ > 1) PSTAR_RETURN_IF_ERROR(comm_->AllReduceSum(reduced, 2));
  const double loss = reduced[1] > 0 ? reduced[0] / reduced[1] : 0.0;
  PSTAR_RETURN_IF_ERROR(store_->chunks().backend().CheckErrors().WithPrefix("device"));
  return loss;
}

Result<std::vector<int32_t>> Trainer::Sample(std::vector<int32_t> context, const SampleOptions& o) {
  if (context.empty()) return Status::InvalidArgument("sample: the prompt has no tokens");
  const int64_t T = config_.train.seq_len, V = config_.model.gpt.vocab_size;
  const int64_t vocab = o.vocab_limit > 0 ? std::min(o.vocab_limit, V) : V;
  for (int32_t t : context) {
    if (t < 0 || t >= V) return Status::InvalidArgument("sample: token " + std::to_string(t) + " is outside the vocabulary");
  }
  NvtxRange range("sample");
  std::mt19937_64 rng(o.seed);
  std::vector<float> logits(size_t(T * V));
  std::vector<int32_t> out;
  for (int64_t i = 0; i < o.tokens; ++i) {
    if (int64_t(context.size()) > T) context.erase(context.begin(), context.end() - std::ptrdiff_t(T));
    std::fill(tokens_.begin(), tokens_.end(), 0);
    std::fill(targets_.begin(), targets_.end(), 0);
    std::copy(context.begin(), context.end(), tokens_.begin());
    store_->BeginStep();  // a forward pass, as in Evaluate
    model_->Forward({tokens_.data(), targets_.data()}, logits.data(), T);
    (void)model_->TakeLoss();
    int32_t next = PickToken(logits.data() + (int64_t(context.size()) - 1) * V, vocab, o, rng);
    // Every rank computed the same logits; rank 0's choice is everyone's.
    if (world_ > 1) PSTAR_RETURN_IF_ERROR(comm_->Broadcast(&next, sizeof(next), 0));
    if (next == o.stop_token) break;
    out.push_back(next);
    context.push_back(next);
  }
  PSTAR_RETURN_IF_ERROR(store_->chunks().backend().CheckErrors().WithPrefix("device"));
  return out;
}

namespace {

// Nanoseconds the communicator has spent in collectives, every op.
int64_t CollectiveNanoseconds(const Communicator& comm) {
  int64_t ns = 0;
  for (const auto& n : comm.counters().nanoseconds) ns += n.load();
  return ns;
}

}  // namespace

void Trainer::RunMicroBatches(float scale) {
  const int64_t accum = config_.train.grad_accum_steps;
  // Speculation assumes this step clips nothing and skips nothing, as the
  // last one did not; its updates start as the gradients become final.
  speculating_ = undo_chunks_ > 0 && speculate_next_;
  speculation_lr_ = schedule_.At(step_);
  speculation_grad_scale_ = 1.0f / (float(world_) * scale);
  store_->BeginStep();
  store_->ZeroGrads();
  DeviceBackend& backend = store_->chunks().backend();
  backend.Record(*compute_start_, StreamKind::kCompute);
  // The step's loss is the mean over every counted position of its
  // micro-batches on every rank (each of them for a token stream, the
  // answers' for packed examples); the ranks' gradients are summed and
  // divided by the world size, hence its factor here.
  step_counted_ = loader_->CountedAhead(accum);
  const float token_weight = step_counted_ > 0 ? scale * float(world_) / float(step_counted_) : 0.0f;
  for (int64_t micro = 0; micro < accum; ++micro) {
    loader_->Next(tokens_.data(), targets_.data(), positions_.data());
    {
      NvtxRange range("forward");
      model_->TrainForward({tokens_.data(), targets_.data(), loader_->packed() ? positions_.data() : nullptr},
                           token_weight);
      store_->EndPhase(StepPhase::kForward);
    }
    NvtxRange range("backward");
    model_->Backward();
    store_->EndPhase(StepPhase::kBackward);
  }
  speculating_ = false;
  backend.Record(*compute_end_, StreamKind::kCompute);
  // Every rank's gradient chunks reach their owners' home shards.
  store_->FlushGrads();
  store_->EndPhase(StepPhase::kBackward);
}

Status Trainer::ReduceLossAndNorm(float scale, StepStats* stats) {
  // The step's one wait for the device: the gradients' sums of squares and
  // the loss sum come back together (the norm's kernels queue behind the
  // backward, so the device does not idle between two waits).
  StepSums sums;
  {
    OpScope timed(profiler_.get(), ProfileOp::kGradNorm);
    sums = TakeStepSums(*store_, model_->kernels());
  }
  double loss = model_->LossTotalsOf(sums.loss_sum).sum;  // this rank's sum over the step's micro-batches
  double squares = sums.grad_squares;
  // The stop vote rides with the loss and the norm: a rank asked to stop
  // makes every rank stop after this step, and one all-reduce carries all
  // three.
  double stop = stop_flag_ != nullptr && stop_flag_->load() ? 1.0 : 0.0;
  if (world_ > 1) {
    NvtxRange range("all_reduce");
    double reduced[3] = {loss, stop, squares};
    PSTAR_RETURN_IF_ERROR(comm_->AllReduceSum(reduced, 3));
    loss = reduced[0];
    stop = reduced[1];
    squares = reduced[2];
  }
  loss = step_counted_ > 0 ? loss / double(step_counted_) : 0.0;
  stats->loss = float(loss);
  stats->stop = stop > 0.0;
  DeviceBackend& backend = store_->chunks().backend();
  stats->compute_seconds = backend.ElapsedSeconds(*compute_start_, *compute_end_);  // reached: the sums waited
  // The stored gradients are sums over ranks; the mean is what the loss asks for.
  stats->grad_norm = std::sqrt(squares) / double(world_) / double(scale);
  return Status::Ok();
}

Status Trainer::SettleSpeculation(bool as_assumed, StepStats* stats) {
  speculate_next_ = as_assumed;
  stats->speculated_chunks = int32_t(speculated_.size());
  if (!speculated_.empty()) {
    ++speculation_.steps;
    speculation_.chunks += int64_t(speculated_.size());
    if (!as_assumed || store_->final_order_broken()) {
      UndoSpeculation();
      stats->rolled_back = true;
      ++speculation_.rolled_back;
    }
  }
  if (store_->final_order_broken() && stats->speculated_chunks > 0) {
    // A chunk was used after its update began: the step's gradients may have
    // seen updated params. Its updates are undone; nothing else is applied.
    return Status::Internal("the step's chunk uses changed under speculation at step " + std::to_string(step_ + 1) +
                            " (set runtime.optimizer_overlap: pipeline)");
  }
  return Status::Ok();
}

void Trainer::ReadProfile(StepStats* stats) {
  if (profiler_ == nullptr) return;
  profiler_->EndStep();
  const Profiler::StepProfile& p = profiler_->last_step();
  if (!p.measured) return;
  stats->kernel_seconds = p.op_seconds;
  stats->compute_idle_seconds = p.idle_seconds;
  stats->h2d_seconds = p.move_seconds[size_t(Direction::kHostToDevice)];
  stats->d2h_seconds = p.move_seconds[size_t(Direction::kDeviceToHost)];
}

Result<StepStats> Trainer::Step() {
  NvtxRange step_range("step");
  StepStats stats;
  stats.step = step_;
  // fp16: the loss, and with it every gradient, is scaled up by `scale`.
  const float scale = scaler_.scale();
  stats.loss_scale = scale;
  const int64_t collective_ns_before = CollectiveNanoseconds(*comm_);
  const int64_t waited_ns_before = comm_->waited_nanoseconds();
  if (event_log_ != nullptr) {
    event_log_->set_step(step_);
    event_log_->Record(step_, ChunkEventKind::kStepBegin);
  }
  if (profiler_ != nullptr) profiler_->BeginStep();
  RunMicroBatches(scale);
  PSTAR_RETURN_IF_ERROR(ReduceLossAndNorm(scale, &stats));
  // The loss scaler's overflow decision: the norm is finite exactly when every
  // gradient is, and every rank sees the same all-reduced norm.
  const bool finite = std::isfinite(stats.grad_norm);
  const float clip = ClipCoefficient(stats.grad_norm, config_.train.grad_clip);
  // What speculation assumed: no overflow skip and no clip.
  PSTAR_RETURN_IF_ERROR(SettleSpeculation(finite && clip == 1.0f, &stats));
  if (!std::isfinite(stats.loss) || (!finite && (!scaler_.enabled() || scaler_.at_minimum()))) {
    if (!speculated_.empty()) UndoSpeculation();  // the state stays the last step's
    return Status::Internal("training diverged at step " + std::to_string(step_ + 1) + ": loss " +
                            std::to_string(stats.loss) + ", gradient norm " + std::to_string(stats.grad_norm) +
                            (scaler_.enabled() ? " at loss scale " + std::to_string(scale) : std::string()) +
                            " (lower optimizer.params.lr?)");
  }
  stats.lr = schedule_.At(step_);
  stats.skipped = !scaler_.Update(finite);
  if (!stats.skipped) {
    // Clipping and unscaling fused into Adam's gradient scale; with N ranks
    // the stored gradients are sums, so 1/N too.
    OpScope timed(profiler_.get(), ProfileOp::kAdam);
    // In the order the next forward pass needs the chunks: with the updates
    // pipelined, it starts once its first chunks are done. Speculated chunks
    // (kept: the step neither clips nor skips) are done already.
    optimizer_->Step(*store_, stats.lr, clip / (float(world_) * scale), updater_.get(),
                     store_->ForwardChunkOrder(), &speculated_mask_);
  }
  for (int32_t c : speculated_) speculated_mask_[size_t(c)] = 0;
  speculated_.clear();
  store_->EndStep();
  std::tie(stats.host_adam_seconds, stats.update_wait_seconds) = TakeOptimizerTimes();
  ReadProfile(&stats);
  // A failed copy or kernel of this step (CUDA reports them late).
  PSTAR_RETURN_IF_ERROR(store_->chunks().backend().CheckErrors().WithPrefix("device"));
  stats.tokens = config_.train.grad_accum_steps * int64_t(tokens_.size()) * world_;
  stats.collective_seconds = double(CollectiveNanoseconds(*comm_) - collective_ns_before) * 1e-9;
  stats.collective_wait_seconds = double(comm_->waited_nanoseconds() - waited_ns_before) * 1e-9;
  if (event_log_ != nullptr) event_log_->Record(step_, ChunkEventKind::kStepEnd);
  ++step_;
  return stats;
}

}  // namespace pstar
