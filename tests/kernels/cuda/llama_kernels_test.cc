// The Llama family's CUDA kernels against their CPU twins on a GPU: RMSNorm
// (forward, residual-fused, backward in both row kernels, deterministic),
// RoPE both ways on grouped-query rows, SwiGLU both ways, and the vocabulary
// row parts (the encoder's and the classifier's GEMMs), whose parts in turn
// give the whole table's results. The same kernels' code runs on every
// machine through the host emulation (llama_kernels_emulation_test.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/encoder.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/encoder.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;

template <typename T>
class CudaLlamaKernelsTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaLlamaKernelsTest, ElementTypes, ElementName);

struct Shape {
  int64_t N, C;
};
// Row lengths below, at and past a warp, with and without 16-byte runs;
// Llama 3.2 1B's 2048 and rows that leave the last block and group partial.
constexpr Shape kShapes[] = {{1, 8}, {9, 33}, {37, 200}, {130, 2048}, {1025, 64}};

template <typename T>
std::vector<float> Weights(size_t n, std::mt19937& rng) {
  std::vector<float> w = RandomValues<T>(n, rng, 0.2f);
  for (float& x : w) x = Element<T>::ToFloat(Element<T>::FromFloat(x + 1.0f));
  return w;
}

TYPED_TEST(CudaLlamaKernelsTest, RmsNormForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(61);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t n = size_t(s.N * s.C);
    const auto x = RandomValues<T>(n, rng, 2.0f);
    const auto w = Weights<T>(size_t(s.C), rng);
    DeviceBuffer<T> dx(ToElements<T>(x)), dw(ToElements<T>(w)), dout(s.N * s.C);
    DeviceBuffer<float> drstd(s.N);
    cuda::RmsNormForward<T>(dout.get(), drstd.get(), dx.get(), dw.get(), 1e-5f, s.N, s.C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> out(n), rstd(size_t(s.N));
    cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), 1e-5f, s.N, s.C);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(drstd.Download(), rstd, 1e-5)) << "rstd";
  }
}

// A 16-bit run's form: 16-bit residual stream, an fp32 projection added.
TYPED_TEST(CudaLlamaKernelsTest, ResidualRmsNormForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(62);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t n = size_t(s.N * s.C);
    const auto a = RandomValues<T>(n, rng, 2.0f);
    const auto b = RandomValues<float>(n, rng);
    const auto w = Weights<T>(size_t(s.C), rng);
    DeviceBuffer<T> da(ToElements<T>(a)), dw(ToElements<T>(w)), dres(s.N * s.C), dout(s.N * s.C);
    DeviceBuffer<float> db(b), drstd(s.N);
    cuda::ResidualRmsNormForward<T, float>(dres.get(), dout.get(), drstd.get(), da.get(), db.get(), dw.get(), 1e-6f,
                                           s.N, s.C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    // The CPU's twin on the same rounding of the sum.
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = Element<T>::ToFloat(Element<T>::FromFloat(a[i] + b[i]));
    std::vector<float> out(n), rstd(size_t(s.N));
    cpu::RmsNormForward(out.data(), rstd.data(), sum.data(), w.data(), 1e-6f, s.N, s.C);
    EXPECT_EQ(ToFloats(dres.Download()), sum) << "res: one rounding of a + b";
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(drstd.Download(), rstd, 1e-5)) << "rstd";
  }
}

