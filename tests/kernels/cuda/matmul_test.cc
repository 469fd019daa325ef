// The cuBLASLt GEMM and the linear layer against the CPU kernels on random
// inputs, for fp32, bf16 and fp16. 16-bit inputs are rounded on the host
// first, so both sides multiply the same numbers.
#include "kernels/cuda/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;

template <typename T>
class CudaMatmulTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaMatmulTest, ElementTypes, ElementName);

struct GemmShape {
  int64_t M, N, K;
};
constexpr GemmShape kGemmShapes[] = {{7, 33, 13}, {1, 1, 1}, {64, 48, 96}, {5, 130, 257}};

struct LinearShape {
  int64_t N, C, OC;
};
constexpr LinearShape kLinearShapes[] = {{7, 13, 33}, {1, 1, 1}, {64, 96, 160}, {33, 257, 65}};

// The linear layers of real models (N rows of tokens): GPT-2 124M (width 768:
// qkv, fc, proj, the classifier over the padded vocabulary and over the odd
// unpadded one), GPT-2 1.5B (width 1600) and a width-4096 GPT; and one with
// many rows, where dweight and dbias reduce over 2048 of them.
constexpr LinearShape kModelShapes[] = {{64, 768, 2304},  {64, 768, 3072},  {64, 3072, 768},  {64, 768, 50304},
                                        {64, 768, 50257}, {64, 1600, 4800}, {64, 6400, 1600}, {64, 4096, 12288},
                                        {32, 16384, 4096}, {2048, 768, 768}};

// Every combination of transposes, with leading dimensions wider than the
// matrices (the padding must be ignored in A and B and left alone in C).
TYPED_TEST(CudaMatmulTest, GemmMatchesCpuForEveryTransposeAndLeadingDimension) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(11);
  cuda::BlasContext blas;
  for (const GemmShape& s : kGemmShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " trans_a=" << ta
                                        << " trans_b=" << tb);
        const int64_t a_rows = ta ? s.K : s.M, a_cols = ta ? s.M : s.K;
        const int64_t b_rows = tb ? s.N : s.K, b_cols = tb ? s.K : s.N;
        const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = s.N + 2;
        const auto a = RandomValues<T>(size_t(a_rows * lda), rng);
        const auto b = RandomValues<T>(size_t(b_rows * ldb), rng);
        auto c = RandomValues<T>(size_t(s.M * ldc), rng);
        const auto c_before = c;
        const float alpha = 0.75f, beta = -0.5f;
        DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dc(ToElements<T>(c));
        cuda::Gemm<T>(blas, ta, tb, s.M, s.N, s.K, alpha, da.get(), lda, db.get(), ldb, beta, dc.get(), ldc,
                      kStream);
        ASSERT_NO_FATAL_FAILURE(SyncOrFail());
        const auto got = ToFloats(dc.Download());
        cpu::Gemm(ta, tb, s.M, s.N, s.K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        EXPECT_TRUE(AllClose(got, c, Element<T>::kTolerance));
        for (int64_t i = 0; i < s.M; ++i) {
          for (int64_t j = s.N; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], c_before[i * ldc + j]);
        }
      }
    }
  }
}

