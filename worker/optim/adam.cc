#include "worker/optim/adam.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/adam.h"
#include "kernels/reduce.h"
#ifdef PSTAR_WITH_CUDA
#include "kernels/cuda/adam.h"
#endif

namespace pstar {

const std::vector<AdamOptimizer::Span>& AdamOptimizer::SpansOf(const ParamStore& store, int32_t chunk) {
  const ParamLayout& layout = store.layout();
  if (spans_.empty()) spans_.resize(size_t(layout.num_chunks()));
  std::vector<Span>& spans = spans_[size_t(chunk)];
  if (!spans.empty()) return spans;
  // This rank's slices of the chunk's tensors lie back to back in its shard,
  // so each run with the same weight decay is one contiguous span and one
  // kernel call.
  const std::vector<TensorId>& tensors = layout.chunk_tensors(chunk);
  size_t first = 0;
  while (first < tensors.size()) {
    const ParamStore::Slice s = store.OwnedSlice(tensors[first]);
    if (s.begin == s.end) {
      ++first;
      continue;
    }
    const bool decayed = layout.spec(tensors[first]).decayed();
    const int64_t begin = s.shard_offset;
    int64_t end = begin + (s.end - s.begin);
    size_t last = first + 1;
    while (last < tensors.size() && layout.spec(tensors[last]).decayed() == decayed) {
      const ParamStore::Slice next = store.OwnedSlice(tensors[last]);
      if (next.begin == next.end || next.shard_offset != end) break;
      end += next.end - next.begin;
      ++last;
    }
    spans.push_back({begin, end, decayed});
    first = last;
  }
  if (spans.empty()) spans.push_back({0, 0, false});  // nothing owned: an empty run marks the chunk done
  return spans;
}

kernels::cpu::AdamParams AdamOptimizer::ParamsFor(int64_t step, float lr, float grad_scale) const {
  kernels::cpu::AdamParams p{};
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.grad_scale = grad_scale;
  p.bias_correction1 = float(1.0 - std::pow(double(config_.beta1), double(step)));
  p.bias_correction2 = float(1.0 - std::pow(double(config_.beta2), double(step)));
  return p;
}

namespace {

// One chunk's update on the host, span by span.
struct HostChunkUpdate {
  float* param;
  const float* grad;
  const uint16_t* grad_half;
  kernels::cpu::HalfType half_type;
  float* exp_avg;
  float* exp_avg_sq;
  float weight_decay;
  bool decoupled;

  void Run(const std::vector<AdamOptimizer::Span>& spans, kernels::cpu::AdamParams p) const {
    for (const AdamOptimizer::Span& s : spans) {
      if (s.begin == s.end) continue;
      const float wd = s.decayed ? weight_decay : 0.0f;
      p.decoupled_weight_decay = decoupled ? wd : 0.0f;
      p.l2_weight_decay = decoupled ? 0.0f : wd;
      if (grad_half != nullptr) {
        // 16-bit gradient homes, widened exactly as the kernel reads them.
        kernels::cpu::AdamUpdate(param + s.begin, grad_half + s.begin, half_type, exp_avg + s.begin,
                                 exp_avg_sq + s.begin, s.end - s.begin, p);
      } else {
        kernels::cpu::AdamUpdate(param + s.begin, grad + s.begin, exp_avg + s.begin, exp_avg_sq + s.begin,
                                 s.end - s.begin, p);
      }
    }
  }
};

kernels::cpu::HalfType GradHalfType(const ParamStore& store) {
  return store.chunks().options().grad_home == HalfFormat::kFp16 ? kernels::cpu::HalfType::kFloat16
                                                                 : kernels::cpu::HalfType::kBFloat16;
}

}  // namespace

void AdamOptimizer::Step(ParamStore& store, float lr, float grad_scale, AsyncUpdater* async,
                         std::span<const int32_t> order, const std::vector<uint8_t>* done) {
  ++step_;
  kernels::cpu::AdamParams p = ParamsFor(step_, lr, grad_scale);
  const ParamLayout& layout = store.layout();
  ChunkManager& chunks = store.chunks();
  DeviceBackend& backend = chunks.backend();
  const bool decoupled = config_.decoupled_weight_decay;
  const float weight_decay = config_.weight_decay;
  ChunkEventLog* log = store.event_log();
  const int64_t event_step = log != nullptr ? log->step() : 0;
  std::vector<int32_t> chunk_order(order.begin(), order.end());
  if (chunk_order.empty()) {
    for (int32_t c = 0; c < layout.num_chunks(); ++c) chunk_order.push_back(c);
  }
  if (int32_t(chunk_order.size()) != layout.num_chunks()) {
    std::fprintf(stderr, "pstar: internal error: an optimizer step over %zu of %d chunks\n", chunk_order.size(),
                 layout.num_chunks());
    std::abort();
  }
  chunks.BeginUpdates();
  for (int32_t c : chunk_order) {
    if (done != nullptr && (*done)[size_t(c)]) {
      chunks.UpdateDone(c);
      continue;
    }
    const std::vector<Span>& spans = SpansOf(store, c);
    ParamStore::ChunkUpdate u = store.AcquireForUpdate(c);
    // The hybrid placement: chunks whose moments live on a GPU update there,
    // on the compute stream; the rest on the host.
    if (u.tier() == Tier::kDevice && !backend.device_is_host_memory()) {
#ifdef PSTAR_WITH_CUDA
      if (log != nullptr) log->Record(event_step, ChunkEventKind::kUpdateBegin, c);
      for (const Span& s : spans) {
        if (s.begin == s.end) continue;
        const float wd = s.decayed ? weight_decay : 0.0f;
        p.decoupled_weight_decay = decoupled ? wd : 0.0f;
        p.l2_weight_decay = decoupled ? 0.0f : wd;
        kernels::cuda::AdamUpdate<float>(u.param() + s.begin, nullptr, u.grad() + s.begin, u.exp_avg() + s.begin,
                                         u.exp_avg_sq() + s.begin, s.end - s.begin, p,
                                         static_cast<cudaStream_t>(backend.stream_handle(StreamKind::kCompute)));
      }
      if (log != nullptr) log->Record(event_step, ChunkEventKind::kUpdateEnd, c);
#endif
      continue;
    }
    const HostChunkUpdate host{u.param(),     u.grad(),          u.grad_half(), GradHalfType(store),
                               u.exp_avg(),   u.exp_avg_sq(),    weight_decay,  decoupled};
    // Chunks homed on disk update here: their windows are the manager's, valid
    // only until its next call.
    const bool queued = async != nullptr && u.tier() == Tier::kHost && !chunks.DiskHomed({StateKind::kExpAvg, c}) &&
                        !chunks.DiskHomed({StateKind::kParam, c});
    if (queued) {
      async->Submit(c, event_step, [host, spans, p] { host.Run(spans, p); });
      continue;
    }
    if (log != nullptr) log->Record(event_step, ChunkEventKind::kUpdateBegin, c);
    const auto start = std::chrono::steady_clock::now();
    host.Run(spans, p);
    host_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log != nullptr) log->Record(event_step, ChunkEventKind::kUpdateEnd, c);
    chunks.UpdateDone(c);
  }
}

