#include "worker/train/profiler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "worker/core/bytes.h"

namespace pstar {

namespace {

StreamKind MoveStream(Direction d) {
  return d == Direction::kHostToDevice ? StreamKind::kHostToDevice : StreamKind::kDeviceToHost;
}

// ModelKernels with every op bracketed by a profiler span on the compute
// stream; the work itself is the wrapped kernels'.
class TimedKernels final : public ModelKernels {
 public:
  TimedKernels(Profiler& profiler, std::unique_ptr<ModelKernels> inner)
      : profiler_(profiler), inner_(std::move(inner)) {}

  ComputeDevice device() const override { return inner_->device(); }
  Precision precision() const override { return inner_->precision(); }
  void SetScratch(void* scratch, int64_t bytes) override { inner_->SetScratch(scratch, bytes); }

  void DownloadRows(float* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) override {
    inner_->DownloadRows(dst, src, rows, cols, ld);
  }
  void Upload(int32_t* dst, const int32_t* src, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kUpload);
    inner_->Upload(dst, src, n);
  }
  void Zero(float* dst, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kZero);
    inner_->Zero(dst, n);
  }
  void AddToLossSum(const float* x, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kLossSum);
    inner_->AddToLossSum(x, n);
  }
  // Waits for the device: its time is the ops' before it, not its own.
  double TakeLossSum() override { return inner_->TakeLossSum(); }
  // Part of GradientNorm, which the trainer times as a whole.
  void SumsOfSquares(std::span<const Span> spans, double* sums) override { inner_->SumsOfSquares(spans, sums); }
  void RoundToPrecision(float* x, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kGradRound);
    inner_->RoundToPrecision(x, n);
  }

  void EncoderForward(ActTensor out, const int32_t* tokens, Param wte, Param wpe, int64_t B, int64_t T,
                      int64_t C) override {
    ProfileScope t(&profiler_, OpFamily::kEncoder);
    inner_->EncoderForward(out, tokens, wte, wpe, B, T, C);
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                       int64_t C) override {
    ProfileScope t(&profiler_, OpFamily::kEncoder);
    inner_->EncoderBackward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void ResidualLayerNormForward(ActTensor res, ActTensor out, float* mean, float* rstd, ActTensor a, const float* b,
                                Param weight, Param bias, int64_t N, int64_t C) override {
    ProfileScope t(&profiler_, OpFamily::kLayerNorm);
    inner_->ResidualLayerNormForward(res, out, mean, rstd, a, b, weight, bias, N, C);
  }
  void LayerNormForward(ActTensor out, float* mean, float* rstd, ActTensor inp, Param weight, Param bias,
                        int64_t N, int64_t C) override {
    ProfileScope t(&profiler_, OpFamily::kLayerNorm);
    inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, ActTensor inp,
                         Param weight, const float* mean, const float* rstd, int64_t N, int64_t C) override {
    ProfileScope t(&profiler_, OpFamily::kLayerNorm);
    inner_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void MatmulForward(ActTensor out, ActTensor inp, Param weight, Param bias, int64_t N, int64_t C,
                     int64_t OC) override {
    ProfileScope t(&profiler_, OpFamily::kMatmul);
    inner_->MatmulForward(out, inp, weight, bias, N, C, OC);
  }
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, ActTensor inp,
                      Param weight, int64_t N, int64_t C, int64_t OC) override {
    ProfileScope t(&profiler_, OpFamily::kMatmul);
    inner_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void AttentionForward(ActTensor out, float* lse, ActTensor qkv, int64_t B, int64_t T, int64_t C,
                        int64_t NH) override {
    ProfileScope t(&profiler_, OpFamily::kAttention);
    inner_->AttentionForward(out, lse, qkv, B, T, C, NH);
  }
  void AttentionBackward(float* dqkv, const float* dout, ActTensor qkv, ActTensor out, const float* lse,
                         int64_t B, int64_t T, int64_t C, int64_t NH) override {
    ProfileScope t(&profiler_, OpFamily::kAttention);
    inner_->AttentionBackward(dqkv, dout, qkv, out, lse, B, T, C, NH);
  }
  void GeluForward(ActTensor out, ActTensor inp, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kGelu);
    inner_->GeluForward(out, inp, n);
  }
  void GeluBackward(float* dinp, ActTensor inp, const float* dout, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kGelu);
    inner_->GeluBackward(dinp, inp, dout, n);
  }
  void ResidualForward(ActTensor out, ActTensor a, const float* b, int64_t n) override {
    ProfileScope t(&profiler_, OpFamily::kResidual);
    inner_->ResidualForward(out, a, b, n);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp) override {
    ProfileScope t(&profiler_, OpFamily::kCrossEntropy);
    inner_->CrossEntropyForward(losses, lse, logits, targets, N, V, Vp);
  }
  void CrossEntropyBackwardInPlace(float* logits, const float* lse, const int32_t* targets, float dloss,
                                   int64_t N, int64_t V, int64_t Vp) override {
    ProfileScope t(&profiler_, OpFamily::kCrossEntropy);
    inner_->CrossEntropyBackwardInPlace(logits, lse, targets, dloss, N, V, Vp);
  }

 private:
  Profiler& profiler_;
  std::unique_ptr<ModelKernels> inner_;
};

}  // namespace

