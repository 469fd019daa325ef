#include "kernels/classifier.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// sum_j exp(x[j] - max) over x[0..n), each exp in fp32 (VecExp, about 2 ulp),
// summed in double over fixed lanes combined in order (RowMax's scheme), so
// that it vectorizes and its bits depend on n alone; double keeps a 50k-term
// sum as exact as the exps.
double SumOfExps(const float* x, int64_t n, float max) {
  double lane[kReduceLanes] = {};
  int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kReduceLanes; ++l) lane[l] += double(VecExp(x[j + l] - max));
  }
  for (int64_t l = 0; j + l < n; ++l) lane[l] += double(VecExp(x[j + l] - max));
  double sum = 0.0;
  for (int64_t l = 0; l < kReduceLanes; ++l) sum += lane[l];
  return sum;
}

// One row: its loss (when asked) and, with `write`, its gradient in place.
// The log-sum-exp is kept in double until the loss; the gradient uses it
// rounded to fp32, as the GPU's kernel does.
float RowCrossEntropy(float* x, int32_t target, float dloss, bool write, int64_t V, int64_t Vp) {
  if (target < 0) {  // an ignored position: no loss, no gradient
    if (write) std::fill(x, x + Vp, 0.0f);
    return 0.0f;
  }
  const float maxv = RowMax(x, V, x[0]);
  const double l = double(maxv) + std::log(SumOfExps(x, V, maxv));
  const float loss = float(l - double(x[target]));
  if (write) {
    const float lse = float(l);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) x[j] = VecExp(x[j] - lse) * dloss;
    for (int64_t j = V; j < Vp; ++j) x[j] = 0.0f;
    x[target] -= dloss;
  }
  return loss;
}

}  // namespace

void CrossEntropy(float* losses, float* logits, const int32_t* targets, float dloss, bool write_dlogits, int64_t N,
                  int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float loss = RowCrossEntropy(logits + n * Vp, targets[n], dloss, write_dlogits, V, Vp);
    if (losses != nullptr) losses[n] = loss;
  }
}

void CrossEntropy(float* losses, uint16_t* logits, bool bf16, const int32_t* targets, float dloss,
                  bool write_dlogits, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(Vp));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      uint16_t* h = logits + n * Vp;
      for (int64_t j = 0; j < Vp; ++j) row[size_t(j)] = bf16 ? BFloat16ToFloat(h[j]) : HalfToFloat(h[j]);
      const float loss = RowCrossEntropy(row.data(), targets[n], dloss, write_dlogits, V, Vp);
      if (losses != nullptr) losses[n] = loss;
      if (write_dlogits) {
        for (int64_t j = 0; j < Vp; ++j) h[j] = bf16 ? FloatToBFloat16(row[size_t(j)]) : FloatToHalf(row[size_t(j)]);
      }
    }
  }
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
