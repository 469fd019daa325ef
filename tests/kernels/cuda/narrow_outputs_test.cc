// The GPU kernels a 16-bit run uses to keep linear layers' inputs in 16 bits:
// fp32 inputs, bf16/fp16 outputs (LayerNorm, residual + LayerNorm, GELU,
// attention, and attention's backward reading that output), each against its
// CPU twin's 16-bit variant. The GPU's LayerNorm statistics are fp32 (the
// CPU's double), so outputs may differ by one rounding step: compared at the
// 16-bit tolerance, not bit for bit.
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
#include "kernels/layernorm.h"
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

TYPED_TEST(CudaNarrowOutputsTest, LayerNormAndResidualLayerNorm) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  std::mt19937 rng(71);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {9, 33}, {40, 768}, {257, 1000}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    const auto a = RandomValues<float>(static_cast<size_t>(N * C), rng, 2.0f), b = RandomValues<float>(static_cast<size_t>(N * C), rng);
    const auto w = RandomValues<float>(static_cast<size_t>(C), rng), bias = RandomValues<float>(static_cast<size_t>(C), rng);
    DeviceBuffer<float> da(a), db(b), dw(w), dbias(bias), dres(N * C), dmean(N), drstd(N);
    DeviceBuffer<O> dout(N * C), dres_out(N * C);
    cuda::LayerNormForward<float, O>(dout.get(), dmean.get(), drstd.get(), da.get(), dw.get(), dbias.get(), N, C,
                                     kStream);
    cuda::ResidualLayerNormForward<float, O>(dres.get(), dres_out.get(), dmean.get(), drstd.get(), da.get(),
                                             db.get(), dw.get(), dbias.get(), N, C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<uint16_t> out(static_cast<size_t>(N * C)), res_out(static_cast<size_t>(N * C));
    std::vector<float> res(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    cpu::LayerNormForward(out.data(), TestFixture::kBf16, mean.data(), rstd.data(), a.data(), w.data(), bias.data(),
                          N, C);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), TestFixture::Wide(out), Element<O>::kTolerance)) << "out";
    cpu::ResidualLayerNormForward(res.data(), res_out.data(), TestFixture::kBf16, mean.data(), rstd.data(), a.data(),
                                  b.data(), w.data(), bias.data(), N, C);
    EXPECT_EQ(dres.Download(), res) << "res = a + b in fp32, one rounding";
    EXPECT_TRUE(AllClose(ToFloats(dres_out.Download()), TestFixture::Wide(res_out), Element<O>::kTolerance));
  }
}

TYPED_TEST(CudaNarrowOutputsTest, Gelu) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  std::mt19937 rng(72);
  for (int64_t n : {1, 7, 8, 4099}) {
    const auto x = RandomValues<float>(static_cast<size_t>(n), rng, 3.0f);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<O> dout(n);
    cuda::GeluForward(dout.get(), dx.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<uint16_t> want(static_cast<size_t>(n));
    cpu::GeluForward(want.data(), TestFixture::kBf16, x.data(), n);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), TestFixture::Wide(want), Element<O>::kTolerance)) << n;
  }
}

TYPED_TEST(CudaNarrowOutputsTest, AttentionForwardAndBackward) {
  PSTAR_REQUIRE_GPU();
  using O = TypeParam;
  std::mt19937 rng(73);
  struct Shape {
    int64_t B, T, NH, hs;
  };
  for (const Shape& s : {Shape{1, 1, 1, 1}, Shape{2, 70, 2, 32}, Shape{1, 129, 3, 64}}) {
    const int64_t C = s.NH * s.hs;
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hs=" << s.hs);
    const auto qkv = RandomValues<float>(static_cast<size_t>(s.B * s.T * 3 * C), rng);
    const auto dy = RandomValues<float>(static_cast<size_t>(s.B * s.T * C), rng);
    DeviceBuffer<float> dqkv_in(qkv), ddy(dy), dlse(s.B * s.NH * s.T), ddqkv(s.B * s.T * 3 * C);
    DeviceBuffer<float> scratch(cuda::AttentionScratchElements(s.B, s.T, C, s.NH));
    DeviceBuffer<O> dout(s.B * s.T * C);
    cuda::AttentionForward<float, O>(dout.get(), dlse.get(), dqkv_in.get(), s.B, s.T, C, s.NH, kStream);
    cuda::AttentionBackward<float, O>(ddqkv.get(), scratch.get(), ddy.get(), dqkv_in.get(), dout.get(), dlse.get(),
                                      s.B, s.T, C, s.NH, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<uint16_t> out(static_cast<size_t>(s.B * s.T * C));
    std::vector<float> lse(static_cast<size_t>(s.B * s.NH * s.T)), dqkv(qkv.size());
    cpu::AttentionForward(out.data(), TestFixture::kBf16, lse.data(), qkv.data(), s.B, s.T, C, s.NH);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), TestFixture::Wide(out), Element<O>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(dlse.Download(), lse, 1e-5)) << "lse";
    cpu::AttentionBackward(dqkv.data(), dy.data(), qkv.data(), out.data(), TestFixture::kBf16, lse.data(), s.B, s.T,
                           C, s.NH);
    EXPECT_TRUE(AllClose(ddqkv.Download(), dqkv, Element<O>::kTolerance)) << "dqkv";
  }
}

}  // namespace
}  // namespace pstar::test
