// The cuDNN attention route (kernels/cuda/cudnn_attention.h): loading the
// library and refusing in one line where it cannot (on any host), then on a
// GPU its forward and deterministic backward against the CPU kernels at the
// 16-bit tolerance, the same bits on a repeat, in batch slices as in one
// call, and fed by (or feeding) pstar's own kernels.
#include "kernels/cuda/cudnn_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/attention_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

// A multi-head shape of B sequences, T positions, C columns of NH heads.
kernels::AttentionShape Mha(int64_t B, int64_t T, int64_t C, int64_t NH) { return {B, T, NH, NH, NH > 0 ? C / NH : 0}; }

constexpr cudaStream_t kStream = nullptr;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CudnnAttentionOpen, RefusesALibraryThatIsNotThereInOneLine) {
  ScopedEnv env("PSTAR_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9");
  std::string why;
  EXPECT_EQ(cuda::CudnnAttention::Open(&why), nullptr);
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  if (cuda::CudnnAttention::Built()) {
    EXPECT_NE(why.find("cannot load /nonexistent/libcudnn.so.9"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("no cuDNN route"), std::string::npos) << why;
  }
}

TEST(CudnnAttentionOpen, RefusesALibraryThatIsNotCudnn) {
  if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
  ScopedEnv env("PSTAR_CUDNN_LIBRARY", "libm.so.6");  // loads, but has none of cuDNN's functions
  std::string why;
  EXPECT_EQ(cuda::CudnnAttention::Open(&why), nullptr);
  EXPECT_EQ(why, "libm.so.6 lacks cudnnGetVersion (not cuDNN 9)");
}

// The library loads, every function resolves and its version is no older
// than the build's: with a GPU a handle is made; without one the refusal
// names cudnnCreate, the first step that needs a device.
TEST(CudnnAttentionOpen, LoadsTheLibraryOrNamesTheStepThatFailed) {
  if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
  std::string why;
  auto route = cuda::CudnnAttention::Open(&why);
  if (route == nullptr && why.rfind("cannot load libcudnn.so.9", 0) == 0) {
    GTEST_SKIP() << "libcudnn.so.9 is not on this host's loader path: " << why;
  }
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  if (VisibleGpus() > 0) {
    ASSERT_NE(route, nullptr) << why;
    EXPECT_GE(route->version(), cuda::CudnnAttention::BuildVersion());
  } else {
    EXPECT_EQ(route, nullptr);
    EXPECT_EQ(why.rfind("cudnnCreate: ", 0), 0u) << why;
  }
}

// The GPU as cuDNN describes it plans the same graphs without the handle:
// what cudnn_plan_test does on hosts with no GPU.
TEST(CudnnAttentionOpen, DescribesItsGpuForPlanningWithoutIt) {
  PSTAR_REQUIRE_GPU();
  if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
  std::string why;
  auto route = cuda::CudnnAttention::Open(&why);
  ASSERT_NE(route, nullptr) << why;
  const std::string json = route->DeviceJson();
  ASSERT_FALSE(json.empty()) << route->last_error();
  auto planner = cuda::CudnnAttention::OpenForDevice(json, &why);
  ASSERT_NE(planner, nullptr) << why;
  for (const bool backward : {false, true}) {
    EXPECT_GE(planner->WorkspaceBytes(backward, true, Mha(8, 1024, 768, 12)), 0) << planner->last_error();
    EXPECT_GE(route->WorkspaceBytes(backward, true, Mha(8, 1024, 768, 12)), 0) << route->last_error();
  }
}

// The route opened on this GPU for each test: a GPU host with a cuDNN build
// must run it, so failing to open is a failure naming why.
template <typename T>
class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PSTAR_REQUIRE_GPU();
    if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
    std::string why;
    route_ = cuda::CudnnAttention::Open(&why);
    ASSERT_NE(route_, nullptr) << why;
  }
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;
  std::unique_ptr<cuda::CudnnAttention> route_;
};
using SixteenBitTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudnnAttentionTest, SixteenBitTypes, ElementName);

// Head sizes 64 and 128 (GPT-2's and the large models'), 32 and 96; T on
// and off the 64-position block, a single position; grouped-query heads (4
// of 64 a key/value head, 7 of 128 on one, 2 of 32).
constexpr AttentionShape kShapes[] = {{2, 200, 768, 12}, {1, 129, 256, 2},    {2, 64, 128, 2},
                                      {2, 70, 96, 3},    {1, 1, 64, 1},       {3, 96, 384, 4},
                                      {2, 130, 512, 8, 2}, {1, 200, 896, 7, 1}, {1, 70, 128, 4, 2}};

