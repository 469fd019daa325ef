// LayerNorm against the CPU kernels, forward (output, mean, rstd) and backward
// (accumulating dinp, dweight, dbias), at row lengths below, at and above one
// warp's width and row counts that leave the last block of rows and the last
// group of the column sums partial; and the backward pass's determinism.
#include "kernels/cuda/layernorm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/layernorm.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;

struct Shape {
  int64_t N, C;
};
constexpr Shape kShapes[] = {{1, 1}, {3, 7}, {5, 32}, {9, 33}, {40, 768}, {17, 1000}, {2, 2049}, {8197, 65}};

// Inputs with a non-zero mean and a spread, weights near one: as in a model.
template <typename T>
std::vector<float> Shifted(size_t n, std::mt19937& rng, float shift, float scale) {
  std::vector<float> v = RandomValues<T>(n, rng, scale);
  for (float& x : v) x += shift;
  return ToFloats(ToElements<T>(v));  // exact in T again
}

template <typename T>
class CudaLayerNormTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaLayerNormTest, ElementTypes, ElementName);

TYPED_TEST(CudaLayerNormTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(51);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto x = Shifted<T>(size_t(s.N * s.C), rng, 0.3f, 2.0f);
    const auto w = Shifted<T>(size_t(s.C), rng, 1.0f, 0.2f);
    const auto b = RandomValues<T>(size_t(s.C), rng, 0.2f);
    DeviceBuffer<T> dx(ToElements<T>(x)), dw(ToElements<T>(w)), db(ToElements<T>(b)), dout(s.N * s.C);
    DeviceBuffer<float> dmean(s.N), drstd(s.N);
    cuda::LayerNormForward<T>(dout.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), s.N, s.C,
                              kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> out(size_t(s.N * s.C)), mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.N, s.C);
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), out, Element<T>::kTolerance)) << "out";
    // The statistics are fp32 whatever T, from the same (rounded) inputs.
    EXPECT_TRUE(AllClose(dmean.Download(), mean, 1e-5)) << "mean";
    EXPECT_TRUE(AllClose(drstd.Download(), rstd, 1e-5)) << "rstd";
  }
}

// The residual add fused in front of the LayerNorm: res and the normalized
// output against the CPU's fused kernel. In 16 bits res is rounded before the
// statistics (the CPU keeps it in fp32), so those compare at T's tolerance.
TYPED_TEST(CudaLayerNormTest, ResidualFusedForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(52);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto a = Shifted<T>(size_t(s.N * s.C), rng, 0.3f, 2.0f);
    const auto b = Shifted<T>(size_t(s.N * s.C), rng, -0.1f, 1.0f);
    const auto w = Shifted<T>(size_t(s.C), rng, 1.0f, 0.2f);
    const auto bias = RandomValues<T>(size_t(s.C), rng, 0.2f);
    DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dw(ToElements<T>(w)), dbias(ToElements<T>(bias));
    DeviceBuffer<T> dres(s.N * s.C), dout(s.N * s.C);
    DeviceBuffer<float> dmean(s.N), drstd(s.N);
    cuda::ResidualLayerNormForward<T>(dres.get(), dout.get(), dmean.get(), drstd.get(), da.get(), db.get(), dw.get(),
                                      dbias.get(), s.N, s.C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> res(size_t(s.N * s.C)), out(size_t(s.N * s.C)), mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::ResidualLayerNormForward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                  bias.data(), s.N, s.C);
    const double tol = Element<T>::kTolerance;
    EXPECT_TRUE(AllClose(ToFloats(dres.Download()), res, tol)) << "res";
    EXPECT_TRUE(AllClose(ToFloats(dout.Download()), out, tol)) << "out";
    EXPECT_TRUE(AllClose(dmean.Download(), mean, tol)) << "mean";
    EXPECT_TRUE(AllClose(drstd.Download(), rstd, tol)) << "rstd";
  }
}

struct Grads {
  std::vector<float> dinp, dweight, dbias;
};

// The inputs of one backward pass, mean and rstd from the CPU forward pass.
struct BackwardCase {
  Shape s;
  std::vector<float> x, w, b, dout, mean, rstd;
  Grads start;  // non-zero: the pass accumulates

  template <typename T>
  static BackwardCase Make(const Shape& s, std::mt19937& rng) {
    BackwardCase c{s, {}, {}, {}, {}, {}, {}, {}};
    c.x = Shifted<T>(size_t(s.N * s.C), rng, -0.2f, 1.5f);
    c.w = Shifted<T>(size_t(s.C), rng, 1.0f, 0.2f);
    c.b = RandomValues<T>(size_t(s.C), rng, 0.2f);
    c.dout = RandomValues<T>(size_t(s.N * s.C), rng);
    c.start = {RandomValues<T>(size_t(s.N * s.C), rng, 0.1f), RandomValues<T>(size_t(s.C), rng),
               RandomValues<T>(size_t(s.C), rng)};
    std::vector<float> out(size_t(s.N * s.C));
    c.mean.resize(size_t(s.N));
    c.rstd.resize(size_t(s.N));
    cpu::LayerNormForward(out.data(), c.mean.data(), c.rstd.data(), c.x.data(), c.w.data(), c.b.data(), s.N, s.C);
    return c;
  }
};

constexpr cuda::LayerNormKernel kKernels[] = {cuda::LayerNormKernel::kScalar, cuda::LayerNormKernel::kVector};

