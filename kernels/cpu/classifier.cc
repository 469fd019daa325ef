#include "kernels/classifier.h"

#include <cmath>

#include "kernels/cpu/vector_math.h"

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

}  // namespace

void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    const float maxv = RowMax(x, V, x[0]);
    const double l = double(maxv) + std::log(SumOfExps(x, V, maxv));
    lse[n] = float(l);
    losses[n] = float(l - double(x[targets[n]]));
  }
}

void CrossEntropyBackwardInPlace(float* logits, const float* lse, const int32_t* targets,
                                 float dloss, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits + n * Vp;
    const float l = lse[n];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) x[j] = VecExp(x[j] - l) * dloss;
    for (int64_t j = V; j < Vp; ++j) x[j] = 0.0f;
    x[targets[n]] -= dloss;
  }
}

}  // namespace pstar::kernels::cpu
