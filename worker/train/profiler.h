// Profiler: where the time of training steps goes, measured in the process
// (no nsys needed) and printed by `pstar train --profile`: per ProfileOp row
// (each GEMM by layer role and pass, each other op by pass, casts, bias
// gradients, the gradient norm, the optimizer), the compute stream's idle
// time, per chunk copy direction and per collective, with counts, seconds,
// share of step time, and for copies and collectives bytes and GB/s.
//
// Ops and copies are timed on the device that runs them, by a pair of timing
// events around each one on its stream (DeviceBackend::CreateTimingEvent):
// on a GPU, CUDA events on the compute or copy stream, read once at the end
// of each step (one extra wait per step); on the CPU backend, where work
// completes as it is issued, the host clock. The kernels report their work
// themselves (ModelKernels::SetTimer). Collectives come from the
// communicator's own counters. Nothing here runs unless a Profiler is
// attached (Trainer::EnableProfiling): no timer, no observer, no events.
// docs/profiling.md has the details.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/dist/communicator.h"
#include "worker/model/model_kernels.h"
#include "worker/runtime/chunk_manager.h"
#include "worker/runtime/device_backend.h"

namespace pstar {

enum class ProfileKind : int { kOp = 0, kMove, kCollective };
const char* ProfileKindName(ProfileKind kind);  // "op", "move", "collective"

// One line of the summary: an op (ProfileOpName, or "idle": the step time no
// op covered), a copy direction (DirectionName) or a collective
// (CollectiveOpName).
struct ProfileEntry {
  ProfileKind kind = ProfileKind::kOp;
  std::string name;
  int64_t count = 0;
  double seconds = 0.0;
  double share = 0.0;  // percent of the step time
  int64_t bytes = 0;   // moves and collectives: what this rank moved or sent
  double GigabytesPerSecond() const { return seconds > 0.0 ? double(bytes) / seconds * 1e-9 : 0.0; }
};

struct ProfileSummary {
  const char* clock = "";  // how ops and copies were timed
  int64_t steps = 0;       // steps measured
  int64_t skipped_steps = 0;  // warm-up steps left out
  double step_seconds = 0.0;  // wall time of the measured steps
  double op_seconds = 0.0;    // sum over the op entries, idle left out
  // The step time no op covered: the compute stream waiting (for the host,
  // a copy or a collective) and host work between ops. The op entries and
  // idle add up to the step time.
  double idle_seconds = 0.0;
  // Ops that ran, idle, both copy directions, and the collectives when the
  // world has more than one rank; the most time first.
  std::vector<ProfileEntry> entries;
  const ProfileEntry* Find(ProfileKind kind, const std::string& name) const;
};

// "profile: ..." and one aligned line per entry, each ending in a newline.
std::string FormatProfile(const ProfileSummary& summary);

class Profiler final : public OpTimer, public MoveObserver {
 public:
  // Times work on `backend`'s streams; reads `comm`'s counters (null: no
  // collectives). Both must outlive the profiler. The first `skip_steps`
  // steps are left out (warm-up: lazy initialization, the chunk trace).
  Profiler(DeviceBackend& backend, const Communicator* comm, int64_t skip_steps = 0);
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Brackets one training step. Work is timed only in between; EndStep waits
  // for the timed work to finish and adds it up.
  void BeginStep();
  void EndStep();

  // OpTimer: times work of `op` queued on the compute stream, or done by the
  // host from here to EndOp (a whole phase such as the optimizer step).
  // Returns a token for EndOp. A span opened inside another is not timed
  // (the outer one holds its time), so nothing counts twice.
  int64_t BeginOp(ProfileOp op) override;
  void EndOp(int64_t token) override;

  // MoveObserver: the chunk copies, on their copy streams.
  int64_t BeginMove(Direction direction) override;
  void EndMove(int64_t token, Direction direction, int64_t bytes) override;

  ProfileSummary Summary() const;

  // The last measured step alone: its wall time, the compute stream's ops
  // (the device's kernel time), what no op covered, and each copy
  // direction's time. `measured` is false before the first measured step.
  struct StepProfile {
    bool measured = false;
    double step_seconds = 0.0, op_seconds = 0.0, idle_seconds = 0.0;
    std::array<double, kNumDirections> move_seconds{};
  };
  const StepProfile& last_step() const { return last_step_; }

 private:
  struct Span {
    ProfileKind kind;
    int index;  // ProfileOp or Direction
    Event* start;
    Event* end;
    int64_t bytes;
  };
  struct Total {
    int64_t count = 0;
    double seconds = 0.0;
    int64_t bytes = 0;
  };
  int64_t Begin(ProfileKind kind, int index, StreamKind stream);
  void End(int64_t token, StreamKind stream, int64_t bytes);
  Event* NextEvent();

  DeviceBackend& backend_;
  const Communicator* comm_;
  int64_t skip_steps_;
  int64_t steps_seen_ = 0;
  bool in_step_ = false;
  bool measuring_ = false;  // in a step past the warm-up
  std::chrono::steady_clock::time_point step_start_;
  std::array<int64_t, kNumCollectiveOps> calls_at_start_{}, bytes_at_start_{}, ns_at_start_{};

  // This step's spans and the timing events they use; the events are reused
  // every step.
  std::vector<Span> spans_;
  std::vector<std::unique_ptr<Event>> events_;
  size_t next_event_ = 0;
  int open_ops_ = 0;  // op spans begun and not yet ended

  int64_t steps_ = 0;
  double step_seconds_ = 0.0;
  std::array<Total, kNumProfileOps> ops_{};
  double idle_seconds_ = 0.0;
  StepProfile last_step_;
  std::array<Total, kNumDirections> moves_{};
  std::array<Total, kNumCollectiveOps> collectives_{};
};

}  // namespace pstar
