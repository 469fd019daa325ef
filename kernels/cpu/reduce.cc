#include "kernels/reduce.h"

#include <cmath>
#include <vector>

namespace pstar::kernels::cpu {

namespace {
constexpr int64_t kBlock = 8192;  // fixed: the sum order never depends on threads
}

double SumOfSquares(const float* x, int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t end = std::min(n, (b + 1) * kBlock);
    double s = 0.0;
    for (int64_t i = b * kBlock; i < end; ++i) s += double(x[i]) * double(x[i]);
    partial[size_t(b)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

bool AllFinite(const float* x, int64_t n) {
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

}  // namespace pstar::kernels::cpu
