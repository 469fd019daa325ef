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

#include "kernels/half.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace pstar::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double MaxRelative(const std::vector<float>& a, const std::vector<double>& b) {
  double maxb = 1e-12, maxd = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    maxb = std::max(maxb, std::abs(b[i]));
    maxd = std::max(maxd, std::abs(double(a[i]) - b[i]));
  }
  return maxd / maxb;
}

// d(sum(weights * f(x)))/dx by central differences.
std::vector<double> NumericGrad(std::vector<float>& x, const std::vector<float>& weights,
                                const std::function<std::vector<float>()>& f, float h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    auto up = f();
    x[i] = keep - h;
    auto down = f();
    x[i] = keep;
    double s = 0;
    for (size_t j = 0; j < up.size(); ++j) s += double(weights[j]) * (double(up[j]) - double(down[j]));
    g[i] = s / (2.0 * h);
  }
  return g;
}

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

}  // namespace
}  // namespace pstar::kernels::cpu