bool AdamOptimizer::Speculable(const ParamStore& store, int32_t chunk) {
  const ChunkManager& chunks = store.chunks();
  return chunks.world_size() == 1 && !chunks.DeviceAdam(chunk) && !chunks.DiskHomed({StateKind::kExpAvg, chunk}) &&
         !chunks.DiskHomed({StateKind::kParam, chunk});
}

void AdamOptimizer::Speculate(ParamStore& store, int32_t chunk, float lr, float grad_scale, const UndoSlot& undo,
                              AsyncUpdater& async) {
  if (!Speculable(store, chunk)) {
    std::fprintf(stderr, "pstar: internal error: speculative update of chunk %d, which cannot be undone\n", chunk);
    std::abort();
  }
  const kernels::cpu::AdamParams p = ParamsFor(step_ + 1, lr, grad_scale);
  const std::vector<Span>& spans = SpansOf(store, chunk);
  const Event* grad_ready = nullptr;
  ParamStore::ChunkUpdate u = store.AcquireForUpdate(chunk, &grad_ready);
  const HostChunkUpdate host{u.param(),   u.grad(),       u.grad_half(),        GradHalfType(store),
                             u.exp_avg(), u.exp_avg_sq(), config_.weight_decay, config_.decoupled_weight_decay};
  const size_t bytes = size_t(store.chunks().shard_bytes());
  DeviceBackend* backend = &store.chunks().backend();
  ChunkEventLog* log = store.event_log();
  async.Submit(chunk, log != nullptr ? log->step() : 0, [host, spans, p, undo, bytes, backend, grad_ready] {
    // The gradient's copy home was queued behind the op that finished it,
    // which ran after every copy of the param to the device: once it is
    // done, nothing reads or writes these homes but this update.
    if (grad_ready != nullptr) backend->Synchronize(*grad_ready);
    std::memcpy(undo.param, host.param, bytes);
    std::memcpy(undo.exp_avg, host.exp_avg, bytes);
    std::memcpy(undo.exp_avg_sq, host.exp_avg_sq, bytes);
    host.Run(spans, p);
  });
}

void AdamOptimizer::Undo(ParamStore& store, int32_t chunk, const UndoSlot& undo) {
  const size_t bytes = size_t(store.chunks().shard_bytes());
  std::memcpy(store.HostShard(StateKind::kParam, chunk), undo.param, bytes);
  std::memcpy(store.HostShard(StateKind::kExpAvg, chunk), undo.exp_avg, bytes);
  std::memcpy(store.HostShard(StateKind::kExpAvgSq, chunk), undo.exp_avg_sq, bytes);
  if (ChunkEventLog* log = store.event_log(); log != nullptr) {
    log->Record(log->step(), ChunkEventKind::kUpdateUndone, chunk);
  }
}

StepSums TakeStepSums(ParamStore& store, ModelKernels& ops) {
  const ParamLayout& layout = store.layout();
  const bool host_reads_device = store.chunks().backend().device_is_host_memory();
  // One sum per owned tensor slice, taken where the gradient lies (both
  // kernels add in the same order), then added up in layout order.
  std::vector<double> sums;
  std::vector<ModelKernels::Span> on_device;
  std::vector<size_t> on_device_index;
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    const ChunkManager::CurrentCopy shard = store.CurrentShard(StateKind::kGrad, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const ParamStore::Slice s = store.OwnedSlice(id);
      const ModelKernels::Span span{shard.data + s.shard_offset, s.end - s.begin};
      if (shard.on_device && !host_reads_device) {
        on_device.push_back(span);
        on_device_index.push_back(sums.size());
        sums.push_back(0.0);
      } else {
        sums.push_back(kernels::cpu::SumOfSquares(span.data, span.n));
      }
    }
  }
  StepSums out;
  std::vector<double> device_sums(on_device.size());
  out.loss_sum = ops.TakeStepSums(on_device, device_sums.data());
  for (size_t i = 0; i < on_device.size(); ++i) sums[on_device_index[i]] = device_sums[i];
  for (double s : sums) out.grad_squares += s;
  return out;
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace pstar
