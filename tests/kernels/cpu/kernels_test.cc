// Each CPU kernel against a plain double-precision reference or, for backward
// passes, against central finite differences of its own forward.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/adam.h"
#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/encoder.h"
#include "kernels/half.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/residual.h"
#include "tests/kernels/cpu/kernel_checks.h"

namespace pstar::kernels::cpu {
namespace {

using checks::MaxRelative;
using checks::NumericGrad;
using checks::Random;

TEST(Matmul, ForwardAndBackwardMatchNaive) {
  std::mt19937 rng(1);
  const int64_t N = 7, C = 13, OC = 5;
  auto x = Random(N * C, rng), w = Random(OC * C, rng), b = Random(OC, rng), dy = Random(N * OC, rng);
  std::vector<float> y(N * OC);
  MatmulForward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  std::vector<double> ry(N * OC), rdx(N * C, 0), rdw(OC * C, 0), rdb(OC, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b[o];
      for (int64_t c = 0; c < C; ++c) s += double(x[n * C + c]) * w[o * C + c];
      ry[n * OC + o] = s;
      rdb[o] += dy[n * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        rdx[n * C + c] += double(dy[n * OC + o]) * w[o * C + c];
        rdw[o * C + c] += double(dy[n * OC + o]) * x[n * C + c];
      }
    }
  EXPECT_LT(MaxRelative(y, ry), 1e-6);
  std::vector<float> dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  MatmulBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
  EXPECT_LT(MaxRelative(dx, rdx), 1e-6);
  EXPECT_LT(MaxRelative(dw, rdw), 1e-6);
  EXPECT_LT(MaxRelative(db, rdb), 1e-6);
}

// Gemm's bits do not depend on the thread count: its tiles are fixed by the
// shape, and each tile is one single-threaded BLAS call, so the result equals
// tile-by-tile BLAS calls made on one thread, at 1, 2 and 3 threads, for every
// transpose and leading dimensions wider than the matrices.
TEST(Matmul, GemmBitsAreThoseOfSingleThreadedTilesAtAnyThreadCount) {
  EXPECT_EQ(GemmTile(1, 1), 64);
  EXPECT_EQ(GemmTile(2048, 384), 256);
  EXPECT_EQ(GemmTile(100000, 100000), 512);
  std::mt19937 rng(12);
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& s : {Shape{300, 200, 70}, Shape{1000, 129, 33}, Shape{7, 900, 400}, Shape{64, 64, 1}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << s.M << "x" << s.N << "x" << s.K << " ta=" << ta << " tb=" << tb);
        const int64_t lda = (ta ? s.M : s.K) + 3, ldb = (tb ? s.K : s.N) + 5, ldc = s.N + 2;
        const auto a = Random((ta ? s.K : s.M) * lda, rng), b = Random((tb ? s.N : s.K) * ldb, rng);
        const auto c0 = Random(s.M * ldc, rng);
        // The reference: each tile by itself, one BLAS call on one thread
        // (Gemm inside a parallel region is exactly that).
        std::vector<float> want = c0;
        const int64_t tile = GemmTile(s.M, s.N);
#pragma omp parallel num_threads(2)
#pragma omp single
        for (int64_t i0 = 0; i0 < s.M; i0 += tile) {
          for (int64_t j0 = 0; j0 < s.N; j0 += tile) {
            const int64_t rows = std::min(tile, s.M - i0), cols = std::min(tile, s.N - j0);
            Gemm(ta, tb, rows, cols, s.K, 0.5f, ta ? a.data() + i0 : a.data() + i0 * lda, lda,
                 tb ? b.data() + j0 * ldb : b.data() + j0, ldb, 0.25f, want.data() + i0 * ldc + j0, ldc);
          }
        }
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> got = c0;
          Gemm(ta, tb, s.M, s.N, s.K, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, got.data(), ldc);
          EXPECT_EQ(got, want) << threads << " threads";
        }
        // And it is the product (to fp32 rounding), the padding untouched.
        std::vector<double> ref(size_t(s.M * ldc));
        for (int64_t i = 0; i < s.M; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            double sum = 0;
            for (int64_t k = 0; k < s.K && j < s.N; ++k) {
              sum += double(ta ? a[k * lda + i] : a[i * lda + k]) * double(tb ? b[j * ldb + k] : b[k * ldb + j]);
            }
            ref[size_t(i * ldc + j)] = j < s.N ? 0.5 * sum + 0.25 * c0[size_t(i * ldc + j)] : c0[size_t(i * ldc + j)];
          }
        }
        EXPECT_LT(MaxRelative(want, ref), 1e-5);
      }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST(Attention, ForwardMatchesNaive) {
  std::mt19937 rng(2);
  const int64_t B = 2, T = 5, C = 8, NH = 2, hs = C / NH;
  auto qkv = Random(B * T * 3 * C, rng);
  std::vector<float> out(B * T * C), lse(B * NH * T);
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  std::vector<double> ref(B * T * C, 0.0), ref_lse(B * NH * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hs; ++i)
            d += double(qkv[(b * T + t) * 3 * C + h * hs + i]) * qkv[(b * T + j) * 3 * C + C + h * hs + i];
          s[j] = d / std::sqrt(double(hs));
          mx = std::max(mx, s[j]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hs; ++i)
            ref[(b * T + t) * C + h * hs + i] += s[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + i];
        ref_lse[(b * NH + h) * T + t] = mx + std::log(sum);
      }
  EXPECT_LT(MaxRelative(out, ref), 1e-5);
  EXPECT_LT(MaxRelative(lse, ref_lse), 1e-5);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t B = 1, T = 4, C = 4, NH = 2;
  auto qkv = Random(B * T * 3 * C, rng);
  auto w = Random(B * T * C, rng);
  auto f = [&] {
    std::vector<float> out(B * T * C), lse(B * NH * T);
    AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    return out;
  };
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  EXPECT_LT(MaxRelative(dqkv, NumericGrad(qkv, w, f, 1e-2f)), 2e-3);
}