const char* ProfileKindName(ProfileKind kind) {
  switch (kind) {
    case ProfileKind::kOp: return "op";
    case ProfileKind::kMove: return "move";
    case ProfileKind::kCollective: return "collective";
  }
  return "?";
}

const ProfileEntry* ProfileSummary::Find(ProfileKind kind, const std::string& name) const {
  for (const ProfileEntry& e : entries) {
    if (e.kind == kind && e.name == name) return &e;
  }
  return nullptr;
}

Profiler::Profiler(DeviceBackend& backend, const Communicator* comm, int64_t skip_steps)
    : backend_(backend), comm_(comm), skip_steps_(skip_steps) {}

std::unique_ptr<ModelKernels> Profiler::Wrap(std::unique_ptr<ModelKernels> kernels) {
  return std::make_unique<TimedKernels>(*this, std::move(kernels));
}

void Profiler::BeginStep() {
  // Spans of an unfinished step (one that failed) are dropped.
  spans_.clear();
  next_event_ = 0;
  in_step_ = true;
  measuring_ = steps_seen_ >= skip_steps_;
  if (!measuring_) return;
  if (comm_ != nullptr) {
    const CollectiveCounters& c = comm_->counters();
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      calls_at_start_[size_t(op)] = c.calls[size_t(op)].load();
      bytes_at_start_[size_t(op)] = c.bytes[size_t(op)].load();
      ns_at_start_[size_t(op)] = c.nanoseconds[size_t(op)].load();
    }
  }
  step_start_ = std::chrono::steady_clock::now();
}

void Profiler::EndStep() {
  if (!in_step_) return;
  in_step_ = false;
  ++steps_seen_;
  if (!measuring_) return;
  measuring_ = false;
  // The one wait profiling adds: every span's end event has been reached.
  for (const Span& s : spans_) {
    if (s.end == nullptr) continue;  // never ended: its op failed
    const double seconds = backend_.ElapsedSeconds(*s.start, *s.end);
    Total& t = s.kind == ProfileKind::kOp ? ops_[size_t(s.index)] : moves_[size_t(s.index)];
    ++t.count;
    t.seconds += seconds;
    t.bytes += s.bytes;
  }
  spans_.clear();
  next_event_ = 0;
  if (comm_ != nullptr) {
    const CollectiveCounters& c = comm_->counters();
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      Total& t = collectives_[size_t(op)];
      t.count += c.calls[size_t(op)].load() - calls_at_start_[size_t(op)];
      t.bytes += c.bytes[size_t(op)].load() - bytes_at_start_[size_t(op)];
      t.seconds += double(c.nanoseconds[size_t(op)].load() - ns_at_start_[size_t(op)]) * 1e-9;
    }
  }
  step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  ++steps_;
}

