// The CPU kernels whose outputs a 16-bit run keeps in 16 bits (LayerNorm,
// the residual + LayerNorm, GELU, attention): each 16-bit variant writes
// exactly the fp32 kernel's output rounded to nearest even, on fresh random
// shapes, at 1, 2 and 3 threads; attention's backward over a 16-bit out is
// the fp32 backward over that out widened.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/half.h"
#include "kernels/layernorm.h"

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
  std::mt19937_64 rng_{std::random_device{}()};
  int64_t Pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
};

TEST_P(NarrowOutputs, LayerNormWritesTheFp32OutputRounded) {
  const int64_t N = Pick(1, 70), C = Pick(1, 300);
  SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
  const auto x = Random(rng_, N * C, 3.0f), w = Random(rng_, C), b = Random(rng_, C);
  std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const auto want = Narrowed(bf16(), out);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(N * C));
    std::vector<float> m(static_cast<size_t>(N)), r(static_cast<size_t>(N));
    LayerNormForward(got.data(), bf16(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
    EXPECT_EQ(got, want);
    EXPECT_EQ(m, mean);
    EXPECT_EQ(r, rstd);
  });
}

TEST_P(NarrowOutputs, ResidualLayerNormWritesTheFp32OutputRounded) {
  const int64_t N = Pick(1, 70), C = Pick(1, 300);
  SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
  const auto a = Random(rng_, N * C), b = Random(rng_, N * C), w = Random(rng_, C), bias = Random(rng_, C);
  std::vector<float> res(static_cast<size_t>(N * C)), out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  ResidualLayerNormForward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                           bias.data(), N, C);
  const auto want = Narrowed(bf16(), out);
  AtThreadCounts([&] {
    std::vector<float> r2(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), rs(static_cast<size_t>(N));
    std::vector<uint16_t> got(static_cast<size_t>(N * C));
    ResidualLayerNormForward(r2.data(), got.data(), bf16(), m.data(), rs.data(), a.data(), b.data(), w.data(),
                             bias.data(), N, C);
    EXPECT_EQ(r2, res) << "the residual stays fp32";
    EXPECT_EQ(got, want);
    EXPECT_EQ(m, mean);
    EXPECT_EQ(rs, rstd);
  });
}

TEST_P(NarrowOutputs, GeluWritesTheFp32OutputRounded) {
  // Across the 1024-element pieces the 16-bit variant computes in, and off them.
  const int64_t n = Pick(1, 5000);
  SCOPED_TRACE(testing::Message() << "n " << n);
  const auto x = Random(rng_, n, 4.0f);
  std::vector<float> out(static_cast<size_t>(n));
  GeluForward(out.data(), x.data(), n);
  const auto want = Narrowed(bf16(), out);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(n));
    GeluForward(got.data(), bf16(), x.data(), n);
    EXPECT_EQ(got, want);
  });
}

TEST_P(NarrowOutputs, AttentionWritesTheFp32OutputRoundedAndReadsItBack) {
  const int64_t B = Pick(1, 2), T = Pick(1, 3 * kAttentionBlock), NH = Pick(1, 3), hs = Pick(1, 48);
  const int64_t C = NH * hs;
  SCOPED_TRACE(testing::Message() << "B " << B << " T " << T << " NH " << NH << " hs " << hs);
  const auto qkv = Random(rng_, B * T * 3 * C), dout = Random(rng_, B * T * C);
  std::vector<float> out(static_cast<size_t>(B * T * C)), lse(static_cast<size_t>(B * NH * T));
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  const auto want = Narrowed(bf16(), out);
  // The fp32 backward over the rounded out, widened: what the 16-bit one must give.
  std::vector<float> widened(want.size());
  for (size_t i = 0; i < want.size(); ++i) widened[i] = Widen(bf16(), want[i]);
  std::vector<float> want_dqkv(qkv.size());
  AttentionBackward(want_dqkv.data(), dout.data(), qkv.data(), widened.data(), lse.data(), B, T, C, NH);
  AtThreadCounts([&] {
    std::vector<uint16_t> got(static_cast<size_t>(B * T * C));
    std::vector<float> l(static_cast<size_t>(B * NH * T)), dqkv(qkv.size());
    AttentionForward(got.data(), bf16(), l.data(), qkv.data(), B, T, C, NH);
    EXPECT_EQ(got, want);
    EXPECT_EQ(l, lse);
    AttentionBackward(dqkv.data(), dout.data(), qkv.data(), got.data(), bf16(), l.data(), B, T, C, NH);
    EXPECT_EQ(dqkv, want_dqkv);
  });
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowOutputs, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "bf16" : "fp16"; });

}  // namespace
}  // namespace pstar::kernels::cpu