TEST(LayerNorm, ForwardNormalizesAndBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  const int64_t N = 3, C = 6;
  auto x = Random(N * C, rng), gamma = Random(C, rng), beta = Random(C, rng), w = Random(N * C, rng);
  std::vector<float> out(N * C), mean(N), rstd(N);
  std::vector<float> ones(C, 1.0f), zeros(C, 0.0f);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), N, C);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0, ss = 0;
    for (int64_t c = 0; c < C; ++c) {
      s += out[n * C + c];
      ss += double(out[n * C + c]) * out[n * C + c];
    }
    EXPECT_NEAR(s / C, 0.0, 1e-6);
    EXPECT_NEAR(ss / C, 1.0, 1e-4);
  }
  auto f = [&] {
    std::vector<float> o(N * C), m(N), r(N);
    LayerNormForward(o.data(), m.data(), r.data(), x.data(), gamma.data(), beta.data(), N, C);
    return o;
  };
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), N, C);
  std::vector<float> dx(N * C, 0.0f), dg(C, 0.0f), db(C, 0.0f);
  LayerNormBackward(dx.data(), dg.data(), db.data(), w.data(), x.data(), gamma.data(), mean.data(),
                    rstd.data(), N, C);
  EXPECT_LT(MaxRelative(dx, NumericGrad(x, w, f, 1e-2f)), 5e-3);
  EXPECT_LT(MaxRelative(dg, NumericGrad(gamma, w, f, 1e-2f)), 5e-3);
  EXPECT_LT(MaxRelative(db, NumericGrad(beta, w, f, 1e-2f)), 5e-3);
}

TEST(Gelu, MatchesFormulaAndDerivative) {
  std::mt19937 rng(5);
  auto x = Random(64, rng, 2.0f);
  std::vector<float> y(64), dx(64), ones(64, 1.0f);
  GeluForward(y.data(), x.data(), 64);
  std::vector<double> ref(64), dref(64);
  for (int i = 0; i < 64; ++i) {
    auto g = [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); };
    ref[i] = g(x[i]);
    dref[i] = (g(x[i] + 1e-6) - g(x[i] - 1e-6)) / 2e-6;
  }
  EXPECT_LT(MaxRelative(y, ref), 1e-6);
  GeluBackward(dx.data(), x.data(), ones.data(), 64);
  EXPECT_LT(MaxRelative(dx, dref), 1e-5);
}