Event* Profiler::NextEvent() {
  if (next_event_ == events_.size()) events_.push_back(backend_.CreateTimingEvent());
  return events_[next_event_++].get();
}

int64_t Profiler::Begin(ProfileKind kind, int index, StreamKind stream) {
  if (!measuring_) return -1;
  Event* start = NextEvent();
  backend_.Record(*start, stream);
  spans_.push_back({kind, index, start, nullptr, 0});
  return int64_t(spans_.size()) - 1;
}

void Profiler::End(int64_t token, StreamKind stream, int64_t bytes) {
  if (token < 0 || !measuring_ || size_t(token) >= spans_.size()) return;
  Span& s = spans_[size_t(token)];
  s.end = NextEvent();
  backend_.Record(*s.end, stream);
  s.bytes = bytes;
}

int64_t Profiler::BeginOp(OpFamily family) { return Begin(ProfileKind::kOp, int(family), StreamKind::kCompute); }

void Profiler::EndOp(int64_t token) { End(token, StreamKind::kCompute, 0); }

int64_t Profiler::BeginMove(Direction direction) {
  return Begin(ProfileKind::kMove, int(direction), MoveStream(direction));
}

void Profiler::EndMove(int64_t token, Direction direction, int64_t bytes) {
  End(token, MoveStream(direction), bytes);
}

ProfileSummary Profiler::Summary() const {
  ProfileSummary s;
  s.clock = backend_.device_is_host_memory() ? "the host clock" : "CUDA events";
  s.steps = steps_;
  s.skipped_steps = std::min(steps_seen_, skip_steps_);
  s.step_seconds = step_seconds_;
  auto add = [&](ProfileKind kind, std::string name, const Total& t) {
    ProfileEntry e;
    e.kind = kind;
    e.name = std::move(name);
    e.count = t.count;
    e.seconds = t.seconds;
    e.bytes = t.bytes;
    e.share = step_seconds_ > 0.0 ? 100.0 * t.seconds / step_seconds_ : 0.0;
    s.entries.push_back(std::move(e));
  };
  for (int f = 0; f < kNumOpFamilies; ++f) {
    const Total& t = ops_[size_t(f)];
    if (t.count == 0) continue;
    s.op_seconds += t.seconds;
    add(ProfileKind::kOp, OpFamilyName(OpFamily(f)), t);
  }
  for (int d = 0; d < kNumDirections; ++d) add(ProfileKind::kMove, DirectionName(Direction(d)), moves_[size_t(d)]);
  if (comm_ != nullptr && comm_->world_size() > 1) {
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      add(ProfileKind::kCollective, CollectiveOpName(CollectiveOp(op)), collectives_[size_t(op)]);
    }
  }
  std::stable_sort(s.entries.begin(), s.entries.end(),
                   [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
  return s;
}

std::string FormatProfile(const ProfileSummary& s) {
  char line[256];
  std::string out;
  std::string skipped;
  if (s.skipped_steps > 0) {
    skipped = " (" + std::to_string(s.skipped_steps) + " warm-up step" + (s.skipped_steps > 1 ? "s" : "") +
              " left out)";
  }
  std::snprintf(line, sizeof line, "profile: %lld steps%s | step time %.3f s | ops %.3f s = %.1f%%, timed by %s\n",
                (long long)s.steps, skipped.c_str(), s.step_seconds, s.op_seconds,
                s.step_seconds > 0.0 ? 100.0 * s.op_seconds / s.step_seconds : 0.0, s.clock);
  out += line;
  for (const ProfileEntry& e : s.entries) {
    std::snprintf(line, sizeof line, "  %-10s  %-14s %9lld calls %10.4f s %6.1f%%", ProfileKindName(e.kind),
                  e.name.c_str(), (long long)e.count, e.seconds, e.share);
    out += line;
    if (e.kind != ProfileKind::kOp) {
      std::snprintf(line, sizeof line, " %11s %8.2f GB/s", FormatBytes(e.bytes).c_str(), e.GigabytesPerSecond());
      out += line;
    }
    out += '\n';
  }
  return out;
}

}  // namespace pstar