// beta == 0 overwrites C whatever it held, NaN included.
TYPED_TEST(CudaMatmulTest, GemmWithZeroBetaIgnoresOldC) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(12);
  cuda::BlasContext blas;
  const int64_t M = 9, N = 17, K = 21;
  const auto a = RandomValues<T>(size_t(M * K), rng);
  const auto b = RandomValues<T>(size_t(N * K), rng);
  std::vector<float> c(size_t(M * N), std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dc(ToElements<T>(c));
  cuda::Gemm<T>(blas, false, true, M, N, K, 1.5f, da.get(), K, db.get(), K, 0.0f, dc.get(), N, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::fill(c.begin(), c.end(), 0.0f);
  cpu::Gemm(false, true, M, N, K, 1.5f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
  EXPECT_TRUE(AllClose(ToFloats(dc.Download()), c, Element<T>::kTolerance));
}

// The algorithm is chosen once per GEMM shape and reused: a repeat gives the
// same bits, and another shape is queried and cached on its own.
TYPED_TEST(CudaMatmulTest, AlgorithmsAreCachedPerShapeAndRepeatsGiveTheSameBits) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(13);
  cuda::BlasContext blas;
  const int64_t M = 64, N = 48, K = 96;
  const auto a = RandomValues<T>(size_t(M * K), rng);
  const auto b = RandomValues<T>(size_t(N * K), rng);
  std::vector<float> zeros(size_t(M * N), 0.0f);
  DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dc(ToElements<T>(zeros)), dd(ToElements<T>(zeros));
  EXPECT_EQ(blas.cached_algos(), 0u);
  cuda::Gemm<T>(blas, false, true, M, N, K, 1.0f, da.get(), K, db.get(), K, 0.0f, dc.get(), N, kStream);
  EXPECT_EQ(blas.cached_algos(), 1u);
  cuda::Gemm<T>(blas, false, true, M, N, K, 1.0f, da.get(), K, db.get(), K, 0.0f, dd.get(), N, kStream);
  EXPECT_EQ(blas.cached_algos(), 1u) << "the same shape reuses its algorithm";
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  const auto first = dc.Download(), second = dd.Download();
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(first[0])));
  cuda::Gemm<T>(blas, false, true, M, N / 2, K, 1.0f, da.get(), K, db.get(), K, 0.0f, dc.get(), N, kStream);
  EXPECT_EQ(blas.cached_algos(), 2u) << "another shape queries again";
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
}

TYPED_TEST(CudaMatmulTest, GemmStridedBatchedMatchesCpuPerMatrix) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(13);
  cuda::BlasContext blas;
  for (const GemmShape& s : kGemmShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " trans_a=" << ta
                                        << " trans_b=" << tb);
        const int64_t batch = 3;
        // Tight leading dimensions, strides with a gap between matrices.
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N, ldc = s.N;
        const int64_t stride_a = s.M * s.K + 5, stride_b = s.K * s.N + 2, stride_c = s.M * s.N + 7;
        const auto a = RandomValues<T>(size_t(batch * stride_a), rng);
        const auto b = RandomValues<T>(size_t(batch * stride_b), rng);
        auto c = RandomValues<T>(size_t(batch * stride_c), rng);
        const float alpha = -1.25f, beta = 0.5f;
        DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dc(ToElements<T>(c));
        cuda::GemmStridedBatched<T>(blas, ta, tb, s.M, s.N, s.K, alpha, da.get(), lda, stride_a, db.get(), ldb,
                                    stride_b, beta, dc.get(), ldc, stride_c, batch, kStream);
        ASSERT_NO_FATAL_FAILURE(SyncOrFail());
        for (int64_t i = 0; i < batch; ++i) {
          cpu::Gemm(ta, tb, s.M, s.N, s.K, alpha, a.data() + i * stride_a, lda, b.data() + i * stride_b, ldb, beta,
                    c.data() + i * stride_c, ldc);
        }
        EXPECT_TRUE(AllClose(ToFloats(dc.Download()), c, Element<T>::kTolerance));
      }
    }
  }
}

TYPED_TEST(CudaMatmulTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(14);
  cuda::BlasContext blas;
  for (const LinearShape& s : kLinearShapes) {
    // No bias; an aligned one (cuBLASLt's bias epilogue); one a single
    // element past alignment (written into the output first).
    for (int bias_case : {0, 1, 2}) {
      const bool with_bias = bias_case > 0;
      const int64_t offset = bias_case == 2 ? 1 : 0;
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias case "
                                      << bias_case);
      const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
      const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, 0.5f);
      const auto bias = RandomValues<T>(size_t(s.OC), rng);
      std::vector<float> shifted(size_t(offset), 0.0f);
      shifted.insert(shifted.end(), bias.begin(), bias.end());
      // Garbage in the output: forward overwrites it.
      std::vector<float> y(size_t(s.N * s.OC), std::numeric_limits<float>::quiet_NaN());
      DeviceBuffer<T> dx(ToElements<T>(x)), dw(ToElements<T>(w)), db(ToElements<T>(shifted)), dy(ToElements<T>(y));
      cuda::MatmulForward<T>(blas, dy.get(), dx.get(), dw.get(), with_bias ? db.get() + offset : nullptr, s.N, s.C,
                             s.OC, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      cpu::MatmulForward(y.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, s.N, s.C, s.OC);
      EXPECT_TRUE(AllClose(ToFloats(dy.Download()), y, Element<T>::kTolerance));
    }
  }
}

