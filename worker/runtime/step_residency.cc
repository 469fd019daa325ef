#include "worker/runtime/step_residency.h"

namespace pstar {
namespace {

int64_t Get(const RuntimeCounters::Counter& c) { return c.load(std::memory_order_relaxed); }

}  // namespace

void StepResidency::BeginStep(const RuntimeCounters& counters) {
  open_ = true;
  for (int t = 0; t < kNumTiers; ++t) {
    int64_t bytes = 0;
    for (int k = 0; k < kNumStateKinds; ++k) bytes += Get(counters.resident_bytes[size_t(t)][size_t(k)]);
    tier_bytes_[size_t(t)] = bytes;
    peak_[size_t(t)] = bytes;
  }
  for (auto& phase : resident_) {
    for (KindBytes& kinds : phase) kinds.fill(0);
  }
  for (auto& phase : moved_) {
    for (KindBytes& kinds : phase) kinds.fill(0);
  }
  for (int d = 0; d < kNumDirections; ++d) {
    for (int k = 0; k < kNumStateKinds; ++k) {
      moved_mark_[size_t(d)][size_t(k)] = Get(counters.moved_kind_bytes[size_t(d)][size_t(k)]);
    }
  }
}

void StepResidency::EndPhase(StepPhase phase, const RuntimeCounters& counters) {
  if (!open_) return;
  const size_t p = size_t(phase);
  for (int t = 0; t < kNumTiers; ++t) {
    for (int k = 0; k < kNumStateKinds; ++k) {
      resident_[p][size_t(t)][size_t(k)] = Get(counters.resident_bytes[size_t(t)][size_t(k)]);
    }
  }
  for (int d = 0; d < kNumDirections; ++d) {
    for (int k = 0; k < kNumStateKinds; ++k) {
      const int64_t now = Get(counters.moved_kind_bytes[size_t(d)][size_t(k)]);
      moved_[p][size_t(d)][size_t(k)] += now - moved_mark_[size_t(d)][size_t(k)];
      moved_mark_[size_t(d)][size_t(k)] = now;
    }
  }
}

void StepResidency::EndStep(RuntimeCounters* counters) {
  if (!open_) return;
  EndPhase(StepPhase::kOptimizer, *counters);
  open_ = false;
  for (int p = 0; p < kNumStepPhases; ++p) {
    for (int t = 0; t < kNumTiers; ++t) {
      for (int k = 0; k < kNumStateKinds; ++k) {
        counters->step_resident_bytes[size_t(p)][size_t(t)][size_t(k)] = resident_[size_t(p)][size_t(t)][size_t(k)];
      }
    }
    for (int d = 0; d < kNumDirections; ++d) {
      for (int k = 0; k < kNumStateKinds; ++k) {
        counters->step_moved_bytes[size_t(p)][size_t(d)][size_t(k)] = moved_[size_t(p)][size_t(d)][size_t(k)];
      }
    }
  }
  for (int t = 0; t < kNumTiers; ++t) counters->step_peak_bytes[size_t(t)] = peak_[size_t(t)];
  counters->steps_recorded.fetch_add(1, std::memory_order_release);
}

}  // namespace pstar
