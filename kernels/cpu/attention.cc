#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/vector_math.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

constexpr int64_t kBlock = kAttentionBlock;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t NumBlocks(int64_t T) { return (T + kBlock - 1) / kBlock; }

// hs columns of consecutive rows of one head's q, k or v, as fp32, ld apart.
struct Rows {
  const float* p;
  int64_t ld;
};

// Rows [r0, r0 + rows) of x (one head's q, k or v; rows ld apart): fp32 ones
// as they are, 16-bit ones widened through `load` into buf (exact, so the
// products are those of the fp32 kernel over the widened tensor).
template <typename Q, typename Load>
Rows HeadRows(const Q* x, int64_t ld, int64_t r0, int64_t rows, int64_t hs, std::vector<float>& buf, Load load) {
  if constexpr (std::is_same_v<Q, float>) {
    return {x + r0 * ld, ld};
  } else {
    buf.resize(static_cast<size_t>(rows * hs));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < hs; ++d) buf[size_t(r * hs + d)] = load(x[(r0 + r) * ld + d]);
    }
    return {buf.data(), hs};
  }
}

// S (rows, cols) = scale Q K^T for a block of query rows and a block of key
// rows of one head; on a diagonal block the keys after each query are -inf.
// With `pos` (the row's positions) so are the keys before each query's
// example: query r0 + r sees keys from r0 + r - pos[r0 + r] on.
void Scores(float* s, Rows q, Rows k, int64_t rows, int64_t cols, int64_t hs, float scale, bool diagonal,
            const int32_t* pos = nullptr, int64_t r0 = 0, int64_t c0 = 0) {
  Gemm(false, true, rows, cols, hs, scale, q.p, q.ld, k.p, k.ld, 0.0f, s, cols);
  if (diagonal) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = r + 1; c < cols; ++c) s[r * cols + c] = kNegInf;
    }
  }
  if (pos != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t first = r0 + r - pos[r0 + r];
      for (int64_t c = 0; c < cols && c0 + c < first; ++c) s[r * cols + c] = kNegInf;
    }
  }
}

// The first key block any query of block i sees: its queries' examples'
// first positions, at least 0.
int64_t FirstKeyBlock(const int32_t* pos, int64_t r0, int64_t rows) {
  if (pos == nullptr) return 0;
  int64_t first = r0;
  for (int64_t r = 0; r < rows; ++r) first = std::min(first, r0 + r - int64_t(pos[r0 + r]));
  return std::max<int64_t>(first, 0) / kAttentionBlock;
}

// x[0..n) summed in fixed lanes (RowMax's scheme, kernels/cpu/vector_math.h).
float RowSum(const float* x, int64_t n) {
  float lane[kReduceLanes] = {};
  int64_t c = 0;
  for (; c + kReduceLanes <= n; c += kReduceLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kReduceLanes; ++l) lane[l] += x[c + l];
  }
  for (int64_t l = 0; c + l < n; ++l) lane[l] += x[c + l];
  for (int64_t w = kReduceLanes / 2; w > 0; w /= 2) {
    for (int64_t l = 0; l < w; ++l) lane[l] += lane[l + w];
  }
  return lane[0];
}

// Where one (batch, head)'s q, k and v start in a q|k|v row of `shape`.
struct Heads {
  int64_t q, k, v;  // column offsets
};
Heads HeadColumns(const AttentionShape& shape, int64_t h) {
  const int64_t kv = h / (shape.NH / shape.NKV);
  return {h * shape.hs, (shape.NH + kv) * shape.hs, (shape.NH + shape.NKV + kv) * shape.hs};
}