TYPED_TEST(CudaMatmulTest, BackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(15);
  cuda::BlasContext blas;
  for (const LinearShape& s : kLinearShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
      const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, 0.5f);
      const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
      // dinp is overwritten (NaN must not survive); dweight and dbias accumulate
      // onto what they hold.
      std::vector<float> dx(size_t(s.N * s.C), std::numeric_limits<float>::quiet_NaN());
      auto dw = RandomValues<T>(size_t(s.OC * s.C), rng);
      auto dbias = RandomValues<T>(size_t(s.OC), rng);
      DeviceBuffer<T> d_x(ToElements<T>(x)), d_w(ToElements<T>(w)), d_dy(ToElements<T>(dy));
      DeviceBuffer<T> d_dx(ToElements<T>(dx)), d_dw(ToElements<T>(dw)), d_dbias(ToElements<T>(dbias));
      DeviceBuffer<float> scratch(cuda::BiasGradientScratchElements(s.N, s.OC));
      cuda::MatmulBackward<T>(blas, d_dx.get(), d_dw.get(), with_bias ? d_dbias.get() : nullptr, scratch.get(),
                              d_dy.get(), d_x.get(), d_w.get(), s.N, s.C, s.OC, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      const auto dbias_before = dbias;
      cpu::MatmulBackward(dx.data(), dw.data(), with_bias ? dbias.data() : nullptr, dy.data(), x.data(), w.data(),
                          s.N, s.C, s.OC);
      EXPECT_TRUE(AllClose(ToFloats(d_dx.Download()), dx, Element<T>::kTolerance)) << "dinp";
      EXPECT_TRUE(AllClose(ToFloats(d_dw.Download()), dw, Element<T>::kTolerance)) << "dweight";
      const auto got_dbias = ToFloats(d_dbias.Download());
      if (with_bias) {
        EXPECT_TRUE(AllClose(got_dbias, dbias, Element<T>::kTolerance)) << "dbias";
      } else {
        EXPECT_EQ(got_dbias, dbias_before) << "dbias untouched without a bias";
      }
    }
  }
}

TYPED_TEST(CudaMatmulTest, ForwardAndBackwardMatchCpuAtModelShapes) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(17);
  cuda::BlasContext blas;
  for (const LinearShape& s : kModelShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const float w_scale = 1.0f / std::sqrt(float(s.C));
    const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
    const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, w_scale);
    const auto bias = RandomValues<T>(size_t(s.OC), rng);
    const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
    DeviceBuffer<T> d_x(ToElements<T>(x)), d_w(ToElements<T>(w)), d_bias(ToElements<T>(bias)), d_dy(ToElements<T>(dy));
    DeviceBuffer<T> d_y(s.N * s.OC), d_dx(s.N * s.C);
    DeviceBuffer<T> d_dw(ToElements<T>(std::vector<float>(size_t(s.OC * s.C), 0.0f)));
    DeviceBuffer<T> d_dbias(ToElements<T>(std::vector<float>(size_t(s.OC), 0.0f)));
    cuda::MatmulForward<T>(blas, d_y.get(), d_x.get(), d_w.get(), d_bias.get(), s.N, s.C, s.OC, kStream);
    DeviceBuffer<float> scratch(cuda::BiasGradientScratchElements(s.N, s.OC));
    cuda::MatmulBackward<T>(blas, d_dx.get(), d_dw.get(), d_dbias.get(), scratch.get(), d_dy.get(), d_x.get(),
                            d_w.get(), s.N, s.C, s.OC, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> y(size_t(s.N * s.OC)), dx(size_t(s.N * s.C)), dw(size_t(s.OC * s.C), 0.0f),
        dbias(size_t(s.OC), 0.0f);
    cpu::MatmulForward(y.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC);
    cpu::MatmulBackward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), s.N, s.C, s.OC);
    EXPECT_TRUE(AllClose(ToFloats(d_y.Download()), y, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(ToFloats(d_dx.Download()), dx, Element<T>::kTolerance)) << "dinp";
    EXPECT_TRUE(AllClose(ToFloats(d_dw.Download()), dw, Element<T>::kTolerance)) << "dweight";
    EXPECT_TRUE(AllClose(ToFloats(d_dbias.Download()), dbias, Element<T>::kTolerance)) << "dbias";
  }
}

