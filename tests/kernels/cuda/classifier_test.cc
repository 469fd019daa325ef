// Softmax cross-entropy on the GPU (loss and dlogits in one pass) against the
// CPU kernel on random logits, for fp32, bf16 and fp16 logits (rounded on the
// host first).
#include "kernels/cuda/classifier.h"

#include <gtest/gtest.h>

#include <cmath>
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
// GPT-2's vocabulary, Llama 3's (128,256) and Qwen2.5's (151,936).
constexpr ClassifierShape kShapes[] = {{7, 13}, {1, 1}, {5, 33}, {3, 1000}, {4, 50257}, {3, 128256}, {2, 151936}};

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

// The fused kernel on the GPU against the CPU kernel on the same (rounded)
// logits: the losses, and with write_dlogits the gradient written over the
// logits (the CPU's fp32 gradient rounded to T on the GPU: T's tolerance).
template <typename T>
void CheckCrossEntropyKernel(const std::vector<float>& logits, const std::vector<int32_t>& targets, float dloss,
                             int64_t N, int64_t V, int64_t Vp, cuda::CrossEntropyKernel kernel) {
  for (bool write : {false, true}) {
    SCOPED_TRACE(write ? "loss and dlogits" : "loss only");
    DeviceBuffer<T> d_logits(ToElements<T>(logits));
    DeviceBuffer<int32_t> d_targets(targets);
    DeviceBuffer<float> d_losses(N);
    cuda::CrossEntropy<T>(d_losses.get(), d_logits.get(), d_targets.get(), dloss, write, N, V, Vp, kStream, 512,
                          kernel);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    std::vector<float> want = logits, losses(static_cast<size_t>(N));
    cpu::CrossEntropy(losses.data(), want.data(), targets.data(), dloss, write, N, V, Vp);
    EXPECT_TRUE(AllClose(d_losses.Download(), losses, kLossTolerance)) << "losses";
    const auto got = ToFloats(d_logits.Download());
    if (!write) {
      EXPECT_EQ(got, ToFloats(ToElements<T>(logits))) << "the loss alone leaves the logits";
      continue;
    }
    EXPECT_TRUE(AllClose(got, want, Element<T>::kTolerance)) << "dlogits";
    // Each row of dlogits sums to zero (softmax sums to one), the target's
    // entry is the only negative one, and the padding is zero.
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t j = 0; j < V; ++j) sum += got[size_t(n * Vp + j)];
      EXPECT_NEAR(sum, 0.0, 1e-2 * std::abs(dloss)) << "row " << n;
      if (V > 1) {
        EXPECT_LT(got[size_t(n * Vp + targets[size_t(n)])], 0.0f) << "row " << n;
      }
      for (int64_t j = V; j < Vp; ++j) ASSERT_EQ(got[size_t(n * Vp + j)], 0.0f) << "row " << n << " col " << j;
    }
  }
  // The gradient alone (no losses): the same gradient.
  DeviceBuffer<T> d_logits(ToElements<T>(logits));
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<T> d_with_loss(ToElements<T>(logits));
  DeviceBuffer<float> d_losses(N);
  cuda::CrossEntropy<T>(nullptr, d_logits.get(), d_targets.get(), dloss, true, N, V, Vp, kStream, 512, kernel);
  cuda::CrossEntropy<T>(d_losses.get(), d_with_loss.get(), d_targets.get(), dloss, true, N, V, Vp, kStream, 512,
                        kernel);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_EQ(ToFloats(d_logits.Download()), ToFloats(d_with_loss.Download())) << "without losses";
}
// Both kernels (scalar and 16-byte loads), the second only where it takes
// the shape (asserted by the callers that mean to reach it).
template <typename T>
void CheckCrossEntropy(const std::vector<float>& logits, const std::vector<int32_t>& targets, float dloss, int64_t N,
                       int64_t V, int64_t Vp) {
  for (const cuda::CrossEntropyKernel kernel : {cuda::CrossEntropyKernel::kScalar, cuda::CrossEntropyKernel::kVector}) {
    SCOPED_TRACE(kernel == cuda::CrossEntropyKernel::kScalar ? "scalar" : "vector");
    ASSERT_NO_FATAL_FAILURE(CheckCrossEntropyKernel<T>(logits, targets, dloss, N, V, Vp, kernel));
  }
}

TYPED_TEST(CudaClassifierTest, MatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(31);
  for (const ClassifierShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V);
    const auto logits = RandomLogits<T>(s.N, s.V, rng, 2.0f, 0.0f);
    const auto targets = RandomTargets(s.N, s.V, rng);
    ASSERT_NO_FATAL_FAILURE(CheckCrossEntropy<T>(logits, targets, 1.0f / float(s.N), s.N, s.V, s.V));
  }
}

