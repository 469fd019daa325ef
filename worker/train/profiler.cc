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

void Profiler::BeginStep() {
  // Spans of an unfinished step (one that failed) are dropped.
  spans_.clear();
  next_event_ = 0;
  open_ops_ = 0;
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
  double op_seconds = 0.0;
  last_step_ = StepProfile{};
  last_step_.measured = true;
  for (const Span& s : spans_) {
    if (s.end == nullptr) continue;  // never ended: its op failed
    const double seconds = backend_.ElapsedSeconds(*s.start, *s.end);
    Total& t = s.kind == ProfileKind::kOp ? ops_[size_t(s.index)] : moves_[size_t(s.index)];
    ++t.count;
    t.seconds += seconds;
    t.bytes += s.bytes;
    if (s.kind == ProfileKind::kOp) op_seconds += seconds;
    if (s.kind == ProfileKind::kMove) last_step_.move_seconds[size_t(s.index)] += seconds;
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
  const double step = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  step_seconds_ += step;
  // Ops run one after another on the compute stream (spans never nest), so
  // what they leave of the step is time no op covered. Two clocks: a step
  // shorter than its ops by their resolution leaves no idle time.
  idle_seconds_ += std::max(0.0, step - op_seconds);
  last_step_.step_seconds = step;
  last_step_.op_seconds = op_seconds;
  last_step_.idle_seconds = std::max(0.0, step - op_seconds);
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

int64_t Profiler::BeginOp(ProfileOp op) {
  // An op inside another (a kernel the optimizer calls) is the outer one's time.
  if (open_ops_++ > 0) return -1;
  return Begin(ProfileKind::kOp, int(op), StreamKind::kCompute);
}

void Profiler::EndOp(int64_t token) {
  if (open_ops_ > 0) --open_ops_;
  End(token, StreamKind::kCompute, 0);
}

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
  for (int op = 0; op < kNumProfileOps; ++op) {
    const Total& t = ops_[size_t(op)];
    if (t.count == 0) continue;
    s.op_seconds += t.seconds;
    add(ProfileKind::kOp, ProfileOpName(ProfileOp(op)), t);
  }
  s.idle_seconds = idle_seconds_;
  if (steps_ > 0) add(ProfileKind::kOp, "idle", Total{steps_, idle_seconds_, 0});
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
  std::snprintf(line, sizeof line,
                "profile: %lld steps%s | step time %.3f s | ops %.3f s = %.1f%%, idle %.3f s, timed by %s\n",
                (long long)s.steps, skipped.c_str(), s.step_seconds, s.op_seconds,
                s.step_seconds > 0.0 ? 100.0 * s.op_seconds / s.step_seconds : 0.0, s.idle_seconds, s.clock);
  out += line;
  for (const ProfileEntry& e : s.entries) {
    std::snprintf(line, sizeof line, "  %-10s  %-23s %9lld calls %10.4f s %6.1f%%", ProfileKindName(e.kind),
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
