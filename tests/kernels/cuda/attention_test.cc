// Causal self-attention on the GPU against the CPU kernels (the same
// FlashAttention-2 blocking) on random inputs, for fp32, bf16 and fp16
// (16-bit inputs rounded on the host first). In bf16 and fp16 the head sizes
// that are a multiple of 16 take the tensor-core forward (P rounded to the
// element type before P·v, within the element type's tolerance), the others
// the CUDA-core one; so does the backward, where dout, the probabilities and
// their gradients are rounded to the element type for the products.
#include "kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/attention_test_util.h"
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

// Odd sizes, a single position, T across and off the 64-position block, head
// sizes 1 to the largest the kernels take (128), every multiple of 16 among
// them (the tensor-core forward), over several key blocks.
constexpr AttentionShape kShapes[] = {{2, 5, 12, 3},   {1, 1, 4, 1},     {2, 17, 64, 4},   {3, 33, 96, 2},
                                      {1, 70, 24, 3},  {1, 64, 3, 3},    {2, 129, 128, 1}, {1, 200, 256, 4},
                                      {1, 130, 96, 3}, {2, 65, 32, 2},   {1, 300, 512, 4}, {1, 190, 160, 2},
                                      {1, 100, 224, 2}};

TYPED_TEST(CudaAttentionTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(21);
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    // NaN everywhere the kernels write: every output element must be set.
    std::vector<float> out(size_t(s.B * s.T * s.C), kNaN), lse(size_t(s.B * s.NH * s.T), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_out(ToElements<T>(out));
    DeviceBuffer<float> d_lse(lse);
    cuda::AttentionForward<T>(d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(AllClose(ToFloats(d_out.Download()), out, Element<T>::kTolerance)) << "out";
    // lse is fp32 from inputs exact in T: fp32 agreement whatever T is.
    EXPECT_TRUE(AllClose(d_lse.Download(), lse, Element<float>::kTolerance)) << "lse";
  }
}

// The mma.sync forward (AttentionForwardKernel::kMma) at the head sizes it
// takes (64 and 128), and its fallback at the others: every shape matches
// the CPU kernel and gives the same bits on a second run. fp32 has no mma
// path and runs the other kernels.
TYPED_TEST(CudaAttentionTest, MmaForwardMatchesCpuAndRepeatsBitForBit) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(24);
  constexpr AttentionShape kMmaShapes[] = {{1, 1, 64, 1},    {2, 64, 128, 2},  {1, 77, 192, 3}, {2, 200, 768, 12},
                                           {1, 129, 128, 1}, {1, 260, 256, 2}, {1, 1030, 512, 4},
                                           {2, 70, 96, 3}};  // the last: head size 32, the fallback
  for (const AttentionShape& s : kMmaShapes) {
    SCOPED_TRACE(Describe(s));
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    std::vector<float> out(size_t(s.B * s.T * s.C), kNaN), lse(size_t(s.B * s.NH * s.T), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_out(ToElements<T>(out));
    DeviceBuffer<float> d_lse(lse);
    auto run = [&](cuda::AttentionForwardKernel kernel) {
      cuda::AttentionForward<T>(d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream, kernel);
      return std::make_pair(ToFloats(d_out.Download()), d_lse.Download());
    };
    const auto first = run(cuda::AttentionForwardKernel::kMma);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(AllClose(first.first, out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(first.second, lse, Element<float>::kTolerance)) << "lse";
    const auto second = run(cuda::AttentionForwardKernel::kMma);
    EXPECT_EQ(first.first, second.first);
    EXPECT_EQ(first.second, second.second);
    // The q tile in a k/v buffer (head size 128): the same arithmetic, the same bits.
    const auto shared_q = run(cuda::AttentionForwardKernel::kMmaSharedQ);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_EQ(first.first, shared_q.first) << "kMmaSharedQ";
    EXPECT_EQ(first.second, shared_q.second) << "kMmaSharedQ";
    // 128 queries a block on 8 warps: every row meets the same key blocks in
    // the same order, the same bits.
    const auto wide = run(cuda::AttentionForwardKernel::kMmaWide);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_EQ(first.first, wide.first) << "kMmaWide";
    EXPECT_EQ(first.second, wide.second) << "kMmaWide";
  }
}

// The mma.sync backwards (AttentionBackwardKernel::kMma, the two passes;
// kMmaOnePass, the five-product pass with its ordered dq sums; and the
// occupancy and 128-row variants, which must give their base kernels' bits), from the CPU
// forward's results, at the head sizes they take and one they do not: every
// shape matches the CPU backward and gives the same bits on a second run.
TYPED_TEST(CudaAttentionTest, MmaBackwardMatchesCpuAndRepeatsBitForBit) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  using Kernel = cuda::AttentionBackwardKernel;
  std::mt19937 rng(25);
  constexpr AttentionShape kMmaShapes[] = {{1, 1, 64, 1},    {2, 64, 128, 2},   {1, 77, 192, 3}, {2, 200, 768, 12},
                                           {1, 129, 128, 1}, {1, 260, 256, 2},  {1, 530, 512, 4},
                                           {2, 70, 96, 3}};  // the last: head size 32, the fallback
  for (const AttentionShape& s : kMmaShapes) {
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
    std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.NH * s.T));
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    out = ToFloats(ToElements<T>(out));
    std::vector<float> want(qkv.size());
    cpu::AttentionBackward(want.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    std::vector<float> one_pass;
    std::vector<float> two_pass;
    for (const Kernel kernel :
         {Kernel::kMma, Kernel::kMmaOnePass, Kernel::kMmaOnePassOccupancy, Kernel::kMmaOccupancy, Kernel::kMmaWide}) {
      SCOPED_TRACE(testing::Message() << Describe(s) << " kernel " << int(kernel));
      DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out(ToElements<T>(out));
      DeviceBuffer<T> d_dqkv(ToElements<T>(std::vector<float>(qkv.size(), kNaN)));
      // Garbage in the scratch: the one-pass sums' first adder stores.
      const std::vector<float> scratch(size_t(cuda::AttentionScratchElements(s.Kernel(), kernel)), kNaN);
      DeviceBuffer<float> d_lse(lse), d_scratch(scratch);
      auto run = [&] {
        cuda::AttentionBackward<T>(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                   s.Kernel(), kStream, kernel);
        return ToFloats(d_dqkv.Download());
      };
      const auto first = run();
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      ExpectGradientsClose<T>(first, want, s);
      EXPECT_EQ(first, run());
      if (kernel == Kernel::kMma) two_pass = first;
      if (kernel == Kernel::kMmaOccupancy || kernel == Kernel::kMmaWide) {
        EXPECT_EQ(first, two_pass) << "the variant changed the bits";
      }
      if (kernel == Kernel::kMmaOnePass) one_pass = first;
      if (kernel == Kernel::kMmaOnePassOccupancy) {
        EXPECT_EQ(first, one_pass) << "the variant changed the bits";
      }
    }
  }
}

