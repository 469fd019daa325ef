// The GPU kernels of a 16-bit run's mixed forms (16-bit activations beside
// fp32 projections and gradients), each against its CPU twin's 16-bit
// variant: the residual stream (16-bit residual + fp32 projection, the fused
// LayerNorm after it, LayerNorm's backward over the 16-bit stream), GELU's
// backward over the 16-bit pre-activation, and attention's backward over its
// 16-bit qkv and output (on the tensor cores where the head size is a
// multiple of 16, dout, P and dS rounded to 16 bits for the products, so at
// the 16-bit tolerance). Sums of one add are compared bit for bit; the GPU's
// LayerNorm statistics are fp32 (the CPU's double), so normalized outputs may
// differ by one rounding step and are compared at the 16-bit tolerance.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/pointwise.h"
#include "kernels/gelu.h"
#include "kernels/half.h"
#include "kernels/layernorm.h"
#include "kernels/residual.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;

template <typename O>
class CudaNarrowOutputsTest : public ::testing::Test {
 protected:
  static constexpr bool kBf16 = std::is_same_v<O, bf16>;
  // The CPU variant's 16 bits, as floats.
  static std::vector<float> Wide(const std::vector<uint16_t>& h) {
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = kBf16 ? kernels::BFloat16ToFloat(h[i]) : kernels::HalfToFloat(h[i]);
    return out;
  }
};
using SixteenBitTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudaNarrowOutputsTest, SixteenBitTypes, ElementName);

// The residual stream: a 16-bit, b fp32, res and out 16-bit; then the
// backward pass over the 16-bit res with fp32 gradients; and the plain
// residual add.
TYPED_TEST(CudaNarrowOutputsTest, ResidualStream) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  constexpr bool kBf16 = TestFixture::kBf16;
  std::mt19937 rng(71);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {9, 33}, {40, 768}, {257, 1000}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    const auto a = RandomValues<O>(static_cast<size_t>(N * C), rng, 2.0f);  // exact in O
    const auto b = RandomValues<float>(static_cast<size_t>(N * C), rng);
    const auto w = RandomValues<O>(static_cast<size_t>(C), rng), bias = RandomValues<O>(static_cast<size_t>(C), rng);
    const auto dy = RandomValues<float>(static_cast<size_t>(N * C), rng);
    DeviceBuffer<O> da(ToElements<O>(a)), dw16(ToElements<O>(w)), dbias16(ToElements<O>(bias));
    DeviceBuffer<O> dres(N * C), dout(N * C), dsum(N * C);
    DeviceBuffer<float> db(b), dw(w), dmean(N), drstd(N), ddy(dy);
    DeviceBuffer<float> ddinp(N * C), ddw(C), ddb(C), scratch(cuda::LayerNormBackwardScratchElements(N, C));
    cudaMemset(ddinp.get(), 0, static_cast<size_t>(N * C) * sizeof(float));
    cudaMemset(ddw.get(), 0, static_cast<size_t>(C) * sizeof(float));
    cudaMemset(ddb.get(), 0, static_cast<size_t>(C) * sizeof(float));
    cuda::ResidualLayerNormForward(dres.get(), dout.get(), dmean.get(), drstd.get(), da.get(), db.get(), dw16.get(),
                                   dbias16.get(), N, C, kStream);
    cuda::LayerNormBackward(ddinp.get(), ddw.get(), ddb.get(), scratch.get(), ddy.get(), dres.get(), dw.get(),
                            dmean.get(), drstd.get(), N, C, kStream);
    cuda::ResidualForward(dsum.get(), da.get(), db.get(), N * C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());

    auto narrow = [&](const std::vector<float>& v) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = kBf16 ? kernels::FloatToBFloat16(v[i]) : kernels::FloatToHalf(v[i]);
      return h;
    };
    const auto a16 = narrow(a);
    std::vector<uint16_t> res(static_cast<size_t>(N * C)), out(static_cast<size_t>(N * C)), sum(static_cast<size_t>(N * C));
    std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)), dinp(static_cast<size_t>(N * C)), dwt(static_cast<size_t>(C)), dbt(static_cast<size_t>(C));
    cpu::ResidualLayerNormForward(res.data(), out.data(), mean.data(), rstd.data(), a16.data(), b.data(), kBf16,
                                  w.data(), bias.data(), N, C);
    cpu::ResidualForward(sum.data(), a16.data(), b.data(), kBf16, N * C);
    EXPECT_EQ(narrow(ToFloats(dres.Download())), res) << "res: one fp32 add, one rounding";
    EXPECT_EQ(narrow(ToFloats(dsum.Download())), sum) << "residual add: one fp32 add, one rounding";
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), TestFixture::Wide(out), Element<O>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(dmean.Download(), mean, 1e-5)) << "mean";
    EXPECT_TRUE(AllClose(drstd.Download(), rstd, 1e-5)) << "rstd";
    // Backward over the GPU's own statistics, so only the sums' order differs.
    const auto gmean = dmean.Download(), grstd = drstd.Download();
    cpu::LayerNormBackward(dinp.data(), dwt.data(), dbt.data(), dy.data(), res.data(), kBf16, w.data(), gmean.data(),
                           grstd.data(), N, C);
    EXPECT_TRUE(AllClose(ddinp.Download(), dinp, 1e-4)) << "dinp";
    EXPECT_TRUE(AllClose(ddw.Download(), dwt, 1e-4)) << "dweight";
    EXPECT_TRUE(AllClose(ddb.Download(), dbt, 1e-4)) << "dbias";
  }
}

