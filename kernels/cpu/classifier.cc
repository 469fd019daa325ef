#include "kernels/classifier.h"

#include <cmath>

namespace pstar::kernels::cpu {

void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float maxv = x[0];
    for (int64_t j = 1; j < V; ++j) maxv = x[j] > maxv ? x[j] : maxv;
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(x[j] - maxv));
    double l = double(maxv) + std::log(sum);
    lse[n] = float(l);
    losses[n] = float(l - double(x[targets[n]]));
  }
}

void CrossEntropyBackwardInPlace(float* logits, const float* lse, const int32_t* targets,
                                 float dloss, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits + n * Vp;
    float l = lse[n];
    for (int64_t j = 0; j < V; ++j) x[j] = std::exp(x[j] - l) * dloss;
    for (int64_t j = V; j < Vp; ++j) x[j] = 0.0f;
    x[targets[n]] -= dloss;
  }
}

}  // namespace pstar::kernels::cpu
