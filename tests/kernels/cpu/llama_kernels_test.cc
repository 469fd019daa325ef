// The Llama family's CPU kernels (RMSNorm, RoPE, SwiGLU) against plain
// double-precision references and, for backward passes, central finite
// differences of their own forward.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/half.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/kernels/cpu/kernel_checks.h"

namespace pstar::kernels::cpu {
namespace {

using checks::MaxRelative;
using checks::NumericGrad;
using checks::Random;

std::vector<uint16_t> Narrow(const std::vector<float>& v, bool bf16) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16 ? FloatToBFloat16(v[i]) : FloatToHalf(v[i]);
  return out;
}

std::vector<float> Widen(const std::vector<uint16_t>& v, bool bf16) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16 ? BFloat16ToFloat(v[i]) : HalfToFloat(v[i]);
  return out;
}

TEST(RmsNorm, ForwardMatchesTheFormulaAndBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(11);
  const int64_t N = 5, C = 12;
  const float eps = 1e-6f;
  auto x = Random(N * C, rng), weight = Random(C, rng), w = Random(N * C, rng);
  std::vector<float> out(N * C), rstd(N);
  RmsNormForward(out.data(), rstd.data(), x.data(), weight.data(), eps, N, C);
  std::vector<double> want(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    EXPECT_NEAR(rstd[n], r, 1e-6 * r);
    for (int64_t c = 0; c < C; ++c) want[n * C + c] = double(weight[c]) * x[n * C + c] * r;
  }
  EXPECT_LT(MaxRelative(out, want), 1e-6);
  auto f = [&] {
    std::vector<float> o(N * C), r(N);
    RmsNormForward(o.data(), r.data(), x.data(), weight.data(), eps, N, C);
    return o;
  };
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  RmsNormBackward(dx.data(), dw.data(), w.data(), x.data(), weight.data(), rstd.data(), N, C);
  EXPECT_LT(MaxRelative(dx, NumericGrad(x, w, f, 1e-2f)), 5e-3);
  EXPECT_LT(MaxRelative(dw, NumericGrad(weight, w, f, 1e-2f)), 5e-3);
  // Accumulating: a second call adds the same again.
  std::vector<float> dx2 = dx, dw2 = dw;
  RmsNormBackward(dx2.data(), dw2.data(), w.data(), x.data(), weight.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
}

TEST(RmsNorm, ResidualFusedForwardIsTheTwoKernelsBitForBit) {
  std::mt19937 rng(12);
  const int64_t N = 7, C = 33;
  auto a = Random(N * C, rng), b = Random(N * C, rng), weight = Random(C, rng);
  std::vector<float> res(N * C), out(N * C), rstd(N);
  ResidualRmsNormForward(res.data(), out.data(), rstd.data(), a.data(), b.data(), weight.data(), 1e-5f, N, C);
  std::vector<float> sum(N * C), out2(N * C), rstd2(N);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
  RmsNormForward(out2.data(), rstd2.data(), sum.data(), weight.data(), 1e-5f, N, C);
  EXPECT_EQ(res, sum);
  EXPECT_EQ(out, out2);
  EXPECT_EQ(rstd, rstd2);
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    const std::vector<uint16_t> a16 = Narrow(a, bf16);
    std::vector<uint16_t> res16(N * C), out16(N * C);
    ResidualRmsNormForward(res16.data(), out16.data(), rstd.data(), a16.data(), b.data(), bf16, weight.data(), 1e-5f,
                           N, C);
    // The 16-bit form: the sum rounded once, then the fp32 kernel over it, rounded.
    const std::vector<float> a_wide = Widen(a16, bf16);
    std::vector<float> rounded(N * C);
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = a_wide[i] + b[i];
    const std::vector<uint16_t> want_res = Narrow(rounded, bf16);
    EXPECT_EQ(res16, want_res);
    RmsNormForward(out2.data(), rstd2.data(), Widen(want_res, bf16).data(), weight.data(), 1e-5f, N, C);
    EXPECT_EQ(out16, Narrow(out2, bf16));
    std::vector<uint16_t> out_plain(N * C);
    RmsNormForward(out_plain.data(), rstd2.data(), res16.data(), bf16, weight.data(), 1e-5f, N, C);
    EXPECT_EQ(out_plain, out16);
  }
}

