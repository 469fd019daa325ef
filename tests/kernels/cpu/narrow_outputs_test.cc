// The CPU kernels' 16-bit variants, for the activations a 16-bit run keeps in
// 16 bits (the residual stream, qkv, the MLP's pre-activation, and the
// LayerNorm, attention and GELU outputs): each is exactly the fp32 kernel over the widened 16-bit inputs,
// its output rounded to nearest even, on fresh random shapes, at 1, 2 and 3
// threads; the backward passes over a 16-bit input are the fp32 ones over
// that input widened.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/half.h"
#include "kernels/layernorm.h"
#include "kernels/residual.h"

namespace pstar::kernels::cpu {
namespace {

std::vector<float> Random(std::mt19937_64& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

uint16_t Narrow(bool bf16, float x) { return bf16 ? FloatToBFloat16(x) : FloatToHalf(x); }
float Widen(bool bf16, uint16_t h) { return bf16 ? BFloat16ToFloat(h) : HalfToFloat(h); }

std::vector<uint16_t> Narrowed(bool bf16, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = Narrow(bf16, x[i]);
  return h;
}

// Runs `body` at 1, 2 and 3 threads, then restores the thread count.
template <typename Body>
void AtThreadCounts(Body body) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    SCOPED_TRACE(testing::Message() << threads << " threads");
    body();
  }
  omp_set_num_threads(before);
}

class NarrowOutputs : public testing::TestWithParam<bool> {
 protected:
  bool bf16() const { return GetParam(); }
  std::vector<float> Widened(const std::vector<uint16_t>& h) const {
    std::vector<float> x(h.size());
    for (size_t i = 0; i < h.size(); ++i) x[i] = Widen(bf16(), h[i]);
    return x;
  }
  const uint64_t seed_ = std::random_device{}();
  // Every failure names the seed, so its shapes and values can be replayed.
  testing::ScopedTrace seed_trace_{__FILE__, __LINE__, "seed " + std::to_string(seed_)};
  std::mt19937_64 rng_{seed_};
  int64_t Pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
};

TEST_P(NarrowOutputs, LayerNormOverSixteenBitRowsIsTheFp32KernelOverTheWidenedRows) {
  const int64_t N = Pick(1, 70), C = Pick(1, 300);
  SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
  const auto x16 = Narrowed(bf16(), Random(rng_, N * C, 3.0f));
  const auto x = Widened(x16);
  const auto w = Random(rng_, C), b = Random(rng_, C), dout = Random(rng_, N * C);
  std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const auto want = Narrowed(bf16(), out);
  std::vector<float> want_dinp = Random(rng_, N * C), want_dw = Random(rng_, C), want_db = Random(rng_, C);
  const auto dinp0 = want_dinp, dw0 = want_dw, db0 = want_db;
  LayerNormBackward(want_dinp.data(), want_dw.data(), want_db.data(), dout.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(N * C));
    std::vector<float> m(static_cast<size_t>(N)), r(static_cast<size_t>(N));
    LayerNormForward(got.data(), m.data(), r.data(), x16.data(), bf16(), w.data(), b.data(), N, C);
    EXPECT_EQ(got, want);
    EXPECT_EQ(m, mean);
    EXPECT_EQ(r, rstd);
    auto dinp = dinp0, dw = dw0, db = db0;
    LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), x16.data(), bf16(), w.data(), m.data(),
                      r.data(), N, C);
    EXPECT_EQ(dinp, want_dinp);
    EXPECT_EQ(dw, want_dw);
    EXPECT_EQ(db, want_db);
  });
}

TEST_P(NarrowOutputs, ResidualLayerNormRoundsTheSumAndNormalizesTheRoundedSum) {
  const int64_t N = Pick(1, 70), C = Pick(1, 300);
  SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
  const auto a16 = Narrowed(bf16(), Random(rng_, N * C));
  const auto a = Widened(a16);
  const auto b = Random(rng_, N * C), w = Random(rng_, C), bias = Random(rng_, C);
  std::vector<float> sum(static_cast<size_t>(N * C));
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
  const auto want_res = Narrowed(bf16(), sum);
  const auto res = Widened(want_res);
  std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  LayerNormForward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N, C);
  const auto want = Narrowed(bf16(), out);
  AtThreadCounts([&] {
    std::vector<uint16_t> r16(static_cast<size_t>(N * C)), got(static_cast<size_t>(N * C));
    std::vector<float> m(static_cast<size_t>(N)), rs(static_cast<size_t>(N));
    ResidualLayerNormForward(r16.data(), got.data(), m.data(), rs.data(), a16.data(), b.data(), bf16(), w.data(),
                             bias.data(), N, C);
    EXPECT_EQ(r16, want_res);
    EXPECT_EQ(got, want);
    EXPECT_EQ(m, mean);
    EXPECT_EQ(rs, rstd);
  });
}

