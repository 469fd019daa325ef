#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// The shape of the CUDA reduction (kernels/cuda/reduce.cu): 512 blocks of 256
// threads; thread g of the grid sums elements g, g + 512*256, ... in double.
constexpr int64_t kBlocks = 512;
constexpr int64_t kThreads = 256;
constexpr int64_t kWarp = 32;
constexpr int64_t kLanes = kBlocks * kThreads;

// Lane 0 of a warp after the xor butterfly v[l] += v[l ^ o], o = 16, 8, ..., 1:
// a halving tree, pairing l with l + o.
double WarpSum(const double* v) {
  double w[kWarp];
  std::copy(v, v + kWarp, w);
  for (int64_t o = kWarp / 2; o > 0; o /= 2) {
    for (int64_t l = 0; l < o; ++l) w[l] = w[l] + w[l + o];
  }
  return w[0];
}

// A block's threads: each warp's sum, then the warps in order from 0.0.
double BlockSum(const double* v) {
  double total = 0.0;
  for (int64_t w = 0; w < kThreads / kWarp; ++w) total += WarpSum(v + w * kWarp);
  return total;
}

}  // namespace

double SumOfSquares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  // Threads past n (and blocks past them) hold +0.0, which adds nothing.
  const int64_t active = std::min(n, kLanes);
  const int64_t blocks = (active + kThreads - 1) / kThreads;
  std::vector<double> lane(size_t(blocks * kThreads), 0.0);
  // Each lane adds its elements in increasing order; a square of a float is
  // exact in double, so a fused multiply-add rounds the same.
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    double* acc = lane.data() + b * kThreads;
    const int64_t first = b * kThreads;
    for (int64_t base = 0; base + first < n; base += kLanes) {
      const int64_t count = std::min(kThreads, n - base - first);
      const float* row = x + base + first;
      for (int64_t t = 0; t < count; ++t) acc[t] += double(row[t]) * double(row[t]);
    }
  }
  std::vector<double> partial(size_t(kBlocks), 0.0);
  for (int64_t b = 0; b < blocks; ++b) partial[size_t(b)] = BlockSum(lane.data() + b * kThreads);
  // One block sums the partials: thread t adds partials t, t + 256 from 0.0.
  std::vector<double> second(size_t(kThreads), 0.0);
  for (int64_t t = 0; t < kThreads; ++t) {
    for (int64_t i = t; i < kBlocks; i += kThreads) second[size_t(t)] += partial[size_t(i)];
  }
  return BlockSum(second.data());
}

bool AllFinite(const float* x, int64_t n) {
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