// Two runs on the same inputs give the same bits, at a size where cuBLASLt
// may split the reduction and the bias sums span many rows.
TYPED_TEST(CudaMatmulTest, BackwardIsDeterministic) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(16);
  cuda::BlasContext blas;
  const int64_t N = 1024, C = 192, OC = 320;
  const auto x = ToElements<T>(RandomValues<T>(size_t(N * C), rng));
  const auto w = ToElements<T>(RandomValues<T>(size_t(OC * C), rng));
  const auto dy = ToElements<T>(RandomValues<T>(size_t(N * OC), rng));
  const auto dw0 = ToElements<T>(RandomValues<T>(size_t(OC * C), rng));
  const auto dbias0 = ToElements<T>(RandomValues<T>(size_t(OC), rng));
  DeviceBuffer<T> d_x(x), d_w(w), d_dy(dy);
  DeviceBuffer<float> scratch(cuda::BiasGradientScratchElements(N, OC));
  std::vector<T> results[2][3];
  for (auto& run : results) {
    DeviceBuffer<T> d_dx(N * C), d_dw(dw0), d_dbias(dbias0);
    cuda::MatmulBackward<T>(blas, d_dx.get(), d_dw.get(), d_dbias.get(), scratch.get(), d_dy.get(), d_x.get(),
                            d_w.get(), N, C, OC, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    run[0] = d_dx.Download();
    run[1] = d_dw.Download();
    run[2] = d_dbias.Download();
  }
  const char* names[3] = {"dinp", "dweight", "dbias"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(results[0][i].size(), results[1][i].size());
    EXPECT_EQ(std::memcmp(results[0][i].data(), results[1][i].data(), results[0][i].size() * sizeof(T)), 0)
        << names[i] << " differs between runs";
  }
  // And the run did something: dweight moved off its starting value.
  EXPECT_NE(std::memcmp(results[0][1].data(), dw0.data(), dw0.size() * sizeof(T)), 0);
}

// The bias gradient over the whole grid: row groups with a ragged last one,
// many columns and few, against a double-precision column sum; the same
// bits on a second run.
TYPED_TEST(CudaMatmulTest, BiasGradientSumsEveryRowInAFixedOrder) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(34);
  for (const auto& [N, OC] : {std::pair<int64_t, int64_t>{40001, 768}, {65, 3}, {1, 50}, {16384, 2304}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " OC=" << OC);
    const auto dy = RandomValues<T>(size_t(N * OC), rng);
    const auto start = RandomValues<float>(size_t(OC), rng);
    DeviceBuffer<T> d_dy(ToElements<T>(dy));
    DeviceBuffer<float> scratch(cuda::BiasGradientScratchElements(N, OC));
    std::vector<float> runs[2];
    for (auto& run : runs) {
      DeviceBuffer<float> d_dbias(start);
      cuda::AddBiasGradient<float, T>(d_dbias.get(), scratch.get(), d_dy.get(), N, OC, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      run = d_dbias.Download();
    }
    EXPECT_EQ(runs[0], runs[1]) << "the same bits every run";
    std::vector<double> want(start.begin(), start.end());
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < OC; ++j) want[size_t(j)] += dy[size_t(n * OC + j)];
    }
    for (int64_t j = 0; j < OC; ++j) {
      // fp32 sums of N terms of unit size: a few ulps of the running sum each.
      ASSERT_NEAR(runs[0][size_t(j)], want[size_t(j)], 1e-5 * std::sqrt(double(N)) * 4 + 1e-5) << "column " << j;
    }
  }
}