// VecExp and VecTanh against libm in double: a few ulp over the range, the
// edges exact (underflow to 0, overflow to inf, NaN kept), and the same bits
// from a vectorized loop as from scalar calls.
TEST(VectorMath, ExpAndTanhMatchLibmAndVectorizeBitForBit) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.01953125f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.7f, -87.3f}) x.push_back(v);
  std::vector<float> e(x.size()), t(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) e[i] = VecExp(x[i]);
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) t[i] = VecTanh(x[i]);
  for (size_t i = 0; i < x.size(); ++i) {
    volatile float xi = x[i];  // a scalar call
    ASSERT_EQ(VecExp(xi), e[i]) << x[i];
    ASSERT_EQ(VecTanh(xi), t[i]) << x[i];
    const double want = std::exp(double(x[i]));
    if (want < 1.1754943508222875e-38) {
      EXPECT_EQ(e[i], 0.0f) << x[i];
    } else if (x[i] > 88.3762626f) {
      EXPECT_EQ(e[i], INFINITY) << x[i];
    } else {
      EXPECT_LE(std::abs(e[i] - want) / want, 3e-7) << x[i];
    }
    EXPECT_LE(std::abs(t[i] - std::tanh(double(x[i]))), 2.5e-7) << x[i];
  }
  EXPECT_EQ(VecExp(-INFINITY), 0.0f);
  EXPECT_EQ(VecExp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(VecExp(NAN)));
  EXPECT_TRUE(std::isnan(VecTanh(NAN)));
  EXPECT_EQ(VecTanh(50.0f), 1.0f);
  EXPECT_EQ(VecTanh(-50.0f), -1.0f);
}

// The fused residual + LayerNorm gives the bits of the two kernels in a row.
TEST(LayerNorm, ResidualFusedForwardIsTheTwoKernelsBitForBit) {
  std::mt19937 rng(15);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {64, 384}}) {
    auto a = Random(N * C, rng, 2.0f), b = Random(N * C, rng), w = Random(C, rng), bias = Random(C, rng);
    std::vector<float> res(N * C), out(N * C), mean(N), rstd(N);
    ResidualLayerNormForward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                             bias.data(), N, C);
    std::vector<float> res2(N * C), out2(N * C), mean2(N), rstd2(N);
    ResidualForward(res2.data(), a.data(), b.data(), N * C);
    LayerNormForward(out2.data(), mean2.data(), rstd2.data(), res2.data(), w.data(), bias.data(), N, C);
    EXPECT_EQ(res, res2);
    EXPECT_EQ(out, out2);
    EXPECT_EQ(mean, mean2);
    EXPECT_EQ(rstd, rstd2);
  }
}

TEST(CrossEntropy, LossAndInPlaceGradientInOnePass) {
  std::mt19937 rng(6);
  const int64_t N = 4, V = 9;
  const auto logits = Random(N * V, rng, 3.0f);
  std::vector<int32_t> targets = {0, 8, 3, 3};
  std::vector<double> dref(N * V);
  std::vector<double> loss_ref(N);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(logits[n * V + j]));
    loss_ref[n] = std::log(s) - logits[n * V + targets[n]];
    for (int64_t j = 0; j < V; ++j) dref[n * V + j] = (std::exp(double(logits[n * V + j])) / s - (j == targets[n])) * 0.5;
  }
  // The loss alone leaves the logits as they are.
  std::vector<float> losses(N, -1.0f), x = logits;
  CrossEntropy(losses.data(), x.data(), targets.data(), 0.5f, false, N, V, V);
  EXPECT_EQ(x, logits);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(losses[n], loss_ref[n], 1e-5) << n;
  // Loss and gradient: the same losses, the gradient over the logits.
  std::vector<float> both(N, -1.0f);
  CrossEntropy(both.data(), x.data(), targets.data(), 0.5f, true, N, V, V);
  EXPECT_EQ(both, losses);
  EXPECT_LT(MaxRelative(x, dref), 1e-6);
  // The gradient alone (no losses): the same gradient.
  std::vector<float> y = logits;
  CrossEntropy(nullptr, y.data(), targets.data(), 0.5f, true, N, V, V);
  EXPECT_EQ(y, x);
}