TEST(RmsNorm, TheWeightGradientHasTheSameBitsAtAnyThreadCount) {
  std::mt19937 rng(13);
  const int64_t N = 64, C = 40;
  auto x = Random(N * C, rng), weight = Random(C, rng), dy = Random(N * C, rng);
  std::vector<float> out(N * C), rstd(N);
  RmsNormForward(out.data(), rstd.data(), x.data(), weight.data(), 1e-5f, N, C);
  std::vector<std::vector<float>> dws;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
    RmsNormBackward(dx.data(), dw.data(), dy.data(), x.data(), weight.data(), rstd.data(), N, C);
    dws.push_back(dw);
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(dws[0], dws[1]);
  EXPECT_EQ(dws[0], dws[2]);
  // Over a 16-bit input: the fp32 kernel's bits over the widened input.
  const std::vector<uint16_t> x16 = Narrow(x, true);
  std::vector<float> dx16(N * C, 0.0f), dw16(C, 0.0f), dx(N * C, 0.0f), dw(C, 0.0f);
  RmsNormBackward(dx16.data(), dw16.data(), dy.data(), x16.data(), true, weight.data(), rstd.data(), N, C);
  RmsNormBackward(dx.data(), dw.data(), dy.data(), Widen(x16, true).data(), weight.data(), rstd.data(), N, C);
  EXPECT_EQ(dx16, dx);
  EXPECT_EQ(dw16, dw);
}

TEST(Rope, TheTablesAreTheAnglesAndLlama3ScalesOnlyTheLongWavelengths) {
  const int64_t P = 40, D = 16;
  const double theta = 500000.0;
  std::vector<float> cos(P * D / 2), sin(P * D / 2);
  RopeTables(cos.data(), sin.data(), P, D, theta, RopeScaling{});
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = double(p) / std::pow(theta, 2.0 * double(i) / double(D));
      EXPECT_EQ(cos[p * D / 2 + i], float(std::cos(angle)));
      EXPECT_EQ(sin[p * D / 2 + i], float(std::sin(angle)));
    }
  }
  RopeScaling llama3;
  llama3.llama3 = true;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position_embeddings = 64;  // small, so that every band holds some frequency
  std::vector<float> scos(P * D / 2), ssin(P * D / 2);
  RopeTables(scos.data(), ssin.data(), P, D, theta, llama3);
  int kept = 0, divided = 0, blended = 0;
  const int64_t p = 1;  // at position 1 the angle is the frequency itself
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = 1.0 / std::pow(theta, 2.0 * double(i) / double(D));
    const double wavelength = 2.0 * std::numbers::pi / f;
    const double got = std::atan2(double(ssin[p * D / 2 + i]), double(scos[p * D / 2 + i]));
    if (wavelength < 64.0 / 4.0) {
      EXPECT_NEAR(got, f, 1e-6) << i;
      ++kept;
    } else if (wavelength > 64.0 / 1.0) {
      EXPECT_NEAR(got, f / 8.0, 1e-7) << i;
      ++divided;
    } else {
      EXPECT_LT(got, f) << i;
      EXPECT_GT(got, f / 8.0) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, RotatesEachHeadByItsTokensPositionInsideAQkvRow) {
  std::mt19937 rng(14);
  const int64_t N = 6, H = 3, Hkv = 1, D = 8, P = 32;
  const int64_t stride = (H + 2 * Hkv) * D;
  std::vector<float> cos(P * D / 2), sin(P * D / 2);
  RopeTables(cos.data(), sin.data(), P, D, 10000.0, RopeScaling{});
  const std::vector<int32_t> positions = {0, 1, 2, 0, 5, 31};  // a packed row restarting at 0
  auto qkv = Random(N * stride, rng);
  std::vector<float> rotated = qkv;
  RopeForward(rotated.data(), stride, cos.data(), sin.data(), positions.data(), N, H, D);              // q
  RopeForward(rotated.data() + H * D, stride, cos.data(), sin.data(), positions.data(), N, Hkv, D);   // k
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H + Hkv; ++h) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = double(positions[size_t(n)]) / std::pow(10000.0, 2.0 * double(i) / double(D));
        const double a = qkv[n * stride + h * D + i], b = qkv[n * stride + h * D + i + D / 2];
        EXPECT_NEAR(rotated[n * stride + h * D + i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(rotated[n * stride + h * D + i + D / 2], b * std::cos(angle) + a * std::sin(angle), 1e-5);
      }
    }
    for (int64_t j = (H + Hkv) * D; j < stride; ++j) EXPECT_EQ(rotated[n * stride + j], qkv[n * stride + j]) << "v";
    if (positions[size_t(n)] == 0) {
      for (int64_t j = 0; j < stride; ++j) EXPECT_EQ(rotated[n * stride + j], qkv[n * stride + j]) << "position 0";
    }
  }
  // 16 bits: the fp32 rotation of the widened values, rounded once.
  for (bool bf16 : {true, false}) {
    std::vector<uint16_t> q16 = Narrow(qkv, bf16);
    std::vector<float> wide = Widen(q16, bf16);
    RopeForward(q16.data(), bf16, stride, cos.data(), sin.data(), positions.data(), N, H, D);
    RopeForward(wide.data(), stride, cos.data(), sin.data(), positions.data(), N, H, D);
    EXPECT_EQ(q16, Narrow(wide, bf16)) << (bf16 ? "bf16" : "fp16");
  }
}