// The mixed-precision linear layer: 16-bit operands, fp32 accumulation and
// fp32 outputs, bias and gradients, against the CPU kernel on the same
// (rounded) operands. fp32 outputs are compared at fp32's tolerance.
template <typename T>
class CudaMixedMatmulTest : public ::testing::Test {};
using LowTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudaMixedMatmulTest, LowTypes, ElementName);

TYPED_TEST(CudaMixedMatmulTest, ForwardMatchesCpuOnTheRoundedOperands) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(31);
  cuda::BlasContext blas;
  for (const LinearShape& s : kLinearShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
      const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, 0.5f);
      const auto bias = RandomValues<float>(size_t(s.OC), rng);
      DeviceBuffer<T> d_x(ToElements<T>(x)), d_w(ToElements<T>(w));
      DeviceBuffer<float> d_bias(bias), d_out(std::vector<float>(size_t(s.N * s.OC), 7.0f));
      cuda::MatmulForwardMixed<T>(blas, d_out.get(), d_x.get(), d_w.get(), with_bias ? d_bias.get() : nullptr, s.N,
                                  s.C, s.OC, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      std::vector<float> want(size_t(s.N * s.OC));
      cpu::MatmulForward(want.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, s.N, s.C, s.OC);
      EXPECT_TRUE(AllClose(d_out.Download(), want, Element<float>::kTolerance));
    }
  }
}

// A 16-bit run's backward, as the model runs it in pieces: dout and dinp in
// T (dinp = the GEMM's fp32 accumulator rounded once), the weight and bias
// gradients fp32 and accumulating, the bias gradient summing the 16-bit
// dout.
TYPED_TEST(CudaMixedMatmulTest, BackwardPiecesMatchCpuOnTheRoundedOperands) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(32);
  cuda::BlasContext blas;
  for (const LinearShape& s : kLinearShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
    const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, 0.5f);
    const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
    std::vector<float> dx(size_t(s.N * s.C), std::numeric_limits<float>::quiet_NaN());
    auto dw = RandomValues<float>(size_t(s.OC * s.C), rng);
    auto dbias = RandomValues<float>(size_t(s.OC), rng);
    DeviceBuffer<T> d_x(ToElements<T>(x)), d_w(ToElements<T>(w)), d_dy(ToElements<T>(dy)), d_dx(ToElements<T>(dx));
    DeviceBuffer<float> d_dw(dw), d_dbias(dbias), scratch(cuda::BiasGradientScratchElements(s.N, s.OC));
    cuda::MatmulBackwardInput<T, T>(blas, d_dx.get(), d_dy.get(), d_w.get(), s.N, s.C, s.OC, kStream);
    cuda::MatmulBackwardWeight<T, float>(blas, d_dw.get(), d_dy.get(), d_x.get(), s.N, s.C, s.OC, kStream);
    cuda::AddBiasGradient<float, T>(d_dbias.get(), scratch.get(), d_dy.get(), s.N, s.OC, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::MatmulBackward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), s.N, s.C, s.OC);
    EXPECT_TRUE(AllClose(ToFloats(d_dx.Download()), dx, Element<T>::kTolerance)) << "dinp";
    EXPECT_TRUE(AllClose(d_dw.Download(), dw, Element<float>::kTolerance)) << "dweight";
    EXPECT_TRUE(AllClose(d_dbias.Download(), dbias, Element<float>::kTolerance)) << "dbias (16-bit dout)";
  }
}

