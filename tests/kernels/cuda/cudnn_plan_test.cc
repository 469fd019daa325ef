// The cuDNN attention route's graphs against the real cuDNN library on any
// host, GPU or not: cuDNN 9.8's deviceless planning builds the forward and
// the deterministic backward graph for an H100 described by its device
// properties, runs cuDNN's heuristic and its support checks, and takes the
// engine configuration the route would run, without compiling a kernel.
// An A100 is planned too. Those checks need a CUDA driver library loaded: the host's where it has
// one, else the toolkit's stub (which can load nothing, and need not). Own
// binary, so the stub never serves another test.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/attention.h"
#include "kernels/cuda/cudnn_attention.h"

namespace pstar::test {
namespace {

namespace cuda = kernels::cuda;

// An H100 SXM's properties in cuDNN's device-properties JSON (the fields
// cuDNN 9.8+ reads): 132 SMs, 227 KiB of shared memory a block, 50 MiB of
// L2, compute capability 9.0.
constexpr char kH100[] = R"({"deviceName":"NVIDIA H100 80GB HBM3","deviceVer":900,"driverVer":13000,
"multiProcessorCount":132,"maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,
"reservedSharedMemoryPerBlock":1024,"regsPerBlock":65536,"maxRegistersPerSM":65536,"maxCtasPerSM":32,
"maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"warpSize":32,"maxGridSize":[2147483647,65535,65535],
"maxBlockSize":[1024,1024,64],"l2CacheSize":52428800,"totalGlobalMem":85017755648,"smClockRateKHz":1980000,
"memClockRateKHz":2619000,"pciDeviceId":0,"isTccDriver":0,"supportCoopLaunch":1,"cudaDeviceId":0})";

// An A100 SXM's: 108 SMs, 163 KiB of shared memory a block, 40 MiB of L2,
// compute capability 8.0.
constexpr char kA100[] = R"({"deviceName":"NVIDIA A100-SXM4-80GB","deviceVer":800,"driverVer":13000,
"multiProcessorCount":108,"maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":166912,
"reservedSharedMemoryPerBlock":1024,"regsPerBlock":65536,"maxRegistersPerSM":65536,"maxCtasPerSM":32,
"maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"warpSize":32,"maxGridSize":[2147483647,65535,65535],
"maxBlockSize":[1024,1024,64],"l2CacheSize":41943040,"totalGlobalMem":85031714816,"smClockRateKHz":1410000,
"memClockRateKHz":1593000,"pciDeviceId":0,"isTccDriver":0,"supportCoopLaunch":1,"cudaDeviceId":0})";

// The driver library cuDNN's support checks look for: the host's, else the
// toolkit's stub under the same name. "" when loaded, else why not.
std::string LoadADriverLibrary() {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) return "";
  if (dlopen(PSTAR_CUDA_DRIVER_STUB, RTLD_NOW | RTLD_GLOBAL) != nullptr) return "";
  const char* err = dlerror();
  return std::string("neither libcuda.so.1 nor the toolkit's stub loads: ") + (err != nullptr ? err : "");
}

class CudnnPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
    const std::string driver = LoadADriverLibrary();
    ASSERT_EQ(driver, "");
    std::string why;
    route_ = cuda::CudnnAttention::OpenForDevice(kH100, &why);
    if (route_ == nullptr && why.rfind("cannot load libcudnn.so.9", 0) == 0) {
      GTEST_SKIP() << "libcudnn.so.9 is not on this host's loader path: " << why;
    }
    ASSERT_NE(route_, nullptr) << why;
  }
  std::unique_ptr<cuda::CudnnAttention> route_;
};

// A multi-head shape of B sequences, T positions, C columns of NH heads.
kernels::AttentionShape Mha(int64_t B, int64_t T, int64_t C, int64_t NH) { return {B, T, NH, NH, NH > 0 ? C / NH : 0}; }

struct Shape {
  int64_t B, T, C, NH;
};

