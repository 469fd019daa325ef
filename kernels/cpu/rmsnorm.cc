#include "kernels/rmsnorm.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/column_sum.h"
#include "kernels/cpu/isa_target.h"
#include "kernels/half.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// One row: its mean square in double, the scaled row in float, stored
// through `store` (float to O: itself, or narrowed to 16 bits).
template <typename O, typename Store>
inline void NormalizeRow(O* o, float* rstd, const float* x, const float* weight, float eps, int64_t C, Store store) {
  double squares = 0.0;
  for (int64_t c = 0; c < C; ++c) squares += double(x[c]) * double(x[c]);
  const float s = float(1.0 / std::sqrt(squares / double(C) + double(eps)));
  for (int64_t c = 0; c < C; ++c) o[c] = store(weight[c] * (x[c] * s));
  *rstd = s;
}

template <typename I, typename O, typename Load, typename Store>
void RmsNormRows(O* out, float* rstd, const I* inp, const float* weight, float eps, int64_t N, int64_t C, Load load,
                 Store store) {
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
      NormalizeRow(out + n * C, rstd + n, x, weight, eps, C, store);
    }
  }
}

// res = a + b stored through `store`, then the stored row (read back through
// `load`) normalized into out.
template <typename T, typename Load, typename Store>
void ResidualRmsNormRows(T* res, T* out, float* rstd, const T* a, const float* b, const float* weight, float eps,
                         int64_t N, int64_t C, Load load, Store store) {
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
      NormalizeRow(out + n * C, rstd + n, x, weight, eps, C, store);
    }
  }
}

// y = w * x * s with s = (mean(x^2) + eps)^-1/2, so with xhat = x * s and
// dn = w * dy: dx = s * (dn - xhat * mean(dn * xhat)), dw = sum over rows of
// dy * xhat.
template <typename I, typename Load>
void RmsNormBackwardRows(float* dinp, float* dweight, const float* dout, const I* inp, const float* weight,
                         const float* rstd, int64_t N, int64_t C, Load load) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* dy = dout + n * C;
    const I* x = inp + n * C;
    const float s = rstd[n];
    double sum_dn_xhat = 0.0;
    for (int64_t c = 0; c < C; ++c) sum_dn_xhat += double(weight[c] * dy[c]) * double(load(x[c]) * s);
    const float mean_dn_xhat = float(sum_dn_xhat / double(C));
    float* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = load(x[c]) * s;
      dx[c] += (weight[c] * dy[c] - xhat * mean_dn_xhat) * s;
    }
  }
  AccumulateColumns(dweight, N, C,
                    [&](int64_t n, int64_t c) { return dout[n * C + c] * (load(inp[n * C + c]) * rstd[n]); });
}

}  // namespace

void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, float eps, int64_t N, int64_t C) {
  RmsNormRows(out, rstd, inp, weight, eps, N, C, KeepFloat{}, KeepFloat{});
}

void ResidualRmsNormForward(float* res, float* out, float* rstd, const float* a, const float* b, const float* weight,
                            float eps, int64_t N, int64_t C) {
  ResidualRmsNormRows(res, out, rstd, a, b, weight, eps, N, C, KeepFloat{}, KeepFloat{});
}

void RmsNormForward(uint16_t* out, float* rstd, const uint16_t* inp, bool bf16, const float* weight, float eps,
                    int64_t N, int64_t C) {
  if (bf16) return RmsNormRows(out, rstd, inp, weight, eps, N, C, WidenBf16{}, NarrowBf16{});
  RmsNormRows(out, rstd, inp, weight, eps, N, C, WidenHalf{}, NarrowHalf{});
}

void ResidualRmsNormForward(uint16_t* res, uint16_t* out, float* rstd, const uint16_t* a, const float* b, bool bf16,
                            const float* weight, float eps, int64_t N, int64_t C) {
  if (bf16) return ResidualRmsNormRows(res, out, rstd, a, b, weight, eps, N, C, WidenBf16{}, NarrowBf16{});
  ResidualRmsNormRows(res, out, rstd, a, b, weight, eps, N, C, WidenHalf{}, NarrowHalf{});
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     const float* rstd, int64_t N, int64_t C) {
  RmsNormBackwardRows(dinp, dweight, dout, inp, weight, rstd, N, C, KeepFloat{});
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const uint16_t* inp, bool bf16,
                     const float* weight, const float* rstd, int64_t N, int64_t C) {
  if (bf16) return RmsNormBackwardRows(dinp, dweight, dout, inp, weight, rstd, N, C, WidenBf16{});
  RmsNormBackwardRows(dinp, dweight, dout, inp, weight, rstd, N, C, WidenHalf{});
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
