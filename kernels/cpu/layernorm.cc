#include "kernels/layernorm.h"

#include <cmath>

#include "kernels/cpu/column_sum.h"
#include "kernels/half.h"

namespace pstar::kernels::cpu {

namespace {

// One row: statistics in double, the normalized row in float, stored through
// `store` (float to O: itself, or narrowed to 16 bits).
template <typename O, typename Store>
inline void NormalizeRow(O* o, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                         int64_t C, Store store) {
  double sum = 0.0;
  for (int64_t c = 0; c < C; ++c) sum += x[c];
  double m = sum / double(C);
  double var = 0.0;
  for (int64_t c = 0; c < C; ++c) {
    double d = x[c] - m;
    var += d * d;
  }
  float s = float(1.0 / std::sqrt(var / double(C) + double(kLayerNormEps)));
  float mf = float(m);
  for (int64_t c = 0; c < C; ++c) o[c] = store((x[c] - mf) * s * weight[c] + bias[c]);
  *mean = mf;
  *rstd = s;
}

template <typename O, typename Store>
void ResidualLayerNormRows(float* res, O* out, float* mean, float* rstd, const float* a, const float* b,
                           const float* weight, const float* bias, int64_t N, int64_t C, Store store) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* r = res + n * C;
    for (int64_t c = 0; c < C; ++c) r[c] = a[n * C + c] + b[n * C + c];
    NormalizeRow(out + n * C, mean + n, rstd + n, r, weight, bias, C, store);
  }
}

template <typename O, typename Store>
void LayerNormRows(O* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                   int64_t N, int64_t C, Store store) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) NormalizeRow(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C, store);
}

float Keep(float x) { return x; }

}  // namespace

void ResidualLayerNormForward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* weight, const float* bias, int64_t N, int64_t C) {
  ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, Keep);
}

void ResidualLayerNormForward(float* res, uint16_t* out, bool bf16, float* mean, float* rstd, const float* a,
                              const float* b, const float* weight, const float* bias, int64_t N, int64_t C) {
  if (bf16) return ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, FloatToBFloat16);
  ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, FloatToHalf);
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, Keep);
}

void LayerNormForward(uint16_t* out, bool bf16, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  if (bf16) return LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, FloatToBFloat16);
  LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, FloatToHalf);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* dy = dout + n * C;
    const float* x = inp + n * C;
    float m = mean[n], s = rstd[n];
    double sum_dn = 0.0, sum_dn_xhat = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      float dn = weight[c] * dy[c];
      sum_dn += dn;
      sum_dn_xhat += double(dn) * xhat;
    }
    float mean_dn = float(sum_dn / double(C));
    float mean_dn_xhat = float(sum_dn_xhat / double(C));
    float* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      float dn = weight[c] * dy[c];
      dx[c] += (dn - mean_dn - xhat * mean_dn_xhat) * s;
    }
  }
  AccumulateColumns(dbias, N, C, [&](int64_t n, int64_t c) { return dout[n * C + c]; });
  AccumulateColumns(dweight, N, C, [&](int64_t n, int64_t c) {
    return dout[n * C + c] * ((inp[n * C + c] - mean[n]) * rstd[n]);
  });
}

}  // namespace pstar::kernels::cpu
