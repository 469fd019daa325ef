#include "kernels/layernorm.h"

#include <cmath>

#include <type_traits>
#include <vector>

#include "kernels/cpu/column_sum.h"
#include "kernels/half.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
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

// Rows of inp (element I, read through `load`) normalized into out
// (element O, stored through `store`).
template <typename I, typename O, typename Load, typename Store>
void LayerNormRows(O* out, float* mean, float* rstd, const I* inp, const float* weight, const float* bias, int64_t N,
                   int64_t C, Load load, Store store) {
#pragma omp parallel
  {
    std::vector<float> row;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x;
      if constexpr (std::is_same_v<I, float>) {
        x = inp + n * C;
      } else {
        row.resize(size_t(C));
        for (int64_t c = 0; c < C; ++c) row[size_t(c)] = load(inp[n * C + c]);
        x = row.data();
      }
      NormalizeRow(out + n * C, mean + n, rstd + n, x, weight, bias, C, store);
    }
  }
}

// res = a + b stored through `store`, then the stored row (read back through
// `load`) normalized into out.
template <typename T, typename Load, typename Store>
void ResidualLayerNormRows(T* res, T* out, float* mean, float* rstd, const T* a, const float* b, const float* weight,
                           const float* bias, int64_t N, int64_t C, Load load, Store store) {
#pragma omp parallel
  {
    std::vector<float> row(std::is_same_v<T, float> ? 0 : size_t(C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* r = res + n * C;
      for (int64_t c = 0; c < C; ++c) r[c] = store(load(a[n * C + c]) + b[n * C + c]);
      const float* x;
      if constexpr (std::is_same_v<T, float>) {
        x = r;
      } else {
        for (int64_t c = 0; c < C; ++c) row[size_t(c)] = load(r[c]);
        x = row.data();
      }
      NormalizeRow(out + n * C, mean + n, rstd + n, x, weight, bias, C, store);
    }
  }
}

// The backward pass over inp of element I, read through `load`.
template <typename I, typename Load>
void LayerNormBackwardRows(float* dinp, float* dweight, float* dbias, const float* dout, const I* inp,
                           const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                           Load load) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* dy = dout + n * C;
    const I* x = inp + n * C;
    float m = mean[n], s = rstd[n];
    double sum_dn = 0.0, sum_dn_xhat = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (load(x[c]) - m) * s;
      float dn = weight[c] * dy[c];
      sum_dn += dn;
      sum_dn_xhat += double(dn) * xhat;
    }
    float mean_dn = float(sum_dn / double(C));
    float mean_dn_xhat = float(sum_dn_xhat / double(C));
    float* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (load(x[c]) - m) * s;
      float dn = weight[c] * dy[c];
      dx[c] += (dn - mean_dn - xhat * mean_dn_xhat) * s;
    }
  }
  AccumulateColumns(dbias, N, C, [&](int64_t n, int64_t c) { return dout[n * C + c]; });
  AccumulateColumns(dweight, N, C, [&](int64_t n, int64_t c) {
    return dout[n * C + c] * ((load(inp[n * C + c]) - mean[n]) * rstd[n]);
  });
}

}  // namespace

void ResidualLayerNormForward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                              const float* weight, const float* bias, int64_t N, int64_t C) {
  ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, KeepFloat{}, KeepFloat{});
}

void ResidualLayerNormForward(uint16_t* res, uint16_t* out, float* mean, float* rstd, const uint16_t* a,
                              const float* b, bool bf16, const float* weight, const float* bias, int64_t N, int64_t C) {
  if (bf16) {
    return ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, WidenBf16{}, NarrowBf16{});
  }
  ResidualLayerNormRows(res, out, mean, rstd, a, b, weight, bias, N, C, WidenHalf{}, NarrowHalf{});
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, KeepFloat{}, KeepFloat{});
}

void LayerNormForward(uint16_t* out, float* mean, float* rstd, const uint16_t* inp, bool bf16, const float* weight,
                      const float* bias, int64_t N, int64_t C) {
  if (bf16) return LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, WidenBf16{}, NarrowBf16{});
  LayerNormRows(out, mean, rstd, inp, weight, bias, N, C, WidenHalf{}, NarrowHalf{});
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  LayerNormBackwardRows(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, KeepFloat{});
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp, bool bf16,
                       const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (bf16) return LayerNormBackwardRows(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, WidenBf16{});
  LayerNormBackwardRows(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, WidenHalf{});
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