// GELU's backward over the 16-bit pre-activation with fp32 gradients, in
// place as the model runs it.
TYPED_TEST(CudaNarrowOutputsTest, GeluBackward) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  std::mt19937 rng(72);
  for (int64_t n : {1, 7, 8, 4099}) {
    const auto x = RandomValues<O>(static_cast<size_t>(n), rng, 3.0f);  // exact in O
    const auto dy = RandomValues<float>(static_cast<size_t>(n), rng);
    DeviceBuffer<O> dx(ToElements<O>(x));
    DeviceBuffer<float> ddy(dy);
    cuda::GeluBackward(ddy.get(), dx.get(), ddy.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> want(static_cast<size_t>(n));
    cpu::GeluBackward(want.data(), x.data(), dy.data(), n);  // x is exact in O: the widened input
    EXPECT_TRUE(AllClose(ddy.Download(), want, 1e-5)) << n;
  }
}

// The all-16-bit forward, then the backward over its 16-bit qkv and output
// with fp32 gradients, against the CPU's 16-bit variants.
TYPED_TEST(CudaNarrowOutputsTest, AttentionForwardAndBackward) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  constexpr bool kBf16 = TestFixture::kBf16;
  std::mt19937 rng(73);
  struct Shape {
    int64_t B, T, NH, hs;
  };
  // Head sizes off and on the tensor cores' multiple of 16, over several blocks.
  for (const Shape& s : {Shape{1, 1, 1, 1}, Shape{2, 70, 2, 32}, Shape{1, 129, 3, 64}, Shape{1, 200, 2, 128},
                         Shape{2, 65, 1, 48}, Shape{1, 90, 2, 24}}) {
    const int64_t C = s.NH * s.hs;
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hs=" << s.hs);
    const auto qkv = RandomValues<O>(static_cast<size_t>(s.B * s.T * 3 * C), rng);  // exact in O
    const auto dy = RandomValues<float>(static_cast<size_t>(s.B * s.T * C), rng);
    DeviceBuffer<O> dqkv16(ToElements<O>(qkv)), dout(s.B * s.T * C);
    DeviceBuffer<float> ddy(dy), dlse(s.B * s.NH * s.T), ddqkv(s.B * s.T * 3 * C);
    const kernels::AttentionShape shape = {s.B, s.T, s.NH, s.NH, s.hs};
    DeviceBuffer<float> scratch(cuda::AttentionScratchElements(shape));
    cuda::AttentionForward(dout.get(), dlse.get(), dqkv16.get(), shape, kStream);
    cuda::AttentionBackward(ddqkv.get(), scratch.get(), ddy.get(), dqkv16.get(), dout.get(), dlse.get(), shape,
                            kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<uint16_t> qkv_bits(qkv.size()), out(static_cast<size_t>(s.B * s.T * C));
    for (size_t i = 0; i < qkv.size(); ++i) {
      qkv_bits[i] = kBf16 ? kernels::FloatToBFloat16(qkv[i]) : kernels::FloatToHalf(qkv[i]);
    }
    std::vector<float> lse(static_cast<size_t>(s.B * s.NH * s.T)), dqkv(qkv.size());
    cpu::AttentionForward(out.data(), lse.data(), qkv_bits.data(), kBf16, s.B, s.T, C, s.NH);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), TestFixture::Wide(out), Element<O>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(dlse.Download(), lse, 1e-5)) << "lse";
    cpu::AttentionBackward(dqkv.data(), dy.data(), qkv_bits.data(), out.data(), kBf16, lse.data(), s.B, s.T, C,
                           s.NH);
    EXPECT_TRUE(AllClose(ddqkv.Download(), dqkv, Element<O>::kTolerance)) << "dqkv";
  }
}

}  // namespace
}  // namespace pstar::test
