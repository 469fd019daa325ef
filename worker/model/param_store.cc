#include "worker/model/param_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <utility>

namespace pstar {

namespace {

[[noreturn]] void ModelBug(const char* what, const std::string& tensor) {
  // A model-code bug, not a user error.
  std::fprintf(stderr, "pstar: internal error: %s %s\n", what, tensor.c_str());
  std::abort();
}

void AddAccess(std::vector<ChunkAccess>& accesses, ChunkKey key, bool writes) {
  for (ChunkAccess& a : accesses) {
    if (a.key.kind == key.kind && a.key.chunk == key.chunk) {
      a.writes = a.writes || writes;
      return;
    }
  }
  accesses.push_back({key, writes});
}

}  // namespace

MomentChunks MostChunksPerMoment(const ParamLayout& layout, const std::vector<AccessMoment>& moments) {
  MomentChunks most;
  for (const AccessMoment& m : moments) {
    std::vector<ChunkAccess> accesses;
    for (TensorId id : m.tensors) {
      const int32_t chunk = layout.placement(id).chunk;
      if (m.params) AddAccess(accesses, {StateKind::kParam, chunk}, false);
      if (m.pass == Pass::kBackward && m.grads) AddAccess(accesses, {StateKind::kGrad, chunk}, true);
    }
    int32_t grads = 0;
    for (const ChunkAccess& a : accesses) grads += a.key.kind == StateKind::kGrad;
    most.total = std::max(most.total, int32_t(accesses.size()));
    most.params = std::max(most.params, int32_t(accesses.size()) - grads);
    most.grads = std::max(most.grads, grads);
  }
  return most;
}

const char* TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kFree: return "FREE";
    case TensorState::kCompute: return "COMPUTE";
    case TensorState::kHold: return "HOLD";
    case TensorState::kHoldAfterForward: return "HOLD_AFTER_FWD";
    case TensorState::kHoldAfterBackward: return "HOLD_AFTER_BWD";
  }
  return "?";
}

Result<std::unique_ptr<ParamStore>> ParamStore::Create(ParamLayout layout,
                                                       std::unique_ptr<DeviceBackend> backend,
                                                       const ChunkRuntimeOptions& options,
                                                       Communicator* comm) {
  const int64_t chunk_bytes = layout.chunk_elems() * int64_t(sizeof(float));
  PSTAR_ASSIGN_OR_RETURN(auto chunks, ChunkManager::Create(layout.num_chunks(), chunk_bytes,
                                                           std::move(backend), options, comm));
  return std::unique_ptr<ParamStore>(new ParamStore(std::move(layout), std::move(chunks)));
}

ParamStore::ParamStore(ParamLayout layout, std::unique_ptr<ChunkManager> chunks)
    : layout_(std::move(layout)), chunks_(std::move(chunks)) {
  compute_refs_.assign(size_t(layout_.num_tensors()), 0);
  states_.assign(size_t(layout_.num_tensors()), TensorState::kHold);
  forward_seen_.assign(size_t(layout_.num_chunks()), 0);
  last_use_.assign(size_t(layout_.num_chunks()), -1);
  final_at_.assign(size_t(layout_.num_chunks()), -1);
  final_fired_.assign(size_t(layout_.num_chunks()), 0);
}

ParamStore::ParamStore(ParamLayout layout) : layout_(std::move(layout)) {
  ChunkRuntimeOptions options;  // capacity 0: every chunk fits
  auto chunks = ChunkManager::Create(layout_.num_chunks(), layout_.chunk_elems() * int64_t(sizeof(float)),
                                     MakeCpuBackend(), options);
  if (!chunks.ok()) throw std::bad_alloc();
  chunks_ = std::move(chunks).value();
  compute_refs_.assign(size_t(layout_.num_tensors()), 0);
  states_.assign(size_t(layout_.num_tensors()), TensorState::kHold);
  forward_seen_.assign(size_t(layout_.num_chunks()), 0);
  last_use_.assign(size_t(layout_.num_chunks()), -1);
  final_at_.assign(size_t(layout_.num_chunks()), -1);
  final_fired_.assign(size_t(layout_.num_chunks()), 0);
}