// Both row kernels accumulate into dinp and dweight as the CPU does, write
// dinp's copy in T, and repeat their bits run to run.
TYPED_TEST(CudaLlamaKernelsTest, RmsNormBackwardMatchesCpuAndRepeats) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(63);
  for (const Shape& s : kShapes) {
    const size_t n = size_t(s.N * s.C);
    const auto x = RandomValues<T>(n, rng, 1.5f);
    const auto dy = RandomValues<T>(n, rng);
    const auto w = Weights<T>(size_t(s.C), rng);
    const auto dinp0 = RandomValues<float>(n, rng, 0.1f);
    const auto dw0 = RandomValues<float>(size_t(s.C), rng);
    std::vector<float> out(n), rstd(size_t(s.N));
    cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), 1e-5f, s.N, s.C);
    std::vector<float> want_dinp = dinp0, want_dw = dw0;
    cpu::RmsNormBackward(want_dinp.data(), want_dw.data(), dy.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
    for (const cuda::LayerNormKernel kernel : {cuda::LayerNormKernel::kScalar, cuda::LayerNormKernel::kVector}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " kernel " << int(kernel));
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer<T> dx(ToElements<T>(x)), ddy(ToElements<T>(dy)), copy(s.N * s.C);
        DeviceBuffer<float> dw(w), drstd(rstd), ddinp(dinp0), ddw(dw0);
        DeviceBuffer<float> scratch(cuda::RmsNormBackwardScratchElements(s.N, s.C));
        cuda::RmsNormBackward<T, T>(ddinp.get(), ddw.get(), scratch.get(), ddy.get(), dx.get(), dw.get(),
                                    drstd.get(), s.N, s.C, kStream, copy.get(), kernel);
        ASSERT_NO_FATAL_FAILURE(SyncOrFail());
        const auto got_dinp = ddinp.Download(), got_dw = ddw.Download();
        EXPECT_TRUE(AllClose(got_dinp, want_dinp, 1e-5)) << "dinp";
        EXPECT_TRUE(AllClose(got_dw, want_dw, 1e-5)) << "dweight";
        EXPECT_EQ(ToFloats(copy.Download()), ToFloats(ToElements<T>(got_dinp))) << "dinp's copy";
        std::vector<float> both = got_dinp;
        both.insert(both.end(), got_dw.begin(), got_dw.end());
        if (run == 0) first = both;
        if (run == 1) EXPECT_EQ(both, first) << "the same bits on a second run";
      }
    }
  }
}

// Grouped-query rows (q heads, then k heads, then v heads): the q and k heads
// rotated by each row's own position, the v heads untouched; backward is the
// CPU's transpose.
TYPED_TEST(CudaLlamaKernelsTest, RopeMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(64);
  struct Case {
    int64_t N, NH, NKV, hs;
  };
  for (const Case& k : {Case{7, 4, 4, 64}, Case{300, 32, 8, 64}, Case{65, 8, 1, 128}}) {
    SCOPED_TRACE(testing::Message() << "N=" << k.N << " NH=" << k.NH << " NKV=" << k.NKV << " hs=" << k.hs);
    const int64_t stride = (k.NH + 2 * k.NKV) * k.hs, heads = k.NH + k.NKV, positions = 4096;
    std::vector<float> cos(size_t(positions * k.hs / 2)), sin(cos.size());
    kernels::RopeScaling scaling;
    scaling.llama3 = true;
    kernels::RopeTables(cos.data(), sin.data(), positions, k.hs, 500000.0, scaling);
    std::vector<int32_t> pos(size_t(k.N));
    for (int32_t& p : pos) p = std::uniform_int_distribution<int32_t>(0, int32_t(positions - 1))(rng);
    const auto x = RandomValues<T>(size_t(k.N * stride), rng);
    DeviceBuffer<T> dx(ToElements<T>(x)), dg(ToElements<T>(x));
    DeviceBuffer<float> dcos(cos), dsin(sin);
    DeviceBuffer<int32_t> dpos(pos);
    cuda::RopeForward<T>(dx.get(), stride, dcos.get(), dsin.get(), dpos.get(), k.N, heads, k.hs, kStream);
    cuda::RopeBackward<T>(dg.get(), stride, dcos.get(), dsin.get(), dpos.get(), k.N, heads, k.hs, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> fwd = x, bwd = x;
    cpu::RopeForward(fwd.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs);
    cpu::RopeBackward(bwd.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs);
    const auto got = ToFloats(dx.Download());
    EXPECT_TRUE(AllClose(got, fwd, Element<T>::kTolerance)) << "forward";
    EXPECT_TRUE(AllClose(ToFloats(dg.Download()), bwd, Element<T>::kTolerance)) << "backward";
    for (int64_t r = 0; r < k.N; ++r) {
      for (int64_t c = heads * k.hs; c < stride; ++c) {
        ASSERT_EQ(got[size_t(r * stride + c)], x[size_t(r * stride + c)]) << "row " << r << ": a v head changed";
      }
    }
  }
}

TYPED_TEST(CudaLlamaKernelsTest, SwiGluMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(65);
  // F a multiple of 8 (16-byte packs: Llama 3.2 1B's 8192) and not.
  for (const Shape& s : {Shape{3, 8192}, Shape{17, 13}, Shape{64, 200}, Shape{1, 3}}) {
    const int64_t N = s.N, F = s.C;
    SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F);
    const auto gu = RandomValues<T>(size_t(2 * N * F), rng, 3.0f);
    const auto dy = RandomValues<T>(size_t(N * F), rng);
    DeviceBuffer<T> dgu(ToElements<T>(gu)), ddy(ToElements<T>(dy)), dout(N * F), dgrad(2 * N * F);
    cuda::SwiGluForward<T>(dout.get(), dgu.get(), N, F, kStream);
    cuda::SwiGluBackward<T>(dgrad.get(), dgu.get(), ddy.get(), N, F, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> out(size_t(N * F)), grad(size_t(2 * N * F));
    cpu::SwiGluForward(out.data(), gu.data(), N, F);
    cpu::SwiGluBackward(grad.data(), gu.data(), dy.data(), N, F);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(ToFloats(dgrad.Download()), grad, Element<T>::kTolerance, 1.0)) << "dgu";
  }
}