template <typename T>
void RunBackward(const BackwardCase& c, Grads& got, cuda::LayerNormKernel kernel) {
  const Shape& s = c.s;
  DeviceBuffer<T> dx(ToElements<T>(c.x)), dw(ToElements<T>(c.w)), ddout(ToElements<T>(c.dout));
  DeviceBuffer<T> ddinp(ToElements<T>(c.start.dinp)), ddw(ToElements<T>(c.start.dweight)),
      ddb(ToElements<T>(c.start.dbias));
  DeviceBuffer<float> dmean(c.mean), drstd(c.rstd), scratch(cuda::LayerNormBackwardScratchElements(s.N, s.C));
  cuda::LayerNormBackward<T>(ddinp.get(), ddw.get(), ddb.get(), scratch.get(), ddout.get(), dx.get(), dw.get(),
                             dmean.get(), drstd.get(), s.N, s.C, kStream, static_cast<T*>(nullptr), kernel);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  // The vector kernel takes every row length that is a multiple of 8 here.
  EXPECT_EQ(cuda::LayerNormBackwardTakesVectors(ddinp.get(), nullptr, ddout.get(), dx.get(), dw.get(), s.C),
            s.C % 8 == 0);
  got = {ToFloats(ddinp.Download()), ToFloats(ddw.Download()), ToFloats(ddb.Download())};
}

TYPED_TEST(CudaLayerNormTest, BackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(52);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const BackwardCase c = BackwardCase::Make<T>(s, rng);
    Grads want = c.start;
    cpu::LayerNormBackward(want.dinp.data(), want.dweight.data(), want.dbias.data(), c.dout.data(), c.x.data(),
                           c.w.data(), c.mean.data(), c.rstd.data(), s.N, s.C);
    for (const cuda::LayerNormKernel kernel : kKernels) {
      SCOPED_TRACE(int(kernel));
      Grads got;
      ASSERT_NO_FATAL_FAILURE(RunBackward<T>(c, got, kernel));
      EXPECT_TRUE(AllClose(got.dinp, want.dinp, Element<T>::kTolerance)) << "dinp";
      EXPECT_TRUE(AllClose(got.dweight, want.dweight, Element<T>::kTolerance)) << "dweight";
      EXPECT_TRUE(AllClose(got.dbias, want.dbias, Element<T>::kTolerance)) << "dbias";
    }
  }
}

::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return ::testing::AssertionFailure() << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TYPED_TEST(CudaLayerNormTest, BackwardIsDeterministic) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(53);
  const BackwardCase c = BackwardCase::Make<T>({12289, 96}, rng);
  for (const cuda::LayerNormKernel kernel : kKernels) {
    SCOPED_TRACE(int(kernel));
    Grads first, second;
    ASSERT_NO_FATAL_FAILURE(RunBackward<T>(c, first, kernel));
    ASSERT_NO_FATAL_FAILURE(RunBackward<T>(c, second, kernel));
    EXPECT_TRUE(SameBits(first.dinp, second.dinp)) << "dinp";
    EXPECT_TRUE(SameBits(first.dweight, second.dweight)) << "dweight";
    EXPECT_TRUE(SameBits(first.dbias, second.dbias)) << "dbias";
  }
}

}  // namespace
}  // namespace pstar::test

namespace pstar::test {
namespace {

// A 16-bit run's backward: fp32 dinp (accumulated), weight and bias
// gradients; 16-bit dout and inp read widened; and dinp's new values rounded
// to 16 bits into the copy, in the same pass.
template <typename H>
void CheckSixteenBitGradients() {
  std::mt19937 rng(54);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const BackwardCase c = BackwardCase::Make<H>(s, rng);
    Grads want = c.start;
    cpu::LayerNormBackward(want.dinp.data(), want.dweight.data(), want.dbias.data(), c.dout.data(), c.x.data(),
                           c.w.data(), c.mean.data(), c.rstd.data(), s.N, s.C);
    for (const cuda::LayerNormKernel kernel : kKernels) {
      SCOPED_TRACE(int(kernel));
      DeviceBuffer<H> dx(ToElements<H>(c.x)), ddout(ToElements<H>(c.dout)), dcopy(s.N * s.C);
      DeviceBuffer<float> dw(c.w), ddinp(c.start.dinp), ddw(c.start.dweight), ddb(c.start.dbias), dmean(c.mean),
          drstd(c.rstd), scratch(cuda::LayerNormBackwardScratchElements(s.N, s.C));
      cuda::LayerNormBackward<float, H, H>(ddinp.get(), ddw.get(), ddb.get(), scratch.get(), ddout.get(), dx.get(),
                                           dw.get(), dmean.get(), drstd.get(), s.N, s.C, kStream, dcopy.get(), kernel);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      const std::vector<float> dinp = ddinp.Download();
      EXPECT_TRUE(AllClose(dinp, want.dinp, Element<float>::kTolerance)) << "dinp";
      EXPECT_TRUE(AllClose(ddw.Download(), want.dweight, Element<float>::kTolerance)) << "dweight";
      EXPECT_TRUE(AllClose(ddb.Download(), want.dbias, Element<float>::kTolerance)) << "dbias";
      EXPECT_EQ(ToFloats(dcopy.Download()), ToFloats(ToElements<H>(dinp))) << "the copy is dinp rounded";
    }
  }
}

TEST(CudaLayerNormSixteenBitGradients, Bf16DoutAndCopyMatchTheCpu) {
  PSTAR_REQUIRE_GPU();
  CheckSixteenBitGradients<cuda::bf16>();
}

TEST(CudaLayerNormSixteenBitGradients, Fp16DoutAndCopyMatchTheCpu) {
  PSTAR_REQUIRE_GPU();
  CheckSixteenBitGradients<cuda::fp16>();
}

}  // namespace
}  // namespace pstar::test