ParamStore::Use ParamStore::Acquire(std::vector<TensorId> tensors, Pass pass) {
  return AcquireUse(std::move(tensors), pass, /*params=*/true, /*grads=*/true);
}

ParamStore::Use ParamStore::AcquireGrads(std::vector<TensorId> tensors) {
  return AcquireUse(std::move(tensors), Pass::kBackward, /*params=*/false, /*grads=*/true);
}

ParamStore::Use ParamStore::AcquireParams(std::vector<TensorId> tensors) {
  return AcquireUse(std::move(tensors), Pass::kBackward, /*params=*/true, /*grads=*/false);
}

ParamStore::Use ParamStore::AcquireUse(std::vector<TensorId> ids, Pass pass, bool params, bool grads) {
  std::vector<ChunkAccess> accesses;
  for (TensorId id : ids) {
    const int32_t chunk = layout_.placement(id).chunk;
    if (params) AddAccess(accesses, {StateKind::kParam, chunk}, false);
    if (pass == Pass::kBackward && grads) AddAccess(accesses, {StateKind::kGrad, chunk}, true);
  }
  chunks_->Access(accesses);
  const int64_t step_moment = step_moment_++;
  step_had_backward_ = step_had_backward_ || pass == Pass::kBackward;
  // Each chunk once: by its param access, or its gradient's in a use without params.
  const StateKind by = params ? StateKind::kParam : StateKind::kGrad;
  for (const ChunkAccess& a : accesses) {
    if (a.key.kind != by) continue;
    const int32_t c = a.key.chunk;
    if (final_fired_[size_t(c)]) final_order_broken_ = true;
    last_use_[size_t(c)] = step_moment;
    if (pass == Pass::kForward && !forward_seen_[size_t(c)]) {
      forward_seen_[size_t(c)] = 1;
      forward_order_.push_back(c);
    }
    if (event_log_ != nullptr) {
      event_log_->Record(event_log_->step(),
                         pass == Pass::kForward ? ChunkEventKind::kForwardUse : ChunkEventKind::kBackwardUse, c);
    }
  }
  for (TensorId id : ids) {
    ++compute_refs_[size_t(id)];
    states_[size_t(id)] = TensorState::kCompute;
    if (recording_) trace_.push_back({moment_, id, pass, params, grads});
  }
  ++moment_;
  return Use(this, std::move(ids), std::move(accesses), pass, params, grads, step_moment);
}

void ParamStore::Release(const std::vector<TensorId>& tensors, const std::vector<ChunkAccess>& accesses, Pass pass,
                         bool params, bool grads, int64_t step_moment) {
  if (pass == Pass::kBackward && grads && round_grad_) {
    for (TensorId id : tensors) {
      const TensorPlacement& p = layout_.placement(id);
      round_grad_(chunks_->DeviceData({StateKind::kGrad, p.chunk}) + p.offset, layout_.spec(id).numel());
    }
  }
  for (TensorId id : tensors) {
    if (--compute_refs_[size_t(id)] == 0) {
      states_[size_t(id)] = pass == Pass::kForward ? TensorState::kHoldAfterForward
                                                   : TensorState::kHoldAfterBackward;
    }
  }
  chunks_->Release(accesses);
  if (pass != Pass::kBackward) return;
  const StateKind by = params ? StateKind::kParam : StateKind::kGrad;
  for (const ChunkAccess& a : accesses) {
    const int32_t c = a.key.chunk;
    if (a.key.kind != by || final_at_[size_t(c)] != step_moment || final_fired_[size_t(c)]) continue;
    // Ops hold chunks one at a time (a Use per op); a nested one would still pin it.
    if (chunks_->Pinned({StateKind::kParam, c}) || chunks_->Pinned({StateKind::kGrad, c})) continue;
    final_fired_[size_t(c)] = 1;
    if (event_log_ != nullptr) event_log_->Record(event_log_->step(), ChunkEventKind::kGradFinal, c);
    if (grad_final_) grad_final_(c);
  }
}