// A table in three row parts (the last short): the parts in turn write every
// token's row and add every gradient row, with the whole table's bits; the
// fp32 gradient has the CPU's bits (both add in (b, t) order).
TYPED_TEST(CudaLlamaKernelsTest, EncoderRowPartsGiveTheWholeTablesBits) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(66);
  const int64_t B = 3, Tlen = 70, C = 40, V = 150, part_rows = 64;
  std::vector<int32_t> tokens(size_t(B * Tlen));
  for (int32_t& t : tokens) t = std::uniform_int_distribution<int32_t>(0, int32_t(V - 1))(rng);
  tokens[0] = 149;  // the last row of the last part
  const auto table = RandomValues<T>(size_t(V * C), rng);
  const auto dout = RandomValues<float>(size_t(B * Tlen * C), rng);
  const auto dtable0 = RandomValues<float>(size_t(V * C), rng);
  DeviceBuffer<T> dtable(ToElements<T>(table)), whole_out(B * Tlen * C), parts_out(B * Tlen * C);
  DeviceBuffer<int32_t> dtokens(tokens), scratch(cuda::EncoderBackwardScratchElements(B, Tlen));
  DeviceBuffer<float> ddout(dout), whole_grad(dtable0), parts_grad(dtable0);
  cuda::EncoderForward<T>(whole_out.get(), dtokens.get(), nullptr, dtable.get(), nullptr, B, Tlen, C, kStream);
  cuda::EncoderBackward<float>(whole_grad.get(), nullptr, scratch.get(), ddout.get(), dtokens.get(), nullptr, B, Tlen,
                               C, kStream);
  for (int64_t row0 = 0; row0 < V; row0 += part_rows) {
    const int64_t rows = std::min(part_rows, V - row0);
    cuda::EncoderPartForward<T>(parts_out.get(), dtokens.get(), dtable.get() + row0 * C, row0, rows, B, Tlen, C,
                                kStream);
    cuda::EncoderPartBackward<float>(parts_grad.get() + row0 * C, scratch.get(), ddout.get(), dtokens.get(), row0,
                                     rows, B, Tlen, C, kStream);
  }
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  const auto out = ToFloats(parts_out.Download());
  EXPECT_EQ(out, ToFloats(whole_out.Download()));
  for (int64_t bt = 0; bt < B * Tlen; ++bt) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(out[size_t(bt * C + c)], table[size_t(tokens[size_t(bt)] * C + c)]) << "position " << bt;
    }
  }
  const auto grad = parts_grad.Download();
  EXPECT_EQ(grad, whole_grad.Download());
  std::vector<float> want = dtable0;
  cpu::EncoderBackward(want.data(), nullptr, dout.data(), tokens.data(), nullptr, B, Tlen, C);
  EXPECT_EQ(grad, want) << "the CPU's bits";
}