// qkv and out of element A (float, or a 16-bit format), read through `load`
// and written through `store`.
template <typename A, typename Load, typename Store>
void Forward(A* out, float* lse, const A* qkv, const AttentionShape& shape, Load load, Store store) {
  const int64_t B = shape.B, T = shape.T, NH = shape.NH, hs = shape.hs;
  const int64_t ld = shape.RowElements(), ldo = NH * hs;
  const int64_t nb = NumBlocks(T);
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(kBlock * kBlock)), acc(static_cast<size_t>(kBlock * hs));
    std::vector<float> m(static_cast<size_t>(kBlock)), l(static_cast<size_t>(kBlock));
    std::vector<float> qbuf, kbuf, vbuf;  // widened 16-bit rows
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t i = 0; i < nb; ++i) {
          const Heads at = HeadColumns(shape, h);
          const A* q = qkv + b * T * ld + at.q;
          const A* k = qkv + b * T * ld + at.k;
          const A* v = qkv + b * T * ld + at.v;
          const int64_t r0 = i * kBlock, rows = std::min(kBlock, T - r0);
          const Rows qi = HeadRows(q, ld, r0, rows, hs, qbuf, load);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          std::fill(acc.begin(), acc.end(), 0.0f);
          const int32_t* pos = shape.positions != nullptr ? shape.positions + b * T : nullptr;
          for (int64_t j = FirstKeyBlock(pos, r0, rows); j <= i; ++j) {
            const int64_t c0 = j * kBlock, cols = std::min(kBlock, T - c0);
            const Rows kj = HeadRows(k, ld, c0, cols, hs, kbuf, load);
            const Rows vj = HeadRows(v, ld, c0, cols, hs, vbuf, load);
            Scores(s.data(), qi, kj, rows, cols, hs, scale, i == j, pos, r0, c0);
            // Online softmax: rescale what the earlier blocks summed to the new row maximum.
            for (int64_t r = 0; r < rows; ++r) {
              float* row = s.data() + r * cols;
              const float mx = RowMax(row, cols, m[size_t(r)]);
              if (mx == kNegInf) {  // no key of this block in the query's example (yet): nothing to add
                std::fill_n(row, cols, 0.0f);
                continue;
              }
              const float alpha = VecExp(m[size_t(r)] - mx);
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) row[c] = VecExp(row[c] - mx);
              l[size_t(r)] = l[size_t(r)] * alpha + RowSum(row, cols);
              m[size_t(r)] = mx;
              float* a = acc.data() + r * hs;
              for (int64_t d = 0; d < hs; ++d) a[d] *= alpha;
            }
            Gemm(false, false, rows, hs, cols, 1.0f, s.data(), cols, vj.p, vj.ld, 1.0f, acc.data(), hs);
          }
          for (int64_t r = 0; r < rows; ++r) {
            const float inv = 1.0f / l[size_t(r)];
            A* o = out + (b * T + r0 + r) * ldo + h * hs;
            const float* a = acc.data() + r * hs;
            for (int64_t d = 0; d < hs; ++d) o[d] = store(a[d] * inv);
            lse[(b * NH + h) * T + r0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
          }
        }
      }
    }
  }
}