ParamStore::ChunkUpdate ParamStore::AcquireForUpdate(int32_t chunk, const Event** grad_ready) {
  ChunkUpdate u;
  if (grad_ready != nullptr) *grad_ready = nullptr;
  if (chunks_->DeviceAdam(chunk)) {  // never with N ranks: updates run on home shards
    // With 16-bit param chunks the update writes the master, homed beside the
    // moments; the param's 16-bit copy is narrowed from it at its next use.
    const bool master = chunks_->half_params();
    if (!master) u.accesses_.push_back({{StateKind::kParam, chunk}, true});
    u.accesses_.push_back({{StateKind::kGrad, chunk}, false});
    u.accesses_.push_back({{StateKind::kExpAvg, chunk}, true});
    u.accesses_.push_back({{StateKind::kExpAvgSq, chunk}, true});
    chunks_->Access(u.accesses_);
    u.chunks_ = chunks_.get();
    u.tier_ = Tier::kDevice;
    u.param_ = master ? chunks_->DeviceMasterForUpdate(chunk) : chunks_->DeviceData({StateKind::kParam, chunk});
    u.grad_ = chunks_->DeviceData({StateKind::kGrad, chunk});
    u.exp_avg_ = chunks_->DeviceData({StateKind::kExpAvg, chunk});
    u.exp_avg_sq_ = chunks_->DeviceData({StateKind::kExpAvgSq, chunk});
  } else {
    u.tier_ = Tier::kHost;
    if (grad_ready != nullptr) {
      const ChunkManager::GradHome g = chunks_->StartGradHome(chunk);
      u.grad_ = g.fp32;
      u.grad_half_ = g.half;
      *grad_ready = g.ready;
    } else if (chunks_->HalfHomed({StateKind::kGrad, chunk})) {
      u.grad_half_ = chunks_->HalfHostRead({StateKind::kGrad, chunk});
    } else {
      u.grad_ = chunks_->HostRead({StateKind::kGrad, chunk});
    }
    u.param_ = chunks_->HostWrite({StateKind::kParam, chunk});
    u.exp_avg_ = chunks_->HostWrite({StateKind::kExpAvg, chunk});
    u.exp_avg_sq_ = chunks_->HostWrite({StateKind::kExpAvgSq, chunk});
  }
  for (TensorId id : layout_.chunk_tensors(chunk)) states_[size_t(id)] = TensorState::kHold;
  return u;
}

ParamStore::Slice ParamStore::OwnedSlice(TensorId id) const {
  const TensorPlacement& p = layout_.placement(id);
  const int64_t shard = chunks_->shard_bytes() / int64_t(sizeof(float));
  const int64_t shard_begin = int64_t(chunks_->rank()) * shard;
  const int64_t lo = std::max(p.offset, shard_begin);
  const int64_t hi = std::min(p.offset + layout_.spec(id).numel(), shard_begin + shard);
  if (lo >= hi) return Slice{};
  return Slice{lo - p.offset, hi - p.offset, lo - shard_begin};
}

float* ParamStore::HostShard(StateKind kind, int32_t chunk) { return chunks_->HostWrite({kind, chunk}); }

const float* ParamStore::PeekShard(StateKind kind, int32_t chunk) { return chunks_->Peek({kind, chunk}); }

float* ParamStore::TensorData(StateKind kind, TensorId id) {
  if (world_size() > 1) ModelBug("whole-tensor access with several ranks:", layout_.spec(id).name);
  if (InCompute(id)) ModelBug("host write to a tensor in use:", layout_.spec(id).name);
  const TensorPlacement& p = layout_.placement(id);
  return chunks_->HostWrite({kind, p.chunk}) + p.offset;
}

