// Softmax cross-entropy on the GPU against the CPU kernels on random logits,
// for fp32, bf16 and fp16 logits (rounded on the host first).
#include "kernels/cuda/classifier.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/classifier.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;
// Losses and log-sum-exps are fp32 sums of exps of the same inputs on both
// sides, whatever the logits' type.
constexpr double kLossTolerance = 1e-5;

template <typename T>
class CudaClassifierTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaClassifierTest, ElementTypes, ElementName);

struct ClassifierShape {
  int64_t N, V;
};
// Rows shorter than a warp, odd lengths, one class, and GPT-2's vocabulary.
constexpr ClassifierShape kShapes[] = {{7, 13}, {1, 1}, {5, 33}, {3, 1000}, {4, 50257}};

std::vector<int32_t> RandomTargets(int64_t N, int64_t V, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, int32_t(V - 1));
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& t : targets) t = dist(rng);
  return targets;
}

// Logits ~ N(offset, scale) in the element type.
template <typename T>
std::vector<float> RandomLogits(int64_t N, int64_t V, std::mt19937& rng, float scale, float offset) {
  auto logits = RandomValues<T>(size_t(N * V), rng, scale);
  for (auto& x : logits) x = Element<T>::ToFloat(Element<T>::FromFloat(x + offset));
  return logits;
}

template <typename T>
void CheckForward(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t N, int64_t V) {
  DeviceBuffer<T> d_logits(ToElements<T>(logits));
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> d_losses(N), d_lse(N);
  cuda::CrossEntropyForward<T>(d_losses.get(), d_lse.get(), d_logits.get(), d_targets.get(), N, V, V, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
  cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, V);
  EXPECT_TRUE(AllClose(d_losses.Download(), losses, kLossTolerance)) << "losses";
  EXPECT_TRUE(AllClose(d_lse.Download(), lse, kLossTolerance)) << "lse";
}

TYPED_TEST(CudaClassifierTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(31);
  for (const ClassifierShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V);
    const auto logits = RandomLogits<T>(s.N, s.V, rng, 2.0f, 0.0f);
    ASSERT_NO_FATAL_FAILURE(CheckForward<T>(logits, RandomTargets(s.N, s.V, rng), s.N, s.V));
  }
}

// Logits around 100: exp(100) overflows fp32, so only a max-subtracted sum
// gets these right.
TYPED_TEST(CudaClassifierTest, ForwardIsStableForLargeLogits) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(32);
  const int64_t N = 6, V = 3001;
  const auto logits = RandomLogits<T>(N, V, rng, 3.0f, 100.0f);
  ASSERT_NO_FATAL_FAILURE(CheckForward<T>(logits, RandomTargets(N, V, rng), N, V));
}

TYPED_TEST(CudaClassifierTest, BackwardInPlaceMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(33);
  for (const ClassifierShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V);
    auto logits = RandomLogits<T>(s.N, s.V, rng, 2.0f, 0.0f);
    const auto targets = RandomTargets(s.N, s.V, rng);
    std::vector<float> losses(static_cast<size_t>(s.N)), lse(static_cast<size_t>(s.N));
    cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), s.N, s.V, s.V);
    const float dloss = 1.0f / float(s.N);

    DeviceBuffer<T> d_logits(ToElements<T>(logits));
    DeviceBuffer<int32_t> d_targets(targets);
    DeviceBuffer<float> d_lse(lse);
    cuda::CrossEntropyBackwardInPlace<T>(d_logits.get(), d_lse.get(), d_targets.get(), dloss, s.N, s.V, s.V, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::CrossEntropyBackwardInPlace(logits.data(), lse.data(), targets.data(), dloss, s.N, s.V, s.V);
    const auto got = ToFloats(d_logits.Download());
    EXPECT_TRUE(AllClose(got, logits, Element<T>::kTolerance));
    // Each row of dlogits sums to zero (softmax sums to one); the target's
    // entry is the only negative one.
    for (int64_t n = 0; n < s.N; ++n) {
      double sum = 0.0;
      for (int64_t j = 0; j < s.V; ++j) sum += got[size_t(n * s.V + j)];
      EXPECT_NEAR(sum, 0.0, 1e-2 * dloss) << "row " << n;
      if (s.V > 1) {
        EXPECT_LT(got[size_t(n * s.V + targets[size_t(n)])], 0.0f) << "row " << n;
      }
    }
  }
}

// Forward then backward on the same device buffer, as training uses it.
TYPED_TEST(CudaClassifierTest, ForwardThenBackwardOnOneBuffer) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(34);
  const int64_t N = 9, V = 777;
  auto logits = RandomLogits<T>(N, V, rng, 1.5f, 0.0f);
  const auto targets = RandomTargets(N, V, rng);
  const float dloss = 0.25f;
  DeviceBuffer<T> d_logits(ToElements<T>(logits));
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> d_losses(N), d_lse(N);
  cuda::CrossEntropyForward<T>(d_losses.get(), d_lse.get(), d_logits.get(), d_targets.get(), N, V, V, kStream);
  cuda::CrossEntropyBackwardInPlace<T>(d_logits.get(), d_lse.get(), d_targets.get(), dloss, N, V, V, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
  cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, V);
  cpu::CrossEntropyBackwardInPlace(logits.data(), lse.data(), targets.data(), dloss, N, V, V);
  EXPECT_TRUE(AllClose(d_losses.Download(), losses, kLossTolerance)) << "losses";
  EXPECT_TRUE(AllClose(ToFloats(d_logits.Download()), logits, Element<T>::kTolerance)) << "dlogits";
}

}  // namespace
}  // namespace pstar::test

namespace pstar::test {
namespace {

// A padded vocabulary (rows Vp apart): the padding columns, whatever they
// hold, change no loss, and backward zeroes them; the real columns match the
// CPU kernels on the same padded buffer.
TYPED_TEST(CudaClassifierTest, PaddedColumnsAreIgnoredAndZeroedInBackward) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(35);
  const int64_t N = 7, V = 777, Vp = 832;
  auto logits = RandomLogits<T>(N, Vp, rng, 1.5f, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = V; j < Vp; ++j) logits[size_t(n * Vp + j)] = 1000.0f;  // would dominate any softmax
  }
  logits = ToFloats(ToElements<T>(logits));
  const auto targets = RandomTargets(N, V, rng);
  const float dloss = 0.5f;
  DeviceBuffer<T> d_logits(ToElements<T>(logits));
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> d_losses(N), d_lse(N);
  cuda::CrossEntropyForward<T>(d_losses.get(), d_lse.get(), d_logits.get(), d_targets.get(), N, V, Vp, kStream);
  cuda::CrossEntropyBackwardInPlace<T>(d_logits.get(), d_lse.get(), d_targets.get(), dloss, N, V, Vp, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
  cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  cpu::CrossEntropyBackwardInPlace(logits.data(), lse.data(), targets.data(), dloss, N, V, Vp);
  EXPECT_TRUE(AllClose(d_losses.Download(), losses, kLossTolerance)) << "losses";
  const auto got = ToFloats(d_logits.Download());
  EXPECT_TRUE(AllClose(got, logits, Element<T>::kTolerance)) << "dlogits";
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = V; j < Vp; ++j) ASSERT_EQ(got[size_t(n * Vp + j)], 0.0f) << "row " << n << " col " << j;
  }
}

}  // namespace
}  // namespace pstar::test