TYPED_TEST(CudnnAttentionTest, ForwardMatchesCpuAndRepeatsBitForBit) {
  using T = TypeParam;
  auto& route = this->route_;
  const bool bf16 = TestFixture::kBf16;
  std::mt19937 rng(31);
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * s.Row()), rng);
    std::vector<float> out(size_t(s.B * s.T * s.C), kNaN), lse(size_t(s.B * s.NH * s.T), kNaN);
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_out(ToElements<T>(out));
    DeviceBuffer<float> d_lse(lse);
    const int64_t need = route->WorkspaceBytes(false, bf16, s.Kernel());
    ASSERT_GE(need, 0) << route->last_error();
    DeviceBuffer<char> workspace(std::max<int64_t>(need, 16));
    auto run = [&] {
      EXPECT_TRUE(route->Forward(bf16, d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream,
                                 workspace.get(), size_t(workspace.size())))
          << route->last_error();
      return std::make_pair(ToFloats(d_out.Download()), d_lse.Download());
    };
    const auto first = run();
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.Kernel());
    EXPECT_TRUE(AllClose(first.first, out, Element<T>::kTolerance)) << "out";
    // The natural log-sum-exp of the scaled scores, as the CPU kernels keep
    // it (so each route's forward feeds the other's backward).
    EXPECT_TRUE(AllClose(first.second, lse, Element<T>::kTolerance)) << "lse";
    const auto second = run();
    EXPECT_EQ(first.first, second.first);
    EXPECT_EQ(first.second, second.second);
  }
}

// Backward from the CPU forward's results (out rounded to T): the
// deterministic graph matches the CPU kernels and repeats its bits.
TYPED_TEST(CudnnAttentionTest, BackwardMatchesCpuAndRepeatsBitForBit) {
  using T = TypeParam;
  auto& route = this->route_;
  const bool bf16 = TestFixture::kBf16;
  std::mt19937 rng(32);
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    const auto qkv = RandomValues<T>(size_t(s.B * s.T * s.Row()), rng);
    const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
    std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.NH * s.T));
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.Kernel());
    out = ToFloats(ToElements<T>(out));
    std::vector<float> want(qkv.size());
    cpu::AttentionBackward(want.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.Kernel());
    DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout)), d_out(ToElements<T>(out));
    DeviceBuffer<T> d_dqkv(ToElements<T>(std::vector<float>(qkv.size(), kNaN)));
    DeviceBuffer<float> d_lse(lse);
    const int64_t need = route->WorkspaceBytes(true, bf16, s.Kernel());
    ASSERT_GE(need, 0) << route->last_error();
    // NaN in the workspace: nothing may be read before it is written.
    DeviceBuffer<float> workspace(std::vector<float>(size_t(need / 4 + 4), kNaN));
    auto run = [&] {
      EXPECT_TRUE(route->Backward(bf16, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), s.Kernel(),
                                  kStream, workspace.get(), size_t(workspace.size()) * 4))
          << route->last_error();
      return ToFloats(d_dqkv.Download());
    };
    const auto first = run();
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    ExpectGradientsClose<T>(first, want, s);
    EXPECT_EQ(first, run()) << "not deterministic";
  }
}