// The classifier over row parts: each part's GEMM writes its columns of
// logits rows Vp apart, the input gradient sums the parts in fp32 and each
// part's weight gradient is its own, against the CPU's GEMMs.
TYPED_TEST(CudaLlamaKernelsTest, ClassifierRowPartsMatchCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(67);
  const int64_t N = 40, C = 64, V = 150, Vp = 192, part_rows = 64;
  const auto inp = RandomValues<T>(size_t(N * C), rng);
  const auto weight = RandomValues<T>(size_t(V * C), rng, 0.1f);
  const auto dlogits = RandomValues<T>(size_t(N * Vp), rng);
  DeviceBuffer<T> dinp_x(ToElements<T>(inp)), dw(ToElements<T>(weight)), dlog(N * Vp), dgrad(ToElements<T>(dlogits));
  DeviceBuffer<float> ddinp(N * C), ddw(std::vector<float>(size_t(V * C), 0.5f));
  cuda::BlasContext blas;
  for (int64_t row0 = 0, p = 0; row0 < V; row0 += part_rows, ++p) {
    const int64_t rows = std::min(part_rows, V - row0);
    cuda::GemmTo<T, T>(blas, false, true, N, rows, C, 1.0f, dinp_x.get(), C, dw.get() + row0 * C, C, 0.0f,
                       dlog.get() + row0, Vp, kStream);
    cuda::GemmTo<T, float>(blas, false, false, N, C, rows, 1.0f, dgrad.get() + row0, Vp, dw.get() + row0 * C, C,
                           p > 0 ? 1.0f : 0.0f, ddinp.get(), C, kStream);
    cuda::GemmTo<T, float>(blas, true, false, rows, C, N, 1.0f, dgrad.get() + row0, Vp, dinp_x.get(), C, 1.0f,
                           ddw.get() + row0 * C, C, kStream);
  }
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> logits(size_t(N * V)), dx(size_t(N * C)), dweight(size_t(V * C), 0.5f), packed(size_t(N * V));
  cpu::Gemm(false, true, N, V, C, 1.0f, inp.data(), C, weight.data(), C, 0.0f, logits.data(), V);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < V; ++j) packed[size_t(n * V + j)] = dlogits[size_t(n * Vp + j)];
  }
  cpu::Gemm(false, false, N, C, V, 1.0f, packed.data(), V, weight.data(), C, 0.0f, dx.data(), C);
  cpu::Gemm(true, false, V, C, N, 1.0f, packed.data(), V, inp.data(), C, 1.0f, dweight.data(), C);
  const auto got = ToFloats(dlog.Download());
  std::vector<float> got_logits(size_t(N * V));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < V; ++j) got_logits[size_t(n * V + j)] = got[size_t(n * Vp + j)];
  }
  EXPECT_TRUE(AllClose(got_logits, logits, Element<T>::kTolerance)) << "logits";
  EXPECT_TRUE(AllClose(ddinp.Download(), dx, 1e-4)) << "dinp (fp32, the parts summed)";
  EXPECT_TRUE(AllClose(ddw.Download(), dweight, 1e-4)) << "dweight";
}

}  // namespace
}  // namespace pstar::test
