// ParamStore: where every model tensor's state lives, reached only through the
// ParamLayout and bracketed uses. The model never holds a raw pointer past the
// op that asked for it; a Use marks its tensors COMPUTE for its lifetime and
// each Acquire is one "moment" of the access sequence the memory tracer
// records. Today every chunk lives in host memory; the chunk runtime changes
// where chunks live behind this interface, not the model code.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "worker/model/param_layout.h"

namespace pstar {

// The kinds of state kept per tensor, all sharing one layout.
enum class StateKind : int { kParam = 0, kGrad = 1, kExpAvg = 2, kExpAvgSq = 3 };
inline constexpr int kNumStateKinds = 4;
const char* StateKindName(StateKind kind);

enum class Pass : uint8_t { kForward, kBackward };

struct AccessRecord {
  int64_t moment;
  TensorId tensor;
  Pass pass;
};

class ParamStore {
 public:
  class Use;

  explicit ParamStore(ParamLayout layout);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamLayout& layout() const { return layout_; }

  // Brackets one op's use of `tensors`; pointers from the Use stay valid until
  // it is destroyed. In the backward pass the tensors' gradients are reachable too.
  Use Acquire(std::initializer_list<TensorId> tensors, Pass pass);

  // A whole chunk of one kind, for chunk-wise walkers (init, optimizer, norms).
  float* ChunkData(StateKind kind, int32_t chunk);
  const float* ChunkData(StateKind kind, int32_t chunk) const;

  // A tensor's elements outside any op (tests, export); not for model code.
  float* TensorData(StateKind kind, TensorId id);
  const float* TensorData(StateKind kind, TensorId id) const;

  // Sets every gradient to zero (start of an optimizer step).
  void ZeroGrads();

  // True while some Use holds `id` (the tensor is in state COMPUTE).
  bool InCompute(TensorId id) const { return compute_refs_[size_t(id)] > 0; }

  // Access-sequence recording for the memory tracer.
  void SetRecording(bool on) { recording_ = on; }
  const std::vector<AccessRecord>& trace() const { return trace_; }
  void ClearTrace() { trace_.clear(); }
  int64_t moments() const { return moment_; }

  // Bytes of model data held, all kinds together.
  int64_t model_bytes() const;

 private:
  void Release(const std::vector<TensorId>& tensors);

  struct FreeDeleter {
    void operator()(float* p) const;
  };
  using ChunkBuffer = std::unique_ptr<float, FreeDeleter>;

  ParamLayout layout_;
  std::array<std::vector<ChunkBuffer>, kNumStateKinds> chunks_;
  std::vector<int32_t> compute_refs_;
  bool recording_ = false;
  int64_t moment_ = 0;
  std::vector<AccessRecord> trace_;
};

class ParamStore::Use {
 public:
  Use(Use&& other) noexcept;
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  Use& operator=(Use&&) = delete;
  ~Use();

  float* param(TensorId id) const;
  // Only in the backward pass.
  float* grad(TensorId id) const;

 private:
  friend class ParamStore;
  Use(ParamStore* store, std::vector<TensorId> tensors, Pass pass)
      : store_(store), tensors_(std::move(tensors)), pass_(pass) {}
  void Check(TensorId id) const;

  ParamStore* store_;
  std::vector<TensorId> tensors_;
  Pass pass_;
};

}  // namespace pstar