// GPT-2's attention at the benchmark's batch and the training step's, the
// width-4096 models' head size 128, off-block T, a single position, head
// sizes 32 and 96: cuDNN takes both graphs in both 16-bit formats. The
// backward's workspace holds at least the 16-bit dp of every head (its
// deterministic form: dq by one product, no fp32 sum), the forward's next
// to nothing.
TEST_F(CudnnPlanTest, TakesBothGraphsAtEveryShapeTheRouteServes) {
  const Shape shapes[] = {{8, 1024, 768, 12}, {32, 1024, 768, 12}, {4, 2048, 4096, 32},
                          {2, 200, 768, 12},  {1, 1, 64, 1},       {2, 70, 96, 3}};
  for (const bool bf16 : {true, false}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(testing::Message() << (bf16 ? "bf16" : "fp16") << " B=" << s.B << " T=" << s.T << " C=" << s.C
                                      << " NH=" << s.NH);
      const int64_t forward = route_->WorkspaceBytes(false, bf16, Mha(s.B, s.T, s.C, s.NH));
      EXPECT_GE(forward, 0) << route_->last_error();
      EXPECT_LE(forward, 1 << 20);
      const int64_t backward = route_->WorkspaceBytes(true, bf16, Mha(s.B, s.T, s.C, s.NH));
      EXPECT_GE(backward, s.B * s.NH * s.T * s.T * 2) << route_->last_error();
    }
  }
}

// Grouped-query heads (Llama 3.2 1B's 4 a key/value head at head size 64,
// Qwen2.5 7B's 7 at 128, one key/value head): cuDNN broadcasts each
// key/value head to its group in both graphs; the backward's workspace also
// holds every query head's dK and dV (fp32) for the group sums. Calls slice into
// whole groups.
TEST_F(CudnnPlanTest, TakesGroupedQueryHeadsInWholeGroups) {
  const kernels::AttentionShape shapes[] = {{4, 2048, 32, 8, 64}, {1, 1024, 28, 4, 128}, {2, 200, 6, 1, 64}};
  for (const kernels::AttentionShape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV);
    const int64_t forward = route_->WorkspaceBytes(false, true, s);
    EXPECT_GE(forward, 0) << route_->last_error();
    const int64_t backward = route_->WorkspaceBytes(true, true, s);
    EXPECT_GE(backward, s.B * s.NH * s.T * s.T * 2 + 2 * s.B * s.NH * s.T * s.hs * 4) << route_->last_error();
    const int64_t group = s.NH / s.NKV;
    // A call of part of a group is refused; the most whole groups that fit run.
    if (group > 1) {
      EXPECT_EQ(route_->WorkspaceBytes(true, true, s, group - 1), -1);
      EXPECT_NE(route_->last_error().find("not an attention shape"), std::string::npos) << route_->last_error();
    }
    kernels::AttentionShape one = s;
    one.B = 1;
    const int64_t one_group = route_->WorkspaceBytes(true, true, one, group);
    ASSERT_GE(one_group, 0) << route_->last_error();
    const auto slice = route_->SliceFor(true, true, s, size_t(one_group));
    EXPECT_EQ(slice.sequences, 1);
    EXPECT_EQ(slice.heads % group, 0);
    EXPECT_LE(route_->WorkspaceBytes(true, true, one, slice.heads), one_group);
    const auto none = route_->SliceFor(true, true, s, size_t(one_group - 1));
    EXPECT_EQ(none.sequences, 0);
    if (group > 1) {
      EXPECT_NE(route_->last_error().find("even one group of heads"), std::string::npos) << route_->last_error();
    }
  }
}

