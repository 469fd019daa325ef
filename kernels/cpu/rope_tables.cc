#include <cmath>
#include <numbers>

#include "kernels/rope.h"

namespace pstar::kernels {

namespace {

// Llama 3's scaling of one frequency: short wavelengths (below the original
// context over high_freq_factor) keep theirs, long ones (beyond it over
// low_freq_factor) are divided by `factor`, and those between blend the two
// by where the wavelength falls.
double ScaledFrequency(double f, const RopeScaling& s) {
  const double context = double(s.original_max_position_embeddings);
  const double wavelength = 2.0 * std::numbers::pi / f;
  if (wavelength < context / s.high_freq_factor) return f;
  if (wavelength > context / s.low_freq_factor) return f / s.factor;
  const double smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

}  // namespace

void RopeTables(float* cos, float* sin, int64_t positions, int64_t head_dim, double theta,
                const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
    if (scaling.llama3) f = ScaledFrequency(f, scaling);
    for (int64_t p = 0; p < positions; ++p) {
      const double angle = double(p) * f;
      cos[p * half + i] = float(std::cos(angle));
      sin[p * half + i] = float(std::sin(angle));
    }
  }
}

}  // namespace pstar::kernels
