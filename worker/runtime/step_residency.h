// StepResidency: where the chunks were at fixed points of the last whole step.
//
// The live residency gauges change many times a step, so a scrape samples a
// random moment of it and a residency panel looks like noise. This recorder
// follows the step instead: the bytes on each tier at the end of each phase
// (forward, backward, optimizer), the most chunk bytes each tier held during
// the step, and the bytes each phase moved between the tiers. It publishes
// them into RuntimeCounters when the step ends, so every scrape between two
// step ends reads the same, whole step.
#pragma once

#include <array>
#include <cstdint>

#include "worker/runtime/runtime_counters.h"

namespace pstar {

class StepResidency {
 public:
  // Starts a step from the counters' current residency and totals.
  void BeginStep(const RuntimeCounters& counters);
  // Chunk bytes on `tier` changed by `delta` (every change, as it happens).
  void OnResidencyChange(Tier tier, int64_t delta) {
    tier_bytes_[size_t(tier)] += delta;
    if (tier_bytes_[size_t(tier)] > peak_[size_t(tier)]) peak_[size_t(tier)] = tier_bytes_[size_t(tier)];
  }
  // `phase` has just ended: its residency is recorded (a later end of the same
  // phase in the step, as with gradient accumulation, replaces it) and the
  // bytes moved since the previous end are added to it.
  void EndPhase(StepPhase phase, const RuntimeCounters& counters);
  // Ends the step as the optimizer phase and publishes it into `counters`.
  void EndStep(RuntimeCounters* counters);

 private:
  using KindBytes = std::array<int64_t, kNumStateKinds>;
  bool open_ = false;
  std::array<int64_t, kNumTiers> tier_bytes_{};
  std::array<int64_t, kNumTiers> peak_{};
  std::array<std::array<KindBytes, kNumTiers>, kNumStepPhases> resident_{};
  std::array<std::array<KindBytes, kNumDirections>, kNumStepPhases> moved_{};
  std::array<KindBytes, kNumDirections> moved_mark_{};  // moved_kind_bytes at the last phase end
};

}  // namespace pstar