// Within the training step's scratch (the planned attention term,
// kernels::GpuAttentionScratchElements) each call is the largest that fits:
// GPT-2's batch of 32 runs whole sequences, fewer than 32 a call; the
// width-4096 models' 32 heads at T 2048 run groups of one sequence's heads.
// A call of the next size up would not fit.
TEST_F(CudnnPlanTest, SlicesEachCallToTheWorkspaceGiven) {
  const Shape shapes[] = {{32, 1024, 768, 12}, {4, 2048, 4096, 32}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const size_t avail = size_t(kernels::GpuAttentionScratchElements(s.B, s.T, s.C, s.NH, true) * 4);
    const auto slice = route_->SliceFor(true, true, Mha(s.B, s.T, s.C, s.NH), avail);
    ASSERT_GT(slice.sequences, 0) << route_->last_error();
    EXPECT_LE(route_->WorkspaceBytes(true, true, Mha(slice.sequences, s.T, s.C, s.NH), slice.heads),
              int64_t(avail));
    if (slice.heads == s.NH) {
      EXPECT_LT(slice.sequences, s.B);
      EXPECT_GT(route_->WorkspaceBytes(true, true, Mha(slice.sequences + 1, s.T, s.C, s.NH)), int64_t(avail));
    } else {
      EXPECT_EQ(slice.sequences, 1);
      EXPECT_EQ(s.NH % slice.heads, 0);
      int64_t next = slice.heads + 1;
      while (s.NH % next != 0) ++next;
      EXPECT_GT(route_->WorkspaceBytes(true, true, Mha(1, s.T, s.C, s.NH), next), int64_t(avail));
    }
    // Everything at once where the workspace is the whole need; nothing
    // where not one head fits.
    const int64_t whole = route_->WorkspaceBytes(true, true, Mha(s.B, s.T, s.C, s.NH));
    const auto all = route_->SliceFor(true, true, Mha(s.B, s.T, s.C, s.NH), size_t(whole));
    EXPECT_EQ(all.sequences, s.B);
    EXPECT_EQ(all.heads, s.NH);
    const auto none = route_->SliceFor(true, true, Mha(s.B, s.T, s.C, s.NH), 1024);
    EXPECT_EQ(none.sequences, 0);
    EXPECT_NE(route_->last_error().find("even one head of one sequence"), std::string::npos) << route_->last_error();
  }
}

// The other architecture the build targets: an A100 takes both graphs too.
TEST(CudnnPlanDevice, AnA100TakesBothGraphs) {
  if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
  ASSERT_EQ(LoadADriverLibrary(), "");
  std::string why;
  auto route = cuda::CudnnAttention::OpenForDevice(kA100, &why);
  if (route == nullptr && why.rfind("cannot load libcudnn.so.9", 0) == 0) GTEST_SKIP() << why;
  ASSERT_NE(route, nullptr) << why;
  for (const bool backward : {false, true}) {
    EXPECT_GE(route->WorkspaceBytes(backward, true, Mha(8, 1024, 768, 12)), 0) << route->last_error();
    EXPECT_GE(route->WorkspaceBytes(backward, false, Mha(4, 2048, 4096, 32)), 0) << route->last_error();
  }
}

// What the route refuses itself, in one line naming the shape and why.
TEST_F(CudnnPlanTest, RefusesShapesOutsideTheRouteInOneLine) {
  EXPECT_EQ(route_->WorkspaceBytes(false, true, Mha(2, 64, 12, 3)), -1);  // head size 4
  EXPECT_EQ(route_->last_error(),
            "cuDNN attention forward (B 2, T 64, C 12, NH 3): head size 4 is not a multiple of 8 up to 256");
  EXPECT_EQ(route_->WorkspaceBytes(true, true, Mha(0, 64, 64, 1)), -1);
  EXPECT_EQ(route_->last_error(), "cuDNN attention backward (B 0, T 64, C 64, NH 1): not an attention shape");
  // A refusal is remembered with its reason.
  EXPECT_EQ(route_->WorkspaceBytes(false, true, Mha(2, 64, 12, 3)), -1);
  EXPECT_NE(route_->last_error().find("head size 4"), std::string::npos);
}

// Opened for planning, nothing runs: Forward and Backward refuse in one line.
TEST_F(CudnnPlanTest, PlanningOnlyRunsNothing) {
  EXPECT_FALSE(route_->Forward(true, nullptr, nullptr, nullptr, Mha(1, 64, 64, 1), nullptr, nullptr, 0));
  EXPECT_EQ(route_->last_error(), "cuDNN attention opened for planning only (no device)");
  EXPECT_FALSE(
      route_->Backward(true, nullptr, nullptr, nullptr, nullptr, nullptr, Mha(1, 64, 64, 1), nullptr, nullptr, 0));
  EXPECT_EQ(route_->last_error(), "cuDNN attention opened for planning only (no device)");
}

TEST(CudnnPlanDevice, RefusesDevicePropertiesItCannotRead) {
  if (!cuda::CudnnAttention::Built()) GTEST_SKIP() << "built without cuDNN's headers";
  std::string why;
  auto route = cuda::CudnnAttention::OpenForDevice("{\"deviceVer\": ", &why);
  if (route == nullptr && why.rfind("cannot load libcudnn.so.9", 0) == 0) GTEST_SKIP() << why;
  EXPECT_EQ(route, nullptr);
  EXPECT_EQ(why.rfind("read the device properties: ", 0), 0u) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

}  // namespace
}  // namespace pstar::test