// Backward from the same forward results on both sides (the CPU forward's,
// out rounded to the element type), so only the backward pass is compared.
TYPED_TEST(CudaAttentionTest, BackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(22);
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
    const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
    std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.NH * s.T));
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    out = ToFloats(ToElements<T>(out));

    std::vector<float> dqkv(qkv.size(), kNaN);
    const std::vector<float> scratch(size_t(cuda::AttentionScratchElements(s.Kernel())), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out(ToElements<T>(out));
    DeviceBuffer<T> d_dqkv(ToElements<T>(dqkv));
    DeviceBuffer<float> d_lse(lse), d_scratch(scratch);
    cuda::AttentionBackward<T>(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                   s.Kernel(), kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    ExpectGradientsClose<T>(ToFloats(d_dqkv.Download()), dqkv, s);
  }
}

// The forward output feeds the backward on the GPU, as in training: the pair
// matches the CPU pair, and a second run gives the same bits (no atomics).
TYPED_TEST(CudaAttentionTest, ForwardThenBackwardMatchesCpuAndRepeatsBitForBit) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(23);
  const AttentionShape s = {2, 150, 80, 5};
  const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
  const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
  const int64_t n = s.B * s.T * s.C;
  DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out(n), d_dqkv(3 * n);
  DeviceBuffer<float> d_lse(s.B * s.NH * s.T), d_scratch(cuda::AttentionScratchElements(s.Kernel()));
  auto run = [&] {
    cuda::AttentionForward<T>(d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream);
    cuda::AttentionBackward<T>(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                   s.Kernel(), kStream);
    return std::make_pair(ToFloats(d_out.Download()), ToFloats(d_dqkv.Download()));
  };
  const auto first = run();
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  const auto second = run();
  EXPECT_EQ(first.first, second.first);
  EXPECT_EQ(first.second, second.second);
  std::vector<float> out(static_cast<size_t>(n)), lse(static_cast<size_t>(s.B * s.NH * s.T)), dqkv(qkv.size());
  cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(AllClose(first.first, out, Element<T>::kTolerance)) << "out";
  ExpectGradientsClose<T>(first.second, dqkv, s);
}

