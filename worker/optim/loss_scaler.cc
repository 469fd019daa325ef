#include "worker/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace pstar {

LossScaler LossScaler::FromConfig(const Fp16Section& fp16, bool enabled) {
  LossScaler s;
  if (!enabled) return s;
  s.enabled_ = true;
  s.dynamic_ = fp16.loss_scale == 0.0f;
  s.scale_ = s.dynamic_ ? std::ldexp(1.0f, int(fp16.initial_scale_power)) : fp16.loss_scale;
  s.min_scale_ = fp16.min_loss_scale;
  s.window_ = fp16.loss_scale_window;
  s.hysteresis_ = fp16.hysteresis;
  s.hysteresis_left_ = fp16.hysteresis;
  return s;
}

bool LossScaler::Update(bool finite) {
  if (!enabled_) return finite;
  if (!finite) {
    if (dynamic_) {
      if (hysteresis_left_ > 1) {
        --hysteresis_left_;
      } else {
        scale_ = std::max(scale_ * 0.5f, min_scale_);
      }
    }
    clean_steps_ = 0;
    return false;
  }
  if (dynamic_ && ++clean_steps_ >= window_) {
    scale_ *= 2.0f;
    clean_steps_ = 0;
    hysteresis_left_ = hysteresis_;
  }
  return true;
}

void LossScaler::Restore(float scale) {
  if (!enabled_) return;
  scale_ = scale;
  clean_steps_ = 0;
  hysteresis_left_ = hysteresis_;
}

}  // namespace pstar
