// Causal self-attention on the GPU against the CPU kernels on random inputs,
// for fp32, bf16 and fp16 (16-bit inputs rounded on the host first).
#include "kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename T>
class CudaAttentionTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaAttentionTest, ElementTypes, ElementName);

struct AttentionShape {
  int64_t B, T, C, NH;
};
// Odd sizes, a single position, and rows longer than a warp (T > 32, 64).
constexpr AttentionShape kShapes[] = {{2, 5, 12, 3}, {1, 1, 4, 1}, {2, 17, 64, 4}, {3, 33, 96, 2}, {1, 70, 24, 3}};

testing::Message Describe(const AttentionShape& s) {
  return testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH;
}

TYPED_TEST(CudaAttentionTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(21);
  cuda::BlasContext blas;
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const int64_t att_size = s.B * s.NH * s.T * s.T;
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    // NaN everywhere the kernels write: every output element must be set.
    std::vector<float> out(size_t(s.B * s.T * s.C), kNaN), att(size_t(att_size), kNaN);
    const std::vector<float> scratch(size_t(cuda::AttentionScratchElements(s.B, s.T, s.C, s.NH)), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_out(ToElements<T>(out)), d_att(ToElements<T>(att));
    DeviceBuffer<T> d_scratch(ToElements<T>(scratch));
    cuda::AttentionForward<T>(blas, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), s.B, s.T, s.C, s.NH,
                              kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    const auto got_att = ToFloats(d_att.Download());
    EXPECT_TRUE(AllClose(ToFloats(d_out.Download()), out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(got_att, att, Element<T>::kTolerance)) << "att";
    // Exact zeros above the diagonal.
    for (int64_t r = 0; r < s.B * s.NH * s.T; ++r) {
      const int64_t t = r % s.T;
      for (int64_t j = t + 1; j < s.T; ++j) ASSERT_EQ(got_att[r * s.T + j], 0.0f) << "row " << r << " col " << j;
    }
  }
}

// Backward from the same probabilities on both sides (the CPU forward's,
// rounded to the element type), so only the backward pass is compared.
TYPED_TEST(CudaAttentionTest, BackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(22);
  cuda::BlasContext blas;
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const int64_t att_size = s.B * s.NH * s.T * s.T;
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
    std::vector<float> out(static_cast<size_t>(s.B * s.T * s.C)), att(static_cast<size_t>(att_size));
    cpu::AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    att = ToFloats(ToElements<T>(att));

    std::vector<float> dqkv(qkv.size(), kNaN), datt(size_t(att_size), kNaN);
    const std::vector<float> scratch(size_t(cuda::AttentionScratchElements(s.B, s.T, s.C, s.NH)), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_att(ToElements<T>(att));
    DeviceBuffer<T> d_dqkv(ToElements<T>(dqkv)), d_datt(ToElements<T>(datt)), d_scratch(ToElements<T>(scratch));
    cuda::AttentionBackward<T>(blas, d_dqkv.get(), d_datt.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                               d_att.get(), s.B, s.T, s.C, s.NH, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionBackward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    const auto got = ToFloats(d_dqkv.Download());
    // q, k and v gradients separately: each has its own scale.
    for (int part = 0; part < 3; ++part) {
      std::vector<float> got_part, want_part;
      for (int64_t row = 0; row < s.B * s.T; ++row) {
        for (int64_t c = 0; c < s.C; ++c) {
          got_part.push_back(got[size_t(row * 3 * s.C + part * s.C + c)]);
          want_part.push_back(dqkv[size_t(row * 3 * s.C + part * s.C + c)]);
        }
      }
      EXPECT_TRUE(AllClose(got_part, want_part, Element<T>::kTolerance)) << "d" << "qkv"[part];
    }
  }
}

// The forward output feeds the backward on the GPU, as in training: the pair
// matches the CPU pair.
TYPED_TEST(CudaAttentionTest, ForwardThenBackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(23);
  cuda::BlasContext blas;
  const AttentionShape s = {2, 9, 20, 5};
  const int64_t att_size = s.B * s.NH * s.T * s.T;
  const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
  const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
  const int64_t scratch_size = cuda::AttentionScratchElements(s.B, s.T, s.C, s.NH);
  DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out(s.B * s.T * s.C), d_att(att_size);
  DeviceBuffer<T> d_dqkv(int64_t(qkv.size())), d_datt(att_size), d_scratch(scratch_size);
  cuda::AttentionForward<T>(blas, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), s.B, s.T, s.C, s.NH,
                            kStream);
  cuda::AttentionBackward<T>(blas, d_dqkv.get(), d_datt.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                             d_att.get(), s.B, s.T, s.C, s.NH, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> out(static_cast<size_t>(s.B * s.T * s.C)), att(static_cast<size_t>(att_size));
  std::vector<float> dqkv(qkv.size()), datt(static_cast<size_t>(att_size));
  cpu::AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  cpu::AttentionBackward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(AllClose(ToFloats(d_out.Download()), out, Element<T>::kTolerance)) << "out";
  EXPECT_TRUE(AllClose(ToFloats(d_dqkv.Download()), dqkv, Element<T>::kTolerance)) << "dqkv";
}

}  // namespace
}  // namespace pstar::test
