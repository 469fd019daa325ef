// Learning-rate schedule: linear warmup from lr/warmup to lr, then cosine (or
// constant) decay to min_lr at the last step.
#pragma once

#include <cstdint>

namespace pstar {

enum class LrDecay { kCosine, kConstant };

struct LrSchedule {
  float max_lr = 0.0f;
  float min_lr = 0.0f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrDecay decay = LrDecay::kCosine;

  // Learning rate for 0-based `step`.
  float At(int64_t step) const;
};

}  // namespace pstar
