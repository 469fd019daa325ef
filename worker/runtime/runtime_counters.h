// RuntimeCounters: what the chunk runtime has done, as lock-free counters that
// the training thread updates and the metrics endpoint reads at scrape time.
// Gauges (resident bytes) go up and down; totals only grow.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace pstar {

// The memory tiers: the compute device (GPU memory, or its emulation in host
// RAM on the CPU backend), the host, which holds the home copy of most
// chunks, and a local disk (the disk tier, where a job has one).
enum class Tier : int { kDevice = 0, kHost = 1, kDisk = 2 };
inline constexpr int kNumTiers = 3;
inline const char* TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
  }
  return "?";
}

// The kinds of per-tensor state, all sharing one chunk layout.
enum class StateKind : int { kParam = 0, kGrad = 1, kExpAvg = 2, kExpAvgSq = 3 };
inline constexpr int kNumStateKinds = 4;
inline const char* StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kParam: return "param";
    case StateKind::kGrad: return "grad";
    case StateKind::kExpAvg: return "exp_avg";
    case StateKind::kExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

// Copy directions between the tiers.
enum class Direction : int { kHostToDevice = 0, kDeviceToHost = 1 };
inline constexpr int kNumDirections = 2;
inline const char* DirectionName(Direction d) { return d == Direction::kHostToDevice ? "h2d" : "d2h"; }

// The phases of a training step, in order; with gradient accumulation the
// forward and backward phases repeat, and the backward one ends with the
// gradients' flush to their homes. The optimizer phase runs from there to the
// step's end (gradient norm, Adam, the next step's first prefetches).
enum class StepPhase : int { kForward = 0, kBackward = 1, kOptimizer = 2 };
inline constexpr int kNumStepPhases = 3;
inline const char* StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kForward: return "forward";
    case StepPhase::kBackward: return "backward";
    case StepPhase::kOptimizer: return "optimizer";
  }
  return "?";
}

struct RuntimeCounters {
  using Counter = std::atomic<int64_t>;

  // Chunk copies present on each tier, by kind (gauges).
  std::array<std::array<Counter, kNumStateKinds>, kNumTiers> resident_bytes{};
  std::array<std::array<Counter, kNumStateKinds>, kNumTiers> resident_chunks{};
  // Activations and workspaces held on each tier (gauge).
  std::array<Counter, kNumTiers> non_model_bytes{};
  // Capacity of the device tier and the part of it chunks may use now (gauges).
  Counter device_capacity_bytes{0};
  Counter chunk_budget_bytes{0};
  // Copies between tiers (totals).
  std::array<Counter, kNumDirections> moves{};
  std::array<Counter, kNumDirections> moved_bytes{};
  std::array<std::array<Counter, kNumStateKinds>, kNumDirections> moved_kind_bytes{};  // the same, by kind
  // Device copies evicted to make room, by kind; clean ones are dropped without a copy.
  std::array<Counter, kNumStateKinds> evictions{};
  // Chunks brought to the device ahead of use, and accesses that found one there.
  Counter prefetches{0};
  Counter prefetch_hits{0};
  // The disk tier: 1 where the job has one (its series are exported only
  // then); bytes read and written, and nanoseconds the host waited for them.
  Counter disk_tier{0};
  Counter disk_read_bytes{0};
  Counter disk_written_bytes{0};
  Counter disk_wait_ns{0};

  // The last whole step (StepResidency publishes them when a step ends):
  // chunk bytes on each tier, by kind, at the end of each phase; bytes each
  // phase copied between the tiers, by kind; the most chunk bytes each tier
  // held at once; and how many steps were published.
  std::array<std::array<std::array<Counter, kNumStateKinds>, kNumTiers>, kNumStepPhases> step_resident_bytes{};
  std::array<std::array<std::array<Counter, kNumStateKinds>, kNumDirections>, kNumStepPhases> step_moved_bytes{};
  std::array<Counter, kNumTiers> step_peak_bytes{};
  Counter steps_recorded{0};
};

}  // namespace pstar