// qkv and out of element A, read through `load`; the gradients are fp32.
// One task per (batch, kv head) writes that head's dk and dv and its query
// heads' dq, those heads in order: one writer per gradient, so the bits do
// not depend on the thread count.
template <typename A, typename Load>
void Backward(float* dqkv, const float* dout, const A* qkv, const A* out, const float* lse,
              const AttentionShape& shape, Load load) {
  const int64_t B = shape.B, T = shape.T, NH = shape.NH, hs = shape.hs;
  const int64_t group = NH / shape.NKV;
  const int64_t ld = shape.RowElements(), ldo = NH * hs;
  const int64_t nb = NumBlocks(T);
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(kBlock * kBlock)), ds(static_cast<size_t>(kBlock * kBlock));
    std::vector<float> dsum(static_cast<size_t>(T));
    std::vector<float> qbuf, kbuf, vbuf;  // widened 16-bit rows
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < shape.NKV; ++g) {
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const Heads at = HeadColumns(shape, h);
          const A* q = qkv + b * T * ld + at.q;
          const A* k = qkv + b * T * ld + at.k;
          const A* v = qkv + b * T * ld + at.v;
          float* dq = dqkv + b * T * ld + at.q;
          float* dk = dqkv + b * T * ld + at.k;
          float* dv = dqkv + b * T * ld + at.v;
          const float* dy = dout + b * T * ldo + h * hs;
          const A* y = out + b * T * ldo + h * hs;
          const float* row_lse = lse + (b * NH + h) * T;
          const int32_t* pos = shape.positions != nullptr ? shape.positions + b * T : nullptr;
          // D = rowsum(dY * Y): the softmax backward's sum_j P_j dP_j per query.
          for (int64_t t = 0; t < T; ++t) {
            float d = 0.0f;
            for (int64_t e = 0; e < hs; ++e) d += dy[t * ldo + e] * load(y[t * ldo + e]);
            dsum[size_t(t)] = d;
            std::fill_n(dq + t * ld, hs, 0.0f);
            if (h == g * group) {
              std::fill_n(dk + t * ld, hs, 0.0f);
              std::fill_n(dv + t * ld, hs, 0.0f);
            }
          }
          for (int64_t j = 0; j < nb; ++j) {
            const int64_t c0 = j * kBlock, cols = std::min(kBlock, T - c0);
            const Rows kj = HeadRows(k, ld, c0, cols, hs, kbuf, load);
            const Rows vj = HeadRows(v, ld, c0, cols, hs, vbuf, load);
            for (int64_t i = j; i < nb; ++i) {
              const int64_t r0 = i * kBlock, rows = std::min(kBlock, T - r0);
              if (FirstKeyBlock(pos, r0, rows) > j) continue;  // no query of block i sees these keys
              const Rows qi = HeadRows(q, ld, r0, rows, hs, qbuf, load);
              Scores(p.data(), qi, kj, rows, cols, hs, scale, i == j, pos, r0, c0);
              for (int64_t r = 0; r < rows; ++r) {
                const float row_lse_r = row_lse[r0 + r];
                float* prow = p.data() + r * cols;
#pragma omp simd
                for (int64_t c = 0; c < cols; ++c) prow[c] = VecExp(prow[c] - row_lse_r);
              }
              // dP = dY_i V_j^T, then dS = P (dP - D) scale in place.
              Gemm(false, true, rows, cols, hs, 1.0f, dy + r0 * ldo, ldo, vj.p, vj.ld, 0.0f, ds.data(), cols);
              for (int64_t r = 0; r < rows; ++r) {
                const float d = dsum[size_t(r0 + r)];
                for (int64_t c = 0; c < cols; ++c) {
                  const size_t e = size_t(r * cols + c);
                  ds[e] = p[e] * (ds[e] - d) * scale;
                }
              }
              Gemm(true, false, cols, hs, rows, 1.0f, p.data(), cols, dy + r0 * ldo, ldo, 1.0f, dv + c0 * ld, ld);
              Gemm(true, false, cols, hs, rows, 1.0f, ds.data(), cols, qi.p, qi.ld, 1.0f, dk + c0 * ld, ld);
              Gemm(false, false, rows, hs, cols, 1.0f, ds.data(), cols, kj.p, kj.ld, 1.0f, dq + r0 * ld, ld);
            }
          }
        }
      }
    }
  }
}

AttentionShape MultiHead(int64_t B, int64_t T, int64_t C, int64_t NH) { return {B, T, NH, NH, C / NH}; }

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, const AttentionShape& shape) {
  Forward(out, lse, qkv, shape, KeepFloat{}, KeepFloat{});
}

void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, const AttentionShape& shape) {
  if (bf16) return Forward(out, lse, qkv, shape, WidenBf16{}, NarrowBf16{});
  Forward(out, lse, qkv, shape, WidenHalf{}, NarrowHalf{});
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       const AttentionShape& shape) {
  Backward(dqkv, dout, qkv, out, lse, shape, KeepFloat{});
}

void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, const AttentionShape& shape) {
  if (bf16) return Backward(dqkv, dout, qkv, out, lse, shape, WidenBf16{});
  Backward(dqkv, dout, qkv, out, lse, shape, WidenHalf{});
}

void AttentionForward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  AttentionForward(out, lse, qkv, MultiHead(B, T, C, NH));
}

void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, int64_t B, int64_t T, int64_t C,
                      int64_t NH) {
  AttentionForward(out, lse, qkv, bf16, MultiHead(B, T, C, NH));
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  AttentionBackward(dqkv, dout, qkv, out, lse, MultiHead(B, T, C, NH));
}

void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  AttentionBackward(dqkv, dout, qkv, out, bf16, lse, MultiHead(B, T, C, NH));
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