// 16-bit logits: each row widened exactly, computed as the fp32 form does,
// the gradient rounded to the logits' type.
TEST(CrossEntropy, SixteenBitLogitsAreTheFp32FormRounded) {
  std::mt19937 rng(26);
  const int64_t N = 6, V = 37, Vp = 40;
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    auto narrow = [&](float v) { return bf16 ? kernels::FloatToBFloat16(v) : kernels::FloatToHalf(v); };
    auto widen = [&](uint16_t h) { return bf16 ? kernels::BFloat16ToFloat(h) : kernels::HalfToFloat(h); };
    const auto values = Random(N * Vp, rng, 3.0f);
    std::vector<uint16_t> h(N * Vp);
    std::vector<float> wide(N * Vp);
    for (int64_t i = 0; i < N * Vp; ++i) {
      h[i] = narrow(values[i]);
      wide[i] = widen(h[i]);
    }
    std::vector<int32_t> targets = {0, 36, 5, 5, 20, 1};
    std::vector<float> losses(N), losses16(N);
    CrossEntropy(losses.data(), wide.data(), targets.data(), 0.125f, true, N, V, Vp);
    CrossEntropy(losses16.data(), h.data(), bf16, targets.data(), 0.125f, true, N, V, Vp);
    EXPECT_EQ(losses16, losses);
    for (int64_t i = 0; i < N * Vp; ++i) ASSERT_EQ(h[i], narrow(wide[i])) << i;
  }
}

// Rows Vp apart: the padding columns, whatever they hold, are not part of the
// softmax, and the gradient zeroes them; the real columns equal the unpadded run.
TEST(CrossEntropy, PaddedColumnsAreIgnoredAndZeroed) {
  std::mt19937 rng(16);
  const int64_t N = 5, V = 11, Vp = 16;
  auto dense = Random(N * V, rng, 3.0f);
  std::vector<float> padded(N * Vp, 1e4f);
  for (int64_t n = 0; n < N; ++n) std::copy_n(&dense[n * V], V, &padded[n * Vp]);
  std::vector<int32_t> targets = {0, 10, 3, 3, 7};
  std::vector<float> losses(N), padded_losses(N);
  CrossEntropy(losses.data(), dense.data(), targets.data(), 0.25f, true, N, V, V);
  CrossEntropy(padded_losses.data(), padded.data(), targets.data(), 0.25f, true, N, V, Vp);
  EXPECT_EQ(losses, padded_losses);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < Vp; ++j) {
      EXPECT_EQ(padded[n * Vp + j], j < V ? dense[n * V + j] : 0.0f) << n << "," << j;
    }
  }
}

TEST(Encoder, BackwardSumsRepeatedTokensAndIsThreadCountInvariant) {
  std::mt19937 rng(7);
  const int64_t B = 3, T = 50, C = 37, V = 5;
  std::vector<int32_t> tokens(B * T);
  for (auto& t : tokens) t = int32_t(rng() % V);
  auto dout = Random(B * T * C, rng);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, B, T, C);
    return std::make_pair(dwte, dwpe);
  };
  auto one = run(1), two = run(2);
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(one.first, two.first);
  EXPECT_EQ(one.second, two.second);
  std::vector<double> ref(V * C, 0.0);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) ref[tokens[i] * C + c] += dout[i * C + c];
  EXPECT_LT(MaxRelative(one.first, ref), 1e-5);
}