TEST_P(NarrowOutputs, ResidualAndEncoderRoundTheFp32SumOnce) {
  const int64_t n = Pick(1, 5000);
  const auto a16 = Narrowed(bf16(), Random(rng_, n));
  const auto a = Widened(a16);
  const auto b = Random(rng_, n);
  std::vector<float> sum(static_cast<size_t>(n));
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
  const auto want = Narrowed(bf16(), sum);
  const int64_t B = Pick(1, 3), T = Pick(1, 9), C = Pick(1, 40), V = Pick(1, 20);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (auto& t : tokens) t = int32_t(Pick(0, V - 1));
  const auto wte = Random(rng_, V * C), wpe = Random(rng_, T * C);
  const auto wte16 = Narrowed(bf16(), wte), wpe16 = Narrowed(bf16(), wpe);
  std::vector<float> enc(static_cast<size_t>(B * T * C)), enc_wide(static_cast<size_t>(B * T * C));
  EncoderForward(enc.data(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T, C);
  EncoderForward(enc_wide.data(), tokens.data(), nullptr, Widened(wte16).data(), Widened(wpe16).data(), B, T, C);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(n));
    ResidualForward(got.data(), a16.data(), b.data(), bf16(), n);
    EXPECT_EQ(got, want);
    auto in_place = a16;
    ResidualForward(in_place.data(), in_place.data(), b.data(), bf16(), n);
    EXPECT_EQ(in_place, want);
    std::vector<uint16_t> e16(enc.size());
    EncoderForward(e16.data(), bf16(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T, C);
    EXPECT_EQ(e16, Narrowed(bf16(), enc)) << "fp32 tables";
    EncoderForward(e16.data(), tokens.data(), nullptr, wte16.data(), wpe16.data(), bf16(), B, T, C);
    EXPECT_EQ(e16, Narrowed(bf16(), enc_wide)) << "16-bit tables";
  });
}

TEST_P(NarrowOutputs, GeluOverSixteenBitsIsTheFp32KernelOverTheWidenedInput) {
  // Across the 1024-element pieces the 16-bit variants widen in, and off them.
  const int64_t n = Pick(1, 5000);
  SCOPED_TRACE(testing::Message() << "n " << n);
  const auto x16 = Narrowed(bf16(), Random(rng_, n, 4.0f));
  const auto x = Widened(x16);
  const auto dout = Random(rng_, n);
  std::vector<float> out(static_cast<size_t>(n)), want_dinp(static_cast<size_t>(n));
  GeluForward(out.data(), x.data(), n);
  GeluBackward(want_dinp.data(), x.data(), dout.data(), n);
  const auto want = Narrowed(bf16(), out);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(n));
    GeluForward(got.data(), x16.data(), bf16(), n);
    EXPECT_EQ(got, want);
    std::vector<float> dinp(static_cast<size_t>(n));
    GeluBackward(dinp.data(), x16.data(), bf16(), dout.data(), n);
    EXPECT_EQ(dinp, want_dinp);
    auto in_place = dout;  // dinp aliasing dout
    GeluBackward(in_place.data(), x16.data(), bf16(), in_place.data(), n);
    EXPECT_EQ(in_place, want_dinp);
  });
}

TEST_P(NarrowOutputs, AttentionOverSixteenBitsIsTheFp32KernelOverTheWidenedTensors) {
  const int64_t B = Pick(1, 2), T = Pick(1, 3 * kAttentionBlock), NH = Pick(1, 3), hs = Pick(1, 48);
  const int64_t C = NH * hs;
  SCOPED_TRACE(testing::Message() << "B " << B << " T " << T << " NH " << NH << " hs " << hs);
  const auto qkv16 = Narrowed(bf16(), Random(rng_, B * T * 3 * C));
  const auto qkv = Widened(qkv16);
  const auto dout = Random(rng_, B * T * C);
  std::vector<float> out(static_cast<size_t>(B * T * C)), lse(static_cast<size_t>(B * NH * T));
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  const auto want = Narrowed(bf16(), out);
  // The fp32 backward over the widened qkv and the rounded out, widened.
  std::vector<float> want_dqkv(qkv.size());
  AttentionBackward(want_dqkv.data(), dout.data(), qkv.data(), Widened(want).data(), lse.data(), B, T, C, NH);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(B * T * C));
    std::vector<float> l(static_cast<size_t>(B * NH * T)), dqkv(qkv.size());
    AttentionForward(got.data(), l.data(), qkv16.data(), bf16(), B, T, C, NH);
    EXPECT_EQ(got, want);
    EXPECT_EQ(l, lse);
    AttentionBackward(dqkv.data(), dout.data(), qkv16.data(), got.data(), bf16(), l.data(), B, T, C, NH);
    EXPECT_EQ(dqkv, want_dqkv);
  });
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowOutputs, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "bf16" : "fp16"; });

}  // namespace
}  // namespace pstar::kernels::cpu
