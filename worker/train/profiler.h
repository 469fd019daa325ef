// Profiler: where the time of training steps goes, measured in the process
// (no nsys needed) and printed by `pstar train --profile`: per op family,
// per chunk copy direction and per collective, with counts, seconds, share of
// step time, and for copies and collectives bytes and GB/s.
//
// Ops and copies are timed on the device that runs them, by a pair of timing
// events around each one on its stream (DeviceBackend::CreateTimingEvent):
// on a GPU, CUDA events on the compute or copy stream, read once at the end
// of each step (one extra wait per step); on the CPU backend, where work
// completes as it is issued, the host clock. Collectives come from the
// communicator's own counters. Nothing here runs unless a Profiler is
// attached (Trainer::EnableProfiling): no decorator, no observer, no events.
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

// One line of the summary: an op family (OpFamilyName), a copy direction
// (DirectionName) or a collective (CollectiveOpName).
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
  double op_seconds = 0.0;    // sum over the op entries
  // Op families that ran, both copy directions, and the collectives when the
  // world has more than one rank; the most time first.
  std::vector<ProfileEntry> entries;
  const ProfileEntry* Find(ProfileKind kind, const std::string& name) const;
};

// "profile: ..." and one aligned line per entry, each ending in a newline.
std::string FormatProfile(const ProfileSummary& summary);

class Profiler final : public MoveObserver {
 public:
  // Times work on `backend`'s streams; reads `comm`'s counters (null: no
  // collectives). Both must outlive the profiler. The first `skip_steps`
  // steps are left out (warm-up: lazy initialization, the chunk trace).
  Profiler(DeviceBackend& backend, const Communicator* comm, int64_t skip_steps = 0);
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // `kernels` with every op timed (TakeLossSum and SumsOfSquares, which wait
  // for the device, pass through untimed).
  std::unique_ptr<ModelKernels> Wrap(std::unique_ptr<ModelKernels> kernels);

  // Brackets one training step. Work is timed only in between; EndStep waits
  // for the timed work to finish and adds it up.
  void BeginStep();
  void EndStep();

  // Times work of `family` queued on the compute stream, or done by the host
  // from here to EndOp (a whole phase such as the optimizer step). Returns a
  // token for EndOp. Op spans must not nest: the inner time would count twice.
  int64_t BeginOp(OpFamily family);
  void EndOp(int64_t token);

  // MoveObserver: the chunk copies, on their copy streams.
  int64_t BeginMove(Direction direction) override;
  void EndMove(int64_t token, Direction direction, int64_t bytes) override;

  ProfileSummary Summary() const;

 private:
  struct Span {
    ProfileKind kind;
    int index;  // OpFamily or Direction
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

  int64_t steps_ = 0;
  double step_seconds_ = 0.0;
  std::array<Total, kNumOpFamilies> ops_{};
  std::array<Total, kNumDirections> moves_{};
  std::array<Total, kNumCollectiveOps> collectives_{};
};

// Times one span of `family` on `profiler` for its lifetime; nothing when
// `profiler` is null.
class ProfileScope {
 public:
  ProfileScope(Profiler* profiler, OpFamily family)
      : profiler_(profiler), token_(profiler != nullptr ? profiler->BeginOp(family) : -1) {}
  ~ProfileScope() {
    if (profiler_ != nullptr) profiler_->EndOp(token_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* profiler_;
  int64_t token_;
};

}  // namespace pstar
