// The loss scaler of fp16 training. The loss is multiplied by `scale()`
// before the backward pass, so small gradients survive fp16's narrow range;
// the optimizer divides it out again. Dynamic scaling (PatrickStar's and
// DeepSpeed's fp16 keys) lowers the scale when a step's gradients overflow and
// raises it after a window of clean steps:
// - overflow: the step is skipped; after `hysteresis` overflows since the
//   last raise the scale halves (never below min_scale); the clean count
//   restarts.
// - `window` clean steps in a row: the scale doubles and the hysteresis
//   budget is restored.
// A static scale (loss_scale > 0) never changes; overflowing steps are
// still skipped. bf16 and fp32 train with a scale of 1 and no skipping.
#pragma once

#include <cstdint>

#include "worker/config/config.h"

namespace pstar {

class LossScaler {
 public:
  // From the fp16 section when `enabled` (fp16 precision), else the identity.
  static LossScaler FromConfig(const Fp16Section& fp16, bool enabled);

  float scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  // Whether the step whose gradients were `finite` is applied; updates the scale.
  bool Update(bool finite);
  // Whether a dynamic scale can go no lower (an overflow now would repeat
  // forever). A static scale never is: its overflowing steps are skipped.
  bool at_minimum() const { return dynamic_ && scale_ <= min_scale_; }

  // A resumed run continues from a checkpoint's scale; the clean-step count
  // and the hysteresis budget start afresh. Ignored when not enabled.
  void Restore(float scale);

 private:
  bool enabled_ = false;
  bool dynamic_ = false;
  float scale_ = 1.0f;
  float min_scale_ = 1.0f;
  int64_t window_ = 1000;
  int64_t hysteresis_ = 2;
  int64_t clean_steps_ = 0;
  int64_t hysteresis_left_ = 2;
};

}  // namespace pstar