TEST(Rope, TheBackwardIsTheRotationsTranspose) {
  std::mt19937 rng(15);
  const int64_t N = 5, H = 2, D = 16, P = 64;
  std::vector<float> cos(P * D / 2), sin(P * D / 2);
  RopeScaling llama3;
  llama3.llama3 = true;
  RopeTables(cos.data(), sin.data(), P, D, 500000.0, llama3);
  const std::vector<int32_t> positions = {3, 17, 0, 63, 40};
  auto x = Random(N * H * D, rng), y = Random(N * H * D, rng);
  // <R x, y> = <x, R^T y>.
  std::vector<float> rx = x, rty = y;
  RopeForward(rx.data(), H * D, cos.data(), sin.data(), positions.data(), N, H, D);
  RopeBackward(rty.data(), H * D, cos.data(), sin.data(), positions.data(), N, H, D);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += double(rx[i]) * y[i];
    rhs += double(x[i]) * rty[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::abs(lhs) + 1e-5);
  // And a rotation: the transpose undoes it.
  RopeBackward(rx.data(), H * D, cos.data(), sin.data(), positions.data(), N, H, D);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(rx[i], x[i], 1e-5) << i;
}

TEST(SwiGlu, ForwardMatchesTheFormulaAndBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(16);
  const int64_t N = 4, F = 9;
  auto gu = Random(N * 2 * F, rng, 2.0f), w = Random(N * F, rng);
  std::vector<float> out(N * F);
  SwiGluForward(out.data(), gu.data(), N, F);
  std::vector<double> want(N * F);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < F; ++f) {
      const double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      want[n * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  EXPECT_LT(MaxRelative(out, want), 1e-6);
  auto fwd = [&] {
    std::vector<float> o(N * F);
    SwiGluForward(o.data(), gu.data(), N, F);
    return o;
  };
  std::vector<float> dgu(N * 2 * F, 123.0f);  // overwritten
  SwiGluBackward(dgu.data(), gu.data(), w.data(), N, F);
  EXPECT_LT(MaxRelative(dgu, NumericGrad(gu, w, fwd, 1e-2f)), 5e-3);
  for (bool bf16 : {true, false}) {
    const std::vector<uint16_t> gu16 = Narrow(gu, bf16);
    const std::vector<float> wide = Widen(gu16, bf16);
    std::vector<uint16_t> out16(N * F);
    std::vector<float> out_wide(N * F);
    SwiGluForward(out16.data(), gu16.data(), bf16, N, F);
    SwiGluForward(out_wide.data(), wide.data(), N, F);
    EXPECT_EQ(out16, Narrow(out_wide, bf16));
    std::vector<float> d16(N * 2 * F), dwide(N * 2 * F);
    SwiGluBackward(d16.data(), gu16.data(), bf16, w.data(), N, F);
    SwiGluBackward(dwide.data(), wide.data(), w.data(), N, F);
    EXPECT_EQ(d16, dwide);
  }
}

// Causal attention in double, query head h reading kv head h / (NH / NKV).
std::vector<double> NaiveAttention(const std::vector<float>& qkv, const AttentionShape& s) {
  const int64_t ld = s.RowElements(), group = s.NH / s.NKV;
  std::vector<double> out(size_t(s.B * s.T * s.NH * s.hs));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t kv = h / group;
      for (int64_t t = 0; t < s.T; ++t) {
        const float* q = &qkv[size_t((b * s.T + t) * ld + h * s.hs)];
        std::vector<double> w(size_t(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = &qkv[size_t((b * s.T + u) * ld + (s.NH + kv) * s.hs)];
          double dot = 0;
          for (int64_t d = 0; d < s.hs; ++d) dot += double(q[d]) * k[d];
          w[size_t(u)] = dot / std::sqrt(double(s.hs));
          mx = std::max(mx, w[size_t(u)]);
        }
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < s.hs; ++d) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u) {
            o += w[size_t(u)] / sum * qkv[size_t((b * s.T + u) * ld + (s.NH + s.NKV + kv) * s.hs + d)];
          }
          out[size_t((b * s.T + t) * s.NH * s.hs + h * s.hs + d)] = o;
        }
      }
    }
  }
  return out;
}