// bf16/fp16 operands to fp32 outputs at the real models' shapes.
TYPED_TEST(CudaMixedMatmulTest, ForwardAndBackwardMatchCpuAtModelShapes) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(33);
  cuda::BlasContext blas;
  for (const LinearShape& s : kModelShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
    const auto w = RandomValues<T>(size_t(s.OC * s.C), rng, 1.0f / std::sqrt(float(s.C)));
    const auto bias = RandomValues<float>(size_t(s.OC), rng);
    const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
    DeviceBuffer<T> d_x(ToElements<T>(x)), d_w(ToElements<T>(w)), d_dy(ToElements<T>(dy)), d_dx(s.N * s.C);
    DeviceBuffer<float> d_bias(bias), d_out(s.N * s.OC);
    DeviceBuffer<float> d_dw(std::vector<float>(size_t(s.OC * s.C), 0.0f)), d_dbias(std::vector<float>(size_t(s.OC), 0.0f));
    DeviceBuffer<float> scratch(cuda::BiasGradientScratchElements(s.N, s.OC));
    cuda::MatmulForwardMixed<T>(blas, d_out.get(), d_x.get(), d_w.get(), d_bias.get(), s.N, s.C, s.OC, kStream);
    cuda::MatmulBackwardInput<T, T>(blas, d_dx.get(), d_dy.get(), d_w.get(), s.N, s.C, s.OC, kStream);
    cuda::MatmulBackwardWeight<T, float>(blas, d_dw.get(), d_dy.get(), d_x.get(), s.N, s.C, s.OC, kStream);
    cuda::AddBiasGradient<float, T>(d_dbias.get(), scratch.get(), d_dy.get(), s.N, s.OC, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> out(size_t(s.N * s.OC)), dx(size_t(s.N * s.C)), dw(size_t(s.OC * s.C), 0.0f),
        dbias(size_t(s.OC), 0.0f);
    cpu::MatmulForward(out.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC);
    cpu::MatmulBackward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), s.N, s.C, s.OC);
    EXPECT_TRUE(AllClose(d_out.Download(), out, Element<float>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(ToFloats(d_dx.Download()), dx, Element<T>::kTolerance)) << "dinp";
    EXPECT_TRUE(AllClose(d_dw.Download(), dw, Element<float>::kTolerance)) << "dweight";
    EXPECT_TRUE(AllClose(d_dbias.Download(), dbias, Element<float>::kTolerance)) << "dbias";
  }
}

// The weight gradient through each of cuBLASLt's heuristic's first four
// candidates (the tuning's weight_grad_gemm_algo), plain and with the bias
// gradient in the epilogue, at GPT-2 124M's layer shapes with many rows and
// at small ones: each matches the CPU on the rounded operands and repeats
// its bits.
TYPED_TEST(CudaMixedMatmulTest, EveryWeightGradientAlgorithmRankMatchesCpuAndRepeats) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(36);
  constexpr LinearShape kShapes[] = {{4096, 768, 2304}, {4096, 768, 768}, {4096, 3072, 768}, {64, 96, 160}};
  for (const LinearShape& s : kShapes) {
    const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
    const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
    const auto start = RandomValues<float>(size_t(s.OC * s.C), rng);
    std::vector<float> dw = start, dbias(size_t(s.OC), 0.0f), dx(size_t(s.N * s.C));
    const std::vector<float> w(size_t(s.OC * s.C), 0.0f);
    cpu::MatmulBackward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), s.N, s.C, s.OC);
    DeviceBuffer<T> d_x(ToElements<T>(x)), d_dy(ToElements<T>(dy));
    for (int rank = 0; rank < 4; ++rank) {
      for (bool epilogue : {false, true}) {
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " rank " << rank
                                        << (epilogue ? " with BGRADB" : ""));
        auto run = [&] {
          DeviceBuffer<float> d_dw(start), d_sum(s.OC);
          cuda::BlasContext blas;
          bool taken = false;
          if (epilogue) {
            taken = cuda::MatmulBackwardWeightBiasGrad<T>(blas, d_dw.get(), d_sum.get(), d_dy.get(), d_x.get(), s.N,
                                                          s.C, s.OC, kStream, rank);
          } else {
            cuda::MatmulBackwardWeight<T, float>(blas, d_dw.get(), d_dy.get(), d_x.get(), s.N, s.C, s.OC, kStream,
                                                 rank);
          }
          SyncOrFail();
          return std::make_pair(taken ? d_sum.Download() : std::vector<float>{}, d_dw.Download());
        };
        const auto first = run();
        EXPECT_TRUE(AllClose(first.second, dw, Element<float>::kTolerance)) << "dweight";
        if (!first.first.empty()) {
          EXPECT_TRUE(AllClose(first.first, dbias, Element<float>::kTolerance)) << "dbias";
        }
        const auto second = run();
        EXPECT_EQ(first.second, second.second) << "the same bits on a second run";
        EXPECT_EQ(first.first, second.first);
      }
    }
  }
}