// Padded rows as the model lays them out (Vp a multiple of 64): the 16-byte
// kernel takes them, including a last vector that is part logits, part
// padding, rows of one class, and GPT-2's vocabulary; every thread count.
TYPED_TEST(CudaClassifierTest, SixteenByteLoadsMatchCpuOnPaddedRows) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(37);
  constexpr ClassifierShape kPadded[] = {{5, 13}, {3, 1}, {2, 64}, {9, 1000}, {4, 50257}};
  for (const ClassifierShape& s : kPadded) {
    const int64_t Vp = (s.V + 63) / 64 * 64;
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << Vp);
    const auto logits = RandomLogits<T>(s.N, Vp, rng, 2.0f, 0.0f);
    const auto targets = RandomTargets(s.N, s.V, rng);
    DeviceBuffer<T> probe(ToElements<T>(logits));
    ASSERT_TRUE(cuda::CrossEntropyTakesVectors(probe.get(), Vp, sizeof(T)));
    for (int threads : {32, 256, 1024}) {
      SCOPED_TRACE(threads);
      for (bool write : {false, true}) {
        DeviceBuffer<T> d_logits(ToElements<T>(logits));
        DeviceBuffer<int32_t> d_targets(targets);
        DeviceBuffer<float> d_losses(s.N);
        cuda::CrossEntropy<T>(d_losses.get(), d_logits.get(), d_targets.get(), 0.5f, write, s.N, s.V, Vp, kStream,
                              threads, cuda::CrossEntropyKernel::kVector);
        ASSERT_NO_FATAL_FAILURE(SyncOrFail());
        std::vector<float> want = logits, losses(static_cast<size_t>(s.N));
        cpu::CrossEntropy(losses.data(), want.data(), targets.data(), 0.5f, write, s.N, s.V, Vp);
        EXPECT_TRUE(AllClose(d_losses.Download(), losses, kLossTolerance)) << "losses";
        if (write) {
          EXPECT_TRUE(AllClose(ToFloats(d_logits.Download()), want, Element<T>::kTolerance)) << "dlogits";
        }
      }
    }
  }
  // Unaligned rows (Vp of 13 elements) fall back to the scalar kernel.
  DeviceBuffer<T> odd(ToElements<T>(std::vector<float>(26, 0.0f)));
  EXPECT_FALSE(cuda::CrossEntropyTakesVectors(odd.get(), 13, sizeof(T)));
}

// A NaN logit makes its row's loss NaN in both kernels (the vector kernel's
// max skips NaN; its sum must not).
TYPED_TEST(CudaClassifierTest, ANanLogitMakesItsRowsLossNan) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(38);
  const int64_t N = 3, V = 100, Vp = 128;
  auto logits = RandomLogits<T>(N, Vp, rng, 1.0f, 0.0f);
  logits[size_t(1 * Vp + 40)] = std::nanf("");
  const auto targets = RandomTargets(N, V, rng);
  for (const cuda::CrossEntropyKernel kernel : {cuda::CrossEntropyKernel::kScalar, cuda::CrossEntropyKernel::kVector}) {
    DeviceBuffer<T> d_logits(ToElements<T>(logits));
    DeviceBuffer<int32_t> d_targets(targets);
    DeviceBuffer<float> d_losses(N);
    cuda::CrossEntropy<T>(d_losses.get(), d_logits.get(), d_targets.get(), 1.0f, false, N, V, Vp, kStream, 256, kernel);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    const auto losses = d_losses.Download();
    EXPECT_TRUE(std::isfinite(losses[0])) << int(kernel);
    EXPECT_TRUE(std::isnan(losses[1])) << int(kernel);
    EXPECT_TRUE(std::isfinite(losses[2])) << int(kernel);
  }
}

// Logits around 100: exp(100) overflows fp32, so only a max-subtracted sum
// gets these right.
TYPED_TEST(CudaClassifierTest, IsStableForLargeLogits) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(32);
  const int64_t N = 6, V = 3001;
  const auto logits = RandomLogits<T>(N, V, rng, 3.0f, 100.0f);
  ASSERT_NO_FATAL_FAILURE(CheckCrossEntropy<T>(logits, RandomTargets(N, V, rng), 0.25f, N, V, V));
}

// A padded vocabulary (rows Vp apart): the padding columns, whatever they
// hold, change no loss, and the gradient zeroes them; the real columns match
// the CPU kernel on the same padded buffer.
TYPED_TEST(CudaClassifierTest, PaddedColumnsAreIgnoredAndZeroed) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(35);
  const int64_t N = 7, V = 777, Vp = 832;
  auto logits = RandomLogits<T>(N, Vp, rng, 1.5f, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = V; j < Vp; ++j) logits[size_t(n * Vp + j)] = 1000.0f;  // would dominate any softmax
  }
  logits = ToFloats(ToElements<T>(logits));
  ASSERT_NO_FATAL_FAILURE(CheckCrossEntropy<T>(logits, RandomTargets(N, V, rng), 0.5f, N, V, Vp));
}

}  // namespace
}  // namespace pstar::test
