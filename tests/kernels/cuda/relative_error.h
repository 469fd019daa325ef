// The comparison the CUDA kernels' host emulations are checked by.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace pstar::test {

// The largest |got - want| over the largest |want| (at least `floor`); a NaN
// anywhere is infinitely far.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want, double floor = 0) {
  double scale = floor, worst = 0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst / std::max(scale, 1e-30);
}

}  // namespace pstar::test
