#include "kernels/attention.h"

#include <cmath>

#include "kernels/matmul.h"

namespace pstar::kernels::cpu {

// Per (batch, head): S = scale Q K^T, P = causal softmax(S), Y = P V. Each head
// runs single-threaded BLAS inside the OpenMP loop over (batch, head).
void AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  const int64_t hs = C / NH;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* p = att + (b * NH + h) * T * T;
      Gemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, p, T);
      for (int64_t t = 0; t < T; ++t) {
        float* row = p + t * T;
        float maxv = row[0];
        for (int64_t j = 1; j <= t; ++j) maxv = row[j] > maxv ? row[j] : maxv;
        float sum = 0.0f;
        for (int64_t j = 0; j <= t; ++j) {
          row[j] = std::exp(row[j] - maxv);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
        for (int64_t j = t + 1; j < T; ++j) row[j] = 0.0f;
      }
      Gemm(false, false, T, hs, T, 1.0f, p, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
    }
  }
}

void AttentionBackward(float* dqkv, float* datt, const float* dout, const float* qkv,
                       const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* dy = dout + b * T * C + h * hs;
      const float* p = att + (b * NH + h) * T * T;
      float* ds = datt + (b * NH + h) * T * T;
      Gemm(false, true, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, ds, T);   // dP = dY V^T
      Gemm(true, false, T, hs, T, 1.0f, p, T, dy, C, 0.0f, dv, C3);   // dV = P^T dY
      for (int64_t t = 0; t < T; ++t) {
        const float* prow = p + t * T;
        float* row = ds + t * T;
        float dot = 0.0f;
        for (int64_t j = 0; j <= t; ++j) dot += prow[j] * row[j];
        for (int64_t j = 0; j <= t; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
        for (int64_t j = t + 1; j < T; ++j) row[j] = 0.0f;
      }
      Gemm(false, false, T, hs, T, 1.0f, ds, T, k, C3, 0.0f, dq, C3);  // dQ = dS K
      Gemm(true, false, T, hs, T, 1.0f, ds, T, q, C3, 0.0f, dk, C3);   // dK = dS^T Q
    }
  }
}

}  // namespace pstar::kernels::cpu