// Every forward and backward kernel on shape `s` (with `positions`, rows
// of packed examples; empty: one sequence a row) against the CPU's forms,
// the same bits on a second run, the variants with their base kernel's
// bits; fp32 runs the CUDA-core kernels.
template <typename T>
void ExpectEveryKernelMatchesCpu(const AttentionShape& s, const std::vector<int32_t>& positions, std::mt19937& rng) {
  using Forward = cuda::AttentionForwardKernel;
  using Backward = cuda::AttentionBackwardKernel;
  DeviceBuffer<int32_t> d_positions(positions.empty() ? std::vector<int32_t>(1, 0) : positions);
  kernels::AttentionShape shape = s.Kernel(), device_shape = s.Kernel();
  if (!positions.empty()) {
    shape.positions = positions.data();
    device_shape.positions = d_positions.get();
  }
  const auto qkv = RandomValues<T>(size_t(s.B * s.T * s.Row()), rng);
  const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
  std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.NH * s.T)), want(qkv.size());
  cpu::AttentionForward(out.data(), lse.data(), qkv.data(), shape);
  const std::vector<float> out_t = ToFloats(ToElements<T>(out));
  cpu::AttentionBackward(want.data(), dout.data(), qkv.data(), out_t.data(), lse.data(), shape);
  DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out_t(ToElements<T>(out_t));
  std::vector<float> mma_out;
  for (const Forward kernel : {Forward::kTensorCore, Forward::kMma, Forward::kMmaSharedQ, Forward::kMmaWide}) {
    SCOPED_TRACE(testing::Message() << Describe(s) << " forward " << int(kernel));
    DeviceBuffer<T> d_out(ToElements<T>(std::vector<float>(out.size(), kNaN)));
    DeviceBuffer<float> d_lse(std::vector<float>(lse.size(), kNaN));
    cuda::AttentionForward<T>(d_out.get(), d_lse.get(), d_qkv.get(), device_shape, kStream, kernel);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    const auto got = ToFloats(d_out.Download());
    EXPECT_TRUE(AllClose(got, out, Element<T>::kTolerance)) << "out";
    EXPECT_TRUE(AllClose(d_lse.Download(), lse, Element<float>::kTolerance)) << "lse";
    if (kernel == Forward::kMma) mma_out = got;
    if (kernel == Forward::kMmaSharedQ || kernel == Forward::kMmaWide) EXPECT_EQ(got, mma_out);
  }
  std::vector<float> two_pass;
  for (const Backward kernel : {Backward::kTensorCore, Backward::kMma, Backward::kMmaOnePass, Backward::kMmaWide}) {
    SCOPED_TRACE(testing::Message() << Describe(s) << " backward " << int(kernel));
    DeviceBuffer<T> d_dqkv(ToElements<T>(std::vector<float>(qkv.size(), kNaN)));
    DeviceBuffer<float> d_lse(lse);
    DeviceBuffer<float> d_scratch(std::vector<float>(size_t(cuda::AttentionScratchElements(shape, kernel)), kNaN));
    auto run = [&] {
      cuda::AttentionBackward<T>(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_out_t.get(),
                                 d_lse.get(), device_shape, kStream, kernel);
      return ToFloats(d_dqkv.Download());
    };
    const auto first = run();
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    ExpectGradientsClose<T>(first, want, s);
    EXPECT_EQ(first, run()) << "the same bits on a second run";
    if (kernel == Backward::kMma) two_pass = first;
    if (kernel == Backward::kMmaWide) EXPECT_EQ(first, two_pass) << "the variant changed the bits";
  }
}

// Grouped-query heads (query head h reads key/value head h / (NH / NKV)):
// every kernel. A group of one is the multi-head shape.
TYPED_TEST(CudaAttentionTest, GroupedQueryHeadsMatchCpuInEveryKernel) {
  PSTAR_REQUIRE_GPU();
  std::mt19937 rng(26);
  // Llama 3.2 1B's heads (32 of 64, 8 kv), 128-wide heads of 7 per kv head,
  // one kv head, head sizes the mma kernels do not take.
  constexpr AttentionShape kGrouped[] = {{1, 130, 2048, 32, 8}, {1, 200, 896, 7, 1}, {2, 70, 512, 4, 2},
                                         {1, 65, 384, 3, 1},    {1, 90, 96, 3, 1},   {1, 40, 64, 2, 2}};
  for (const AttentionShape& s : kGrouped) ExpectEveryKernelMatchesCpu<TypeParam>(s, {}, rng);
}

// Rows of packed examples (AttentionShape::positions: each query sees its
// own example's keys only): every kernel against the CPU's with the same
// positions, examples of 1 to 90 positions starting anywhere in a block.
TYPED_TEST(CudaAttentionTest, PackedExamplesMatchCpuInEveryKernel) {
  PSTAR_REQUIRE_GPU();
  std::mt19937 rng(27);
  constexpr AttentionShape kPacked[] = {{2, 200, 512, 8, 2}, {1, 150, 1024, 8, 8}, {1, 90, 96, 3, 1}};
  for (const AttentionShape& s : kPacked) {
    std::vector<int32_t> positions;
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t t = 0; t < s.T;) {
        const int64_t len = std::uniform_int_distribution<int64_t>(1, 90)(rng);
        for (int64_t i = 0; i < len && t < s.T; ++i, ++t) positions.push_back(int32_t(i));
      }
    }
    ExpectEveryKernelMatchesCpu<TypeParam>(s, positions, rng);
  }
}

}  // namespace
}  // namespace pstar::test