TEST(GroupedQueryAttention, ForwardMatchesTheNaiveAttentionForEveryGroupSize) {
  std::mt19937 rng(17);
  for (int64_t group : {1, 2, 3, 4, 7, 8}) {
    for (int64_t hs : {8, 32}) {
      const AttentionShape s{2, 71, group * 2, 2, hs};  // T past one block of 64
      SCOPED_TRACE(testing::Message() << "group " << group << " hs " << hs);
      auto qkv = Random(size_t(s.B * s.T * s.RowElements()), rng);
      std::vector<float> out(size_t(s.B * s.T * s.NH * s.hs)), lse(size_t(s.B * s.NH * s.T));
      AttentionForward(out.data(), lse.data(), qkv.data(), s);
      EXPECT_LT(MaxRelative(out, NaiveAttention(qkv, s)), 1e-5);
    }
  }
}

// GQA is multi-head attention over the kv heads repeated for their query
// heads: the same forward bits, the same dq bits, and dk and dv the sums
// over each group.
TEST(GroupedQueryAttention, IsMultiHeadAttentionOverRepeatedKvHeads) {
  std::mt19937 rng(18);
  const AttentionShape g{2, 70, 6, 2, 16};
  const AttentionShape m{2, 70, 6, 6, 16};
  const int64_t group = g.NH / g.NKV;
  auto qkv = Random(size_t(g.B * g.T * g.RowElements()), rng);
  std::vector<float> wide(size_t(m.B * m.T * m.RowElements()));
  for (int64_t r = 0; r < g.B * g.T; ++r) {
    const float* src = &qkv[size_t(r * g.RowElements())];
    float* dst = &wide[size_t(r * m.RowElements())];
    std::copy(src, src + g.NH * g.hs, dst);
    for (int64_t h = 0; h < m.NH; ++h) {
      const int64_t kv = h / group;
      std::copy(src + (g.NH + kv) * g.hs, src + (g.NH + kv + 1) * g.hs, dst + (m.NH + h) * m.hs);
      std::copy(src + (g.NH + g.NKV + kv) * g.hs, src + (g.NH + g.NKV + kv + 1) * g.hs, dst + (2 * m.NH + h) * m.hs);
    }
  }
  const size_t n_out = size_t(g.B * g.T * g.NH * g.hs);
  std::vector<float> out_g(n_out), out_m(n_out), lse_g(size_t(g.B * g.NH * g.T)), lse_m(lse_g.size());
  AttentionForward(out_g.data(), lse_g.data(), qkv.data(), g);
  AttentionForward(out_m.data(), lse_m.data(), wide.data(), m);
  EXPECT_EQ(out_g, out_m);
  EXPECT_EQ(lse_g, lse_m);
  auto dout = Random(n_out, rng);
  std::vector<float> dg(qkv.size(), 7.0f), dm(wide.size(), 7.0f);  // overwritten
  AttentionBackward(dg.data(), dout.data(), qkv.data(), out_g.data(), lse_g.data(), g);
  AttentionBackward(dm.data(), dout.data(), wide.data(), out_m.data(), lse_m.data(), m);
  double worst = 0, scale = 1e-12;
  for (int64_t r = 0; r < g.B * g.T; ++r) {
    const float* a = &dg[size_t(r * g.RowElements())];
    const float* b = &dm[size_t(r * m.RowElements())];
    for (int64_t e = 0; e < g.NH * g.hs; ++e) EXPECT_EQ(a[e], b[e]) << "dq";
    for (int64_t part = 0; part < 2; ++part) {
      for (int64_t kv = 0; kv < g.NKV; ++kv) {
        for (int64_t d = 0; d < g.hs; ++d) {
          double sum = 0;
          for (int64_t h = kv * group; h < (kv + 1) * group; ++h) sum += b[(m.NH + part * m.NH + h) * m.hs + d];
          const double got = a[(g.NH + part * g.NKV + kv) * g.hs + d];
          worst = std::max(worst, std::abs(got - sum));
          scale = std::max(scale, std::abs(sum));
        }
      }
    }
  }
  EXPECT_LT(worst / scale, 1e-5);
}

