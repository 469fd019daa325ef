#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pstar {

float LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) return max_lr * float(step + 1) / float(warmup_steps);
  if (decay == LrDecay::kConstant) return max_lr;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double progress = std::min(1.0, double(step - warmup_steps) / double(span));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return float(double(min_lr) + (double(max_lr) - double(min_lr)) * cosine);
}

}  // namespace pstar
