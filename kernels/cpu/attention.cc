#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"
#include "kernels/matmul.h"

namespace pstar::kernels::cpu {

namespace {

constexpr int64_t kBlock = kAttentionBlock;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t NumBlocks(int64_t T) { return (T + kBlock - 1) / kBlock; }

// S (rows, cols) = scale Q K^T for query rows [r0, r0 + rows) and key rows
// [c0, c0 + cols) of one head; on the diagonal block the keys after each
// query are -inf.
void Scores(float* s, const float* q, const float* k, int64_t ld, int64_t r0, int64_t rows, int64_t c0,
            int64_t cols, int64_t hs, float scale) {
  Gemm(false, true, rows, cols, hs, scale, q + r0 * ld, ld, k + c0 * ld, ld, 0.0f, s, cols);
  if (r0 == c0) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = r + 1; c < cols; ++c) s[r * cols + c] = kNegInf;
    }
  }
}

float Keep(float x) { return x; }

// out of element O, written through `store` (float to O).
template <typename O, typename Store>
void Forward(O* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH, Store store) {
  const int64_t hs = C / NH;
  const int64_t C3 = 3 * C;
  const int64_t nb = NumBlocks(T);
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(kBlock * kBlock)), acc(static_cast<size_t>(kBlock * hs));
    std::vector<float> m(static_cast<size_t>(kBlock)), l(static_cast<size_t>(kBlock));
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t i = 0; i < nb; ++i) {
          const float* q = qkv + b * T * C3 + h * hs;
          const float* k = q + C;
          const float* v = q + 2 * C;
          const int64_t r0 = i * kBlock, rows = std::min(kBlock, T - r0);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t c0 = j * kBlock, cols = std::min(kBlock, T - c0);
            Scores(s.data(), q, k, C3, r0, rows, c0, cols, hs, scale);
            // Online softmax: rescale what the earlier blocks summed to the new row maximum.
            for (int64_t r = 0; r < rows; ++r) {
              float* row = s.data() + r * cols;
              float mx = m[size_t(r)];
              for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, row[c]);
              const float alpha = VecExp(m[size_t(r)] - mx);
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) row[c] = VecExp(row[c] - mx);
              float sum = 0.0f;  // in order: a vectorized sum's bits would depend on alignment
              for (int64_t c = 0; c < cols; ++c) sum += row[c];
              l[size_t(r)] = l[size_t(r)] * alpha + sum;
              m[size_t(r)] = mx;
              float* a = acc.data() + r * hs;
              for (int64_t d = 0; d < hs; ++d) a[d] *= alpha;
            }
            Gemm(false, false, rows, hs, cols, 1.0f, s.data(), cols, v + c0 * C3, C3, 1.0f, acc.data(), hs);
          }
          for (int64_t r = 0; r < rows; ++r) {
            const float inv = 1.0f / l[size_t(r)];
            O* o = out + (b * T + r0 + r) * C + h * hs;
            const float* a = acc.data() + r * hs;
            for (int64_t d = 0; d < hs; ++d) o[d] = store(a[d] * inv);
            lse[(b * NH + h) * T + r0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
          }
        }
      }
    }
  }
}

// out of element O, read through `load` (O to float).
template <typename O, typename Load>
void Backward(float* dqkv, const float* dout, const float* qkv, const O* out, const float* lse, int64_t B,
              int64_t T, int64_t C, int64_t NH, Load load) {
  const int64_t hs = C / NH;
  const int64_t C3 = 3 * C;
  const int64_t nb = NumBlocks(T);
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(kBlock * kBlock)), ds(static_cast<size_t>(kBlock * kBlock));
    std::vector<float> dsum(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        const float* q = qkv + b * T * C3 + h * hs;
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* dq = dqkv + b * T * C3 + h * hs;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* dy = dout + b * T * C + h * hs;
        const O* y = out + b * T * C + h * hs;
        const float* row_lse = lse + (b * NH + h) * T;
        // D = rowsum(dY * Y): the softmax backward's sum_j P_j dP_j per query.
        for (int64_t t = 0; t < T; ++t) {
          float d = 0.0f;
          for (int64_t e = 0; e < hs; ++e) d += dy[t * C + e] * load(y[t * C + e]);
          dsum[size_t(t)] = d;
          for (float* g : {dq, dk, dv}) std::fill_n(g + t * C3, hs, 0.0f);
        }
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t c0 = j * kBlock, cols = std::min(kBlock, T - c0);
          for (int64_t i = j; i < nb; ++i) {
            const int64_t r0 = i * kBlock, rows = std::min(kBlock, T - r0);
            Scores(p.data(), q, k, C3, r0, rows, c0, cols, hs, scale);
            for (int64_t r = 0; r < rows; ++r) {
              const float row_lse_r = row_lse[r0 + r];
              float* prow = p.data() + r * cols;
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) prow[c] = VecExp(prow[c] - row_lse_r);
            }
            // dP = dY_i V_j^T, then dS = P (dP - D) scale in place.
            Gemm(false, true, rows, cols, hs, 1.0f, dy + r0 * C, C, v + c0 * C3, C3, 0.0f, ds.data(), cols);
            for (int64_t r = 0; r < rows; ++r) {
              const float d = dsum[size_t(r0 + r)];
              for (int64_t c = 0; c < cols; ++c) {
                const size_t e = size_t(r * cols + c);
                ds[e] = p[e] * (ds[e] - d) * scale;
              }
            }
            Gemm(true, false, cols, hs, rows, 1.0f, p.data(), cols, dy + r0 * C, C, 1.0f, dv + c0 * C3, C3);
            Gemm(true, false, cols, hs, rows, 1.0f, ds.data(), cols, q + r0 * C3, C3, 1.0f, dk + c0 * C3, C3);
            Gemm(false, false, rows, hs, cols, 1.0f, ds.data(), cols, k + c0 * C3, C3, 1.0f, dq + r0 * C3, C3);
          }
        }
      }
    }
  }
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  Forward(out, lse, qkv, B, T, C, NH, Keep);
}

void AttentionForward(uint16_t* out, bool bf16, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  if (bf16) return Forward(out, lse, qkv, B, T, C, NH, FloatToBFloat16);
  Forward(out, lse, qkv, B, T, C, NH, FloatToHalf);
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  Backward(dqkv, dout, qkv, out, lse, B, T, C, NH, Keep);
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const uint16_t* out, bool bf16,
                       const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (bf16) return Backward(dqkv, dout, qkv, out, lse, B, T, C, NH, BFloat16ToFloat);
  Backward(dqkv, dout, qkv, out, lse, B, T, C, NH, HalfToFloat);
}

}  // namespace pstar::kernels::cpu