TEST(GroupedQueryAttention, BackwardMatchesFiniteDifferencesAtAnyThreadCount) {
  std::mt19937 rng(19);
  const AttentionShape s{1, 6, 4, 2, 4};
  auto qkv = Random(size_t(s.B * s.T * s.RowElements()), rng);
  const size_t n_out = size_t(s.B * s.T * s.NH * s.hs);
  auto w = Random(n_out, rng);
  auto f = [&] {
    std::vector<float> o(n_out), l(size_t(s.B * s.NH * s.T));
    AttentionForward(o.data(), l.data(), qkv.data(), s);
    return o;
  };
  std::vector<float> out(n_out), lse(size_t(s.B * s.NH * s.T));
  AttentionForward(out.data(), lse.data(), qkv.data(), s);
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> d(qkv.size());
    AttentionBackward(d.data(), w.data(), qkv.data(), out.data(), lse.data(), s);
    grads.push_back(d);
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  EXPECT_LT(MaxRelative(grads[0], NumericGrad(qkv, w, f, 1e-2f)), 5e-3);
  // 16 bits: the fp32 kernels over the widened tensors.
  for (bool bf16 : {true, false}) {
    const std::vector<uint16_t> q16 = Narrow(qkv, bf16);
    const std::vector<float> wide = Widen(q16, bf16);
    std::vector<uint16_t> out16(n_out);
    std::vector<float> lse16(lse.size()), out_w(n_out), lse_w(lse.size());
    AttentionForward(out16.data(), lse16.data(), q16.data(), bf16, s);
    AttentionForward(out_w.data(), lse_w.data(), wide.data(), s);
    EXPECT_EQ(out16, Narrow(out_w, bf16));
    EXPECT_EQ(lse16, lse_w);
    std::vector<float> d16(qkv.size()), dw(qkv.size());
    AttentionBackward(d16.data(), w.data(), q16.data(), out16.data(), bf16, lse16.data(), s);
    AttentionBackward(dw.data(), w.data(), wide.data(), Widen(out16, bf16).data(), lse_w.data(), s);
    EXPECT_EQ(d16, dw);
  }
}

}  // namespace
}  // namespace pstar::kernels::cpu
