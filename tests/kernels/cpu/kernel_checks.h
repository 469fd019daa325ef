// What the CPU kernel tests check with: random inputs, the relative error
// against a double-precision reference, and central finite differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace pstar::kernels::cpu::checks {

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a - b| / max |b|.
inline double MaxRelative(const std::vector<float>& a, const std::vector<double>& b) {
  double maxb = 1e-12, maxd = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    maxb = std::max(maxb, std::abs(b[i]));
    maxd = std::max(maxd, std::abs(double(a[i]) - b[i]));
  }
  return maxd / maxb;
}

// d(sum(weights * f(x)))/dx by central differences in float.
inline std::vector<double> NumericGrad(std::vector<float>& x, const std::vector<float>& weights,
                                       const std::function<std::vector<float>()>& f, float h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    auto up = f();
    x[i] = keep - h;
    auto down = f();
    x[i] = keep;
    double s = 0;
    for (size_t j = 0; j < up.size(); ++j) s += double(weights[j]) * (double(up[j]) - double(down[j]));
    g[i] = s / (2.0 * h);
  }
  return g;
}

}  // namespace pstar::kernels::cpu::checks
