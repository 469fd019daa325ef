// The reductions against the CPU kernels and plain host sums, at sizes below,
// at and past one grid-stride pass, and their run-to-run determinism.
#include "kernels/cuda/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/reduce.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;
// 1 element, a partial first pass, exactly one pass of the 512 x 256 grid,
// and several passes with a ragged end.
constexpr int64_t kSizes[] = {1, 255, 1000, 512 * 256, (int64_t{1} << 20) + 7};

template <typename T>
class CudaReduceTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaReduceTest, ElementTypes, ElementName);

// Adds to what *out holds, bit for bit as the CPU kernel, which follows the
// same order of double additions.
TYPED_TEST(CudaReduceTest, SumOfSquaresMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(21);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = RandomValues<T>(size_t(n), rng, 3.0f);
    const double start = 12.5;
    DeviceBuffer<T> dx(ToElements<T>(x));
    DeviceBuffer<double> scratch(cuda::ReduceScratchElements()), out(std::vector<double>{start});
    cuda::SumOfSquares<T>(out.get(), scratch.get(), dx.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    const double want = start + cpu::SumOfSquares(x.data(), n);
    EXPECT_EQ(std::bit_cast<uint64_t>(out.Download()[0]), std::bit_cast<uint64_t>(want))
        << out.Download()[0] << " vs " << want;
  }
}

// Many spans in two launches: each span's sum is bit for bit the CPU
// kernel's (added to what its result held), empty spans add nothing, and the
// spans may lie anywhere, in any order of sizes.
TEST(CudaMultiReduceTest, SumsOfSquaresGiveEachSpanTheBitsOfItsOwnSum) {
  PSTAR_REQUIRE_GPU();
  std::mt19937 rng(23);
  std::vector<int64_t> sizes = {0, 1, 255, 256, 257, 1000, 512 * 256, 512 * 256 + 1, (int64_t{1} << 20) + 7, 3, 0};
  for (int i = 0; i < 40; ++i) sizes.push_back(int64_t(rng() % 5000));
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const auto x = RandomValues<float>(size_t(total), rng, 3.0f);
  DeviceBuffer<float> dx(x);
  std::vector<cuda::DeviceSpan> spans;
  std::vector<double> start, want;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    spans.push_back({dx.get() + offset, n});
    start.push_back(0.25 * double(spans.size()));
    want.push_back(start.back() + cpu::SumOfSquares(x.data() + offset, n));
    offset += n;
  }
  const int64_t count = int64_t(spans.size());
  DeviceBuffer<double> scratch(cuda::SumsOfSquaresScratchElements(count)), out(start);
  DeviceBuffer<cuda::DeviceSpan> d_spans(spans);
  cuda::SumsOfSquares(out.get(), scratch.get(), d_spans.get(), count, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  const std::vector<double> got = out.Download();
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(got[size_t(i)]), std::bit_cast<uint64_t>(want[size_t(i)]))
        << "span " << i << " of " << sizes[size_t(i)] << ": " << got[size_t(i)] << " vs " << want[size_t(i)];
  }
}

TYPED_TEST(CudaReduceTest, SumOfSquaresIsDeterministic) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(22);
  const int64_t n = (int64_t{1} << 21) + 13;
  const auto x = RandomValues<T>(size_t(n), rng, 100.0f);
  DeviceBuffer<T> dx(ToElements<T>(x));
  DeviceBuffer<double> scratch(cuda::ReduceScratchElements());
  std::vector<uint64_t> bits;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<double> out(std::vector<double>{0.0});
    cuda::SumOfSquares<T>(out.get(), scratch.get(), dx.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    bits.push_back(std::bit_cast<uint64_t>(out.Download()[0]));
  }
  EXPECT_EQ(bits[0], bits[1]);
  EXPECT_EQ(bits[0], bits[2]);
}

// One bad value anywhere, the last element included (past the first
// grid-stride pass), sets the flag; finite inputs leave it as it was.
TYPED_TEST(CudaReduceTest, FlagNonFiniteFindsInfAndNan) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(23);
  const int64_t n = 1024 * 256 * 2 + 5;
  const auto x = RandomValues<T>(size_t(n), rng, 10.0f);
  DeviceBuffer<T> dx(ToElements<T>(x));
  for (int32_t initial : {0, 1}) {
    DeviceBuffer<int32_t> flag(std::vector<int32_t>{initial});
    cuda::FlagNonFinite<T>(flag.get(), dx.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_EQ(flag.Download()[0], initial) << "finite input";
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t where : {int64_t{0}, int64_t{777}, n - 1}) {
    for (float bad : {inf, -inf, nan}) {
      SCOPED_TRACE(testing::Message() << "bad value " << bad << " at " << where);
      auto y = x;
      y[size_t(where)] = bad;
      dx.Upload(ToElements<T>(y));
      DeviceBuffer<int32_t> flag(std::vector<int32_t>{0});
      cuda::FlagNonFinite<T>(flag.get(), dx.get(), n, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      EXPECT_EQ(flag.Download()[0], 1);
      EXPECT_FALSE(cpu::AllFinite(y.data(), n));  // the oracle agrees
    }
  }
}

// Adds to what *out holds, as SumOfSquares.
TEST(CudaSumTest, MatchesHostSum) {
  PSTAR_REQUIRE_GPU();
  std::mt19937 rng(24);
  std::uniform_real_distribution<float> dist(0.0f, 8.0f);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    std::vector<float> x(static_cast<size_t>(n));
    double sum = 0.0;
    for (float& v : x) {
      v = dist(rng);
      sum += v;
    }
    const double start = 3.25;
    const double want = start + sum;
    DeviceBuffer<float> dx(x);
    DeviceBuffer<double> scratch(cuda::ReduceScratchElements()), out(std::vector<double>{start});
    cuda::Sum(out.get(), scratch.get(), dx.get(), n, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_NEAR(out.Download()[0], want, 1e-12 * want);
  }
}

}  // namespace
}  // namespace pstar::test
