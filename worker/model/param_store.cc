#include "worker/model/param_store.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace pstar {

const char* StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kParam: return "param";
    case StateKind::kGrad: return "grad";
    case StateKind::kExpAvg: return "exp_avg";
    case StateKind::kExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

void ParamStore::FreeDeleter::operator()(float* p) const { std::free(p); }

ParamStore::ParamStore(ParamLayout layout) : layout_(std::move(layout)) {
  const size_t bytes = size_t(layout_.chunk_elems()) * sizeof(float);
  for (auto& kind_chunks : chunks_) {
    for (int32_t c = 0; c < layout_.num_chunks(); ++c) {
      void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (p == nullptr) throw std::bad_alloc();
      kind_chunks.emplace_back(static_cast<float*>(p));
    }
  }
  compute_refs_.assign(size_t(layout_.num_tensors()), 0);
}

ParamStore::Use ParamStore::Acquire(std::initializer_list<TensorId> tensors, Pass pass) {
  std::vector<TensorId> ids(tensors);
  for (TensorId id : ids) {
    ++compute_refs_[size_t(id)];
    if (recording_) trace_.push_back({moment_, id, pass});
  }
  ++moment_;
  return Use(this, std::move(ids), pass);
}

void ParamStore::Release(const std::vector<TensorId>& tensors) {
  for (TensorId id : tensors) --compute_refs_[size_t(id)];
}

float* ParamStore::ChunkData(StateKind kind, int32_t chunk) {
  return chunks_[size_t(kind)][size_t(chunk)].get();
}

const float* ParamStore::ChunkData(StateKind kind, int32_t chunk) const {
  return chunks_[size_t(kind)][size_t(chunk)].get();
}

float* ParamStore::TensorData(StateKind kind, TensorId id) {
  const TensorPlacement& p = layout_.placement(id);
  return ChunkData(kind, p.chunk) + p.offset;
}

const float* ParamStore::TensorData(StateKind kind, TensorId id) const {
  const TensorPlacement& p = layout_.placement(id);
  return ChunkData(kind, p.chunk) + p.offset;
}

void ParamStore::ZeroGrads() {
  for (auto& chunk : chunks_[size_t(StateKind::kGrad)]) {
    std::memset(chunk.get(), 0, size_t(layout_.chunk_elems()) * sizeof(float));
  }
}

int64_t ParamStore::model_bytes() const {
  return int64_t(kNumStateKinds) * layout_.padded_elements() * int64_t(sizeof(float));
}

ParamStore::Use::Use(Use&& other) noexcept
    : store_(other.store_), tensors_(std::move(other.tensors_)), pass_(other.pass_) {
  other.store_ = nullptr;
}

ParamStore::Use::~Use() {
  if (store_ != nullptr) store_->Release(tensors_);
}

void ParamStore::Use::Check(TensorId id) const {
  for (TensorId t : tensors_) {
    if (t == id) return;
  }
  // A model-code bug, not a user error: the op touched a tensor it did not bracket.
  std::fprintf(stderr, "pstar: internal error: tensor %s used outside its bracket\n",
               store_->layout_.spec(id).name.c_str());
  std::abort();
}

float* ParamStore::Use::param(TensorId id) const {
  Check(id);
  return store_->TensorData(StateKind::kParam, id);
}

float* ParamStore::Use::grad(TensorId id) const {
  Check(id);
  if (pass_ != Pass::kBackward) {
    std::fprintf(stderr, "pstar: internal error: gradient of %s requested in the forward pass\n",
                 store_->layout_.spec(id).name.c_str());
    std::abort();
  }
  return store_->TensorData(StateKind::kGrad, id);
}

}  // namespace pstar