// GELU's backward in cuBLASLt's epilogue (the tuning's
// gelu_backward_epilogue): the fc_proj input gradient times GELU'(pre),
// against the CPU kernels on the same rounded operands, at GPT-2 124M's MLP
// widths, where cuBLASLt must take the epilogue (the tuner's candidate
// depends on it), and a small odd-rowed shape, where it may decline (the
// caller then runs the separate kernels); where the pitch is not a multiple
// of 8 it is declined and nothing is written.
TYPED_TEST(CudaMixedMatmulTest, GeluBackwardEpilogueMatchesTheCpuKernels) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(34);
  cuda::BlasContext blas;
  // N rows; the layer's input (GELU's output) is `in` wide, its output `out`.
  struct Shape {
    int64_t N, in, out;
  };
  for (const Shape& s : {Shape{64, 3072, 768}, Shape{33, 256, 64}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " in=" << s.in << " out=" << s.out);
    const auto pre = RandomValues<T>(size_t(s.N * s.in), rng, 2.0f);
    const auto w = RandomValues<T>(size_t(s.out * s.in), rng, 1.0f / std::sqrt(float(s.in)));
    const auto dy = RandomValues<T>(size_t(s.N * s.out), rng);
    DeviceBuffer<T> d_pre(ToElements<T>(pre)), d_w(ToElements<T>(w)), d_dy(ToElements<T>(dy)), d_dinp(s.N * s.in);
    const bool taken = cuda::MatmulBackwardInputGelu<T>(blas, d_dinp.get(), d_dy.get(), d_w.get(), d_pre.get(), s.N,
                                                         s.in, s.out, kStream);
    if (s.in == 3072) {
      ASSERT_TRUE(taken) << "cuBLASLt declined DGELU at GPT-2's shape";
    }
    if (!taken) continue;
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> dx(size_t(s.N * s.in)), dw(size_t(s.out * s.in), 0.0f), zeros(size_t(s.N * s.in), 0.0f);
    cpu::MatmulBackward(dx.data(), dw.data(), nullptr, dy.data(), zeros.data(), w.data(), s.N, s.in, s.out);
    std::vector<float> dinp(dx.size());
    cpu::GeluBackward(dinp.data(), pre.data(), dx.data(), int64_t(dx.size()));
    double floor = 0;  // GELU' crosses zero: near-zero products against the product's size
    for (float v : dx) floor = std::max(floor, double(std::fabs(v)));
    EXPECT_TRUE(AllClose(ToFloats(d_dinp.Download()), dinp, Element<T>::kTolerance, floor)) << "dinp";
    const auto first = d_dinp.Download();
    ASSERT_TRUE(cuda::MatmulBackwardInputGelu<T>(blas, d_dinp.get(), d_dy.get(), d_w.get(), d_pre.get(), s.N, s.in,
                                                 s.out, kStream));
    EXPECT_EQ(ToFloats(d_dinp.Download()), ToFloats(first)) << "the same bits on a second run";
  }
  // A pitch the epilogue does not take: declined, nothing written.
  const Shape odd{5, 33, 16};
  DeviceBuffer<T> d_pre(ToElements<T>(RandomValues<T>(size_t(odd.N * odd.in), rng)));
  DeviceBuffer<T> d_w(ToElements<T>(RandomValues<T>(size_t(odd.out * odd.in), rng)));
  DeviceBuffer<T> d_dy(ToElements<T>(RandomValues<T>(size_t(odd.N * odd.out), rng)));
  const std::vector<float> sentinel(size_t(odd.N * odd.in), 3.0f);
  DeviceBuffer<T> d_dinp(ToElements<T>(sentinel));
  EXPECT_FALSE(cuda::MatmulBackwardInputGelu<T>(blas, d_dinp.get(), d_dy.get(), d_w.get(), d_pre.get(), odd.N, odd.in,
                                                odd.out, kStream));
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_EQ(ToFloats(d_dinp.Download()), sentinel);
}