// A workspace for one sequence: the batch runs in slices, each sequence as
// in one call; for half of one sequence's heads: groups of heads, the same
// (to the 16-bit tolerance: a smaller call's graph may pick another engine
// configuration than the whole batch's).
TYPED_TEST(CudnnAttentionTest, RunsInBatchSlicesWhenTheWorkspaceIsShort) {
  using T = TypeParam;
  auto& route = this->route_;
  const bool bf16 = TestFixture::kBf16;
  const AttentionShape s = {5, 300, 512, 8};
  std::mt19937 rng(33);
  const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
  const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
  DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout));
  const int64_t whole = route->WorkspaceBytes(true, bf16, s.Kernel());
  const int64_t one = route->WorkspaceBytes(true, bf16, Mha(1, s.T, s.C, s.NH));
  ASSERT_GE(whole, 0) << route->last_error();
  ASSERT_GE(one, 0) << route->last_error();
  auto pass = [&](int64_t bytes) {
    DeviceBuffer<T> d_out(s.B * s.T * s.C), d_dqkv(s.B * s.T * 3 * s.C);
    DeviceBuffer<float> d_lse(s.B * s.NH * s.T);
    DeviceBuffer<char> workspace(std::max<int64_t>(bytes, 16));
    EXPECT_TRUE(route->Forward(bf16, d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream,
                               workspace.get(), size_t(bytes)))
        << route->last_error();
    EXPECT_TRUE(route->Backward(bf16, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                s.Kernel(), kStream, workspace.get(), size_t(bytes)))
        << route->last_error();
    return std::make_pair(ToFloats(d_out.Download()), ToFloats(d_dqkv.Download()));
  };
  const int64_t half_heads = route->WorkspaceBytes(true, bf16, Mha(1, s.T, s.C, s.NH), s.NH / 2);
  ASSERT_GE(half_heads, 0) << route->last_error();
  const auto all = pass(whole);
  const auto sliced = pass(one);
  const auto grouped = pass(half_heads);  // one sequence's heads in two calls
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_TRUE(AllClose(sliced.first, all.first, Element<T>::kTolerance)) << "out";
  ExpectGradientsClose<T>(sliced.second, all.second, s);
  ExpectGradientsClose<T>(grouped.second, all.second, s);
  // Less than one sequence needs: refused, nothing run.
  if (one > 0) {
    DeviceBuffer<T> d_out(s.B * s.T * s.C), d_dqkv(s.B * s.T * 3 * s.C);
    DeviceBuffer<float> d_lse(s.B * s.NH * s.T);
    DeviceBuffer<char> workspace(one);
    EXPECT_FALSE(route->Backward(bf16, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                s.Kernel(), kStream, workspace.get(), size_t(one - 1)));
    EXPECT_NE(route->last_error().find("workspace"), std::string::npos) << route->last_error();
  }
}

// Either route's forward feeds either route's backward: pstar's forward
// with cuDNN's backward, and cuDNN's forward with pstar's backward, both
// match the CPU pair.
TYPED_TEST(CudnnAttentionTest, MixesWithPstarsKernels) {
  using T = TypeParam;
  auto& route = this->route_;
  const bool bf16 = TestFixture::kBf16;
  const AttentionShape s = {2, 200, 768, 12};
  std::mt19937 rng(34);
  const auto qkv = RandomValues<T>(size_t(s.B * s.T * 3 * s.C), rng);
  const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
  std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.NH * s.T)), want(qkv.size());
  cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  const std::vector<float> rounded_out = ToFloats(ToElements<T>(out));
  cpu::AttentionBackward(want.data(), dout.data(), qkv.data(), rounded_out.data(), lse.data(), s.B, s.T, s.C, s.NH);
  DeviceBuffer<T> d_qkv(ToElements<T>(qkv)), d_dout(ToElements<T>(dout));
  const int64_t need = std::max(route->WorkspaceBytes(true, bf16, s.Kernel()),
                                route->WorkspaceBytes(false, bf16, s.Kernel()));
  ASSERT_GE(need, 0) << route->last_error();
  DeviceBuffer<char> workspace(std::max<int64_t>(need, 16));
  const kernels::AttentionShape shape = {s.B, s.T, s.NH, s.NH, s.C / s.NH};
  DeviceBuffer<float> scratch(cuda::AttentionScratchElements(shape, cuda::AttentionBackwardKernel::kMma));
  for (const bool cudnn_forward : {false, true}) {
    SCOPED_TRACE(cudnn_forward ? "cuDNN forward, pstar backward" : "pstar forward, cuDNN backward");
    DeviceBuffer<T> d_out(s.B * s.T * s.C), d_dqkv(s.B * s.T * 3 * s.C);
    DeviceBuffer<float> d_lse(s.B * s.NH * s.T);
    if (cudnn_forward) {
      ASSERT_TRUE(route->Forward(bf16, d_out.get(), d_lse.get(), d_qkv.get(), s.Kernel(), kStream,
                                 workspace.get(), size_t(need)))
          << route->last_error();
      cuda::AttentionBackward<T>(d_dqkv.get(), scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), shape,
                                 kStream, cuda::AttentionBackwardKernel::kMma);
    } else {
      cuda::AttentionForward<T>(d_out.get(), d_lse.get(), d_qkv.get(), shape, kStream,
                                cuda::AttentionForwardKernel::kMma);
      ASSERT_TRUE(route->Backward(bf16, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                s.Kernel(), kStream, workspace.get(), size_t(need)))
          << route->last_error();
    }
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    EXPECT_TRUE(AllClose(ToFloats(d_out.Download()), out, Element<T>::kTolerance)) << "out";
    ExpectGradientsClose<T>(ToFloats(d_dqkv.Download()), want, s);
  }
}

}  // namespace
}  // namespace pstar::test