const float* ParamStore::Peek(StateKind kind, TensorId id) {
  if (world_size() > 1) ModelBug("whole-tensor access with several ranks:", layout_.spec(id).name);
  const TensorPlacement& p = layout_.placement(id);
  return chunks_->Peek({kind, p.chunk}) + p.offset;
}

void ParamStore::ZeroGrads() { chunks_->ZeroFill(StateKind::kGrad); }

void ParamStore::BeginStep() {
  forward_order_.clear();
  forward_seen_.assign(size_t(layout_.num_chunks()), 0);
  step_moment_ = 0;
  step_had_backward_ = false;
  last_use_.assign(size_t(layout_.num_chunks()), -1);
  final_fired_.assign(size_t(layout_.num_chunks()), 0);
  final_order_broken_ = false;
  chunks_->BeginStep();
}

std::vector<int32_t> ParamStore::ForwardChunkOrder() const {
  std::vector<int32_t> order = forward_order_;
  for (int32_t c = 0; c < layout_.num_chunks(); ++c) {
    if (forward_seen_.empty() || !forward_seen_[size_t(c)]) order.push_back(c);
  }
  return order;
}

void ParamStore::EndStep() {
  // A training step's uses say where the next one's gradients become final.
  if (step_had_backward_) final_at_ = last_use_;
  chunks_->EndStep();
}

int64_t ParamStore::model_bytes() const {
  return int64_t(kNumStateKinds) * chunks_->num_chunks() * chunks_->shard_bytes();
}

ParamStore::Use::Use(Use&& other) noexcept
    : store_(other.store_),
      tensors_(std::move(other.tensors_)),
      accesses_(std::move(other.accesses_)),
      pass_(other.pass_),
      params_(other.params_),
      grads_(other.grads_),
      step_moment_(other.step_moment_) {
  other.store_ = nullptr;
}

ParamStore::Use::~Use() {
  if (store_ != nullptr) store_->Release(tensors_, accesses_, pass_, params_, grads_, step_moment_);
}

void ParamStore::Use::Check(TensorId id) const {
  for (TensorId t : tensors_) {
    if (t == id) return;
  }
  ModelBug("tensor used outside its bracket:", store_->layout_.spec(id).name);
}

void ParamStore::Use::CheckParams(TensorId id) const {
  Check(id);
  if (!params_) ModelBug("param requested in a use of gradients alone:", store_->layout_.spec(id).name);
}

float* ParamStore::Use::param(TensorId id) const {
  CheckParams(id);
  const TensorPlacement& p = store_->layout_.placement(id);
  return store_->chunks_->DeviceData({StateKind::kParam, p.chunk}) + p.offset;
}

const uint16_t* ParamStore::Use::half_param(TensorId id) const {
  CheckParams(id);
  const TensorPlacement& p = store_->layout_.placement(id);
  return store_->chunks_->HalfParamData(p.chunk) + p.offset;
}

float* ParamStore::Use::grad(TensorId id) const {
  Check(id);
  if (pass_ != Pass::kBackward) ModelBug("gradient requested in the forward pass:", store_->layout_.spec(id).name);
  if (!grads_) ModelBug("gradient requested in a use of values alone:", store_->layout_.spec(id).name);
  const TensorPlacement& p = store_->layout_.placement(id);
  return store_->chunks_->DeviceData({StateKind::kGrad, p.chunk}) + p.offset;
}

ParamStore::ChunkUpdate::ChunkUpdate(ChunkUpdate&& other) noexcept
    : chunks_(other.chunks_),
      accesses_(std::move(other.accesses_)),
      param_(other.param_),
      grad_(other.grad_),
      grad_half_(other.grad_half_),
      exp_avg_(other.exp_avg_),
      exp_avg_sq_(other.exp_avg_sq_),
      tier_(other.tier_) {
  other.chunks_ = nullptr;
}

ParamStore::ChunkUpdate::~ChunkUpdate() {
  if (chunks_ != nullptr) chunks_->Release(accesses_);
}

}  // namespace pstar