// Packed examples' positions: the position table's rows by the positions
// array (restarting per example), forward and backward, in every precision
// form; each row's gradient summed in (b, t) order whatever the threads.
TEST(Encoder, PositionsPickThePositionTablesRows) {
  std::mt19937 rng(9);
  const int64_t B = 3, T = 40, C = 19, V = 7, maxT = 45;
  std::vector<int32_t> tokens(B * T), positions(B * T);
  for (auto& t : tokens) t = int32_t(rng() % V);
  for (int64_t b = 0; b < B; ++b) {
    int32_t p = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (rng() % 5 == 0) p = 0;
      positions[b * T + t] = p++;
    }
  }
  const auto wte = Random(V * C, rng), wpe = Random(maxT * C, rng);
  std::vector<float> out(B * T * C);
  EncoderForward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), B, T, C);
  for (int64_t i = 0; i < B * T; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(out[i * C + c], wte[tokens[i] * C + c] + wpe[positions[i] * C + c]) << i << "," << c;
    }
  }
  // The 16-bit forms read the same rows: a table of 16-bit values, fp32 tables.
  std::vector<uint16_t> wte16(wte.size()), wpe16(wpe.size()), o16(out.size()), o16_wide(out.size());
  for (size_t i = 0; i < wte.size(); ++i) wte16[i] = kernels::FloatToBFloat16(wte[i]);
  for (size_t i = 0; i < wpe.size(); ++i) wpe16[i] = kernels::FloatToBFloat16(wpe[i]);
  EncoderForward(o16.data(), tokens.data(), positions.data(), wte16.data(), wpe16.data(), /*bf16=*/true, B, T, C);
  EncoderForward(o16_wide.data(), /*bf16=*/true, tokens.data(), positions.data(), wte.data(), wpe.data(), B, T, C);
  for (int64_t i = 0; i < B * T; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      const float narrow =
          kernels::BFloat16ToFloat(wte16[tokens[i] * C + c]) + kernels::BFloat16ToFloat(wpe16[positions[i] * C + c]);
      ASSERT_EQ(o16[i * C + c], kernels::FloatToBFloat16(narrow)) << i << "," << c;
      ASSERT_EQ(o16_wide[i * C + c], kernels::FloatToBFloat16(out[i * C + c])) << i << "," << c;
    }
  }
  const auto dout = Random(B * T * C, rng);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> dwte(V * C, 0.5f), dwpe(maxT * C, 0.25f);
    EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), positions.data(), B, T, C);
    return std::make_pair(dwte, dwpe);
  };
  auto one = run(1), two = run(2);
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(one.first, two.first);
  EXPECT_EQ(one.second, two.second);
  // The same sums in (b, t) order, in float, from the starting gradient.
  std::vector<float> want(maxT * C, 0.25f);
  for (int64_t i = 0; i < B * T; ++i) {
    for (int64_t c = 0; c < C; ++c) want[positions[i] * C + c] += dout[i * C + c];
  }
  EXPECT_EQ(one.second, want);
  // Positions 0..T-1 in every row are the unpacked pass's bits.
  std::vector<int32_t> rows(B * T);
  for (int64_t i = 0; i < B * T; ++i) rows[i] = int32_t(i % T);
  std::vector<float> a(B * T * C), b(B * T * C);
  EncoderForward(a.data(), tokens.data(), rows.data(), wte.data(), wpe.data(), B, T, C);
  EncoderForward(b.data(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T, C);
  EXPECT_EQ(a, b);
}

TEST(Adam, MatchesScalarFormula) {
  std::mt19937 rng(8);
  const int64_t n = 1000;
  auto p = Random(n, rng), g = Random(n, rng), m = Random(n, rng, 0.1f), v = Random(n, rng, 0.1f);
  for (auto& x : v) x = x * x;
  AdamParams a{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, 0.5f, 1 - 0.9f * 0.9f, 1 - 0.95f * 0.95f};
  std::vector<double> rp(n), rm(n), rv(n);
  for (int64_t i = 0; i < n; ++i) {
    double gi = double(g[i]) * a.grad_scale;
    rm[i] = 0.9 * m[i] + 0.1 * gi;
    rv[i] = 0.95 * v[i] + 0.05 * gi * gi;
    double denom = std::sqrt(rv[i]) / std::sqrt(double(a.bias_correction2)) + 1e-8;
    rp[i] = double(p[i]) * (1 - 0.01 * 0.1) - 0.01 / a.bias_correction1 * rm[i] / denom;
  }
  AdamUpdate(p.data(), g.data(), m.data(), v.data(), n, a);
  EXPECT_LT(MaxRelative(p, rp), 1e-6);
  EXPECT_LT(MaxRelative(m, rm), 1e-6);
  EXPECT_LT(MaxRelative(v, rv), 1e-6);
}

TEST(Reduce, SumOfSquaresAndFiniteness) {
  std::mt19937 rng(9);
  auto x = Random(100003, rng);
  double ref = 0;
  for (float v : x) ref += double(v) * v;
  EXPECT_NEAR(SumOfSquares(x.data(), int64_t(x.size())), ref, 1e-9 * ref);
  // Past one pass of the 512 x 256 lanes, and a ragged small size.
  for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{512 * 256 + 5}}) {
    auto y = Random(size_t(n) + 300000, rng);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(y[size_t(i)]) * y[size_t(i)];
    EXPECT_NEAR(SumOfSquares(y.data(), n), want, 1e-12 * want) << n;
  }
  EXPECT_EQ(SumOfSquares(x.data(), 0), 0.0);
  EXPECT_TRUE(AllFinite(x.data(), int64_t(x.size())));
  x[77777] = std::nanf("");
  EXPECT_FALSE(AllFinite(x.data(), int64_t(x.size())));
}

}  // namespace
}  // namespace pstar::kernels::cpu