// The bias gradient in the weight gradient GEMM's epilogue (the tuning's
// bias_grad_epilogue): dweight accumulates, the column sums of dout are
// written to their own buffer; both against the CPU kernels, at GPT-2 124M's
// widths (where cuBLASLt must take the epilogue) and a small shape, and the
// same bits on a second run. A width that is not a multiple of 8 is
// declined with nothing written.
TYPED_TEST(CudaMixedMatmulTest, BiasGradientEpilogueMatchesTheCpuKernels) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(35);
  cuda::BlasContext blas;
  for (const LinearShape& s : {LinearShape{2048, 768, 3072}, LinearShape{2048, 3072, 768}, LinearShape{33, 64, 40}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const auto x = RandomValues<T>(size_t(s.N * s.C), rng);
    const auto dy = RandomValues<T>(size_t(s.N * s.OC), rng);
    const auto dw0 = RandomValues<float>(size_t(s.OC * s.C), rng);
    DeviceBuffer<T> d_x(ToElements<T>(x)), d_dy(ToElements<T>(dy));
    DeviceBuffer<float> d_dw(dw0), d_sum(s.OC);
    const bool taken = cuda::MatmulBackwardWeightBiasGrad<T>(blas, d_dw.get(), d_sum.get(), d_dy.get(), d_x.get(),
                                                             s.N, s.C, s.OC, kStream);
    if (s.N == 2048) {
      ASSERT_TRUE(taken) << "cuBLASLt declined BGRADB at GPT-2's widths";
    }
    if (!taken) continue;
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> dx(size_t(s.N * s.C)), dw = dw0, dbias(size_t(s.OC), 0.0f);
    std::vector<float> w(size_t(s.OC * s.C), 0.0f);
    cpu::MatmulBackward(dx.data(), dw.data(), dbias.data(), dy.data(), x.data(), w.data(), s.N, s.C, s.OC);
    EXPECT_TRUE(AllClose(d_dw.Download(), dw, Element<float>::kTolerance)) << "dweight";
    EXPECT_TRUE(AllClose(d_sum.Download(), dbias, Element<float>::kTolerance)) << "dbias";
    const auto first_sum = d_sum.Download();
    d_dw.Upload(dw0);
    ASSERT_TRUE(cuda::MatmulBackwardWeightBiasGrad<T>(blas, d_dw.get(), d_sum.get(), d_dy.get(), d_x.get(), s.N, s.C,
                                                      s.OC, kStream));
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_EQ(d_sum.Download(), first_sum) << "the same bits on a second run";
  }
  const LinearShape odd{5, 16, 33};
  DeviceBuffer<T> d_x(ToElements<T>(RandomValues<T>(size_t(odd.N * odd.C), rng)));
  DeviceBuffer<T> d_dy(ToElements<T>(RandomValues<T>(size_t(odd.N * odd.OC), rng)));
  const std::vector<float> sentinel(size_t(odd.OC * odd.C), 3.0f);
  DeviceBuffer<float> d_dw(sentinel), d_sum(std::vector<float>(size_t(odd.OC), 3.0f));
  EXPECT_FALSE(cuda::MatmulBackwardWeightBiasGrad<T>(blas, d_dw.get(), d_sum.get(), d_dy.get(), d_x.get(), odd.N,
                                                     odd.C, odd.OC, kStream));
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_EQ(d_dw.Download(), sentinel);
}

}  // namespace
}  // namespace pstar::test
