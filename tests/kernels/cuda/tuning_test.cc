// The tuning table and the knobs (no GPU needed): every committed row names
// a knob and one of its candidates, every default is a candidate the tuner
// times, and a GPU kind without rows runs the defaults. On a GPU, each knob's
// candidates compute the same values (bench/cuda_tuning_bench.cu times them).
#include "kernels/cuda/tuning.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/classifier.h"
#include "kernels/cuda/matmul.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cuda = kernels::cuda;

TEST(KernelTuning, TheCommittedTableNamesKnobsAndTheirCandidates) {
  EXPECT_EQ(cuda::CheckTuningTable(), "");
  std::set<std::string> names;
  const cuda::KernelTuning defaults;
  for (const cuda::TuningKnob& knob : cuda::TuningKnobs()) {
    EXPECT_TRUE(names.insert(knob.name).second) << "one knob per name: " << knob.name;
    EXPECT_GE(knob.candidates.size(), 2u) << knob.name << ": something to choose between";
    const int value = defaults.*(knob.field);
    EXPECT_NE(std::find(knob.candidates.begin(), knob.candidates.end(), value), knob.candidates.end())
        << knob.name << ": the default " << value << " is a candidate";
  }
  for (const cuda::TuningRow& row : cuda::TuningTable()) {
    EXPECT_GT(std::string(row.gpu).size(), 0u);
    EXPECT_GT(std::string(row.where).size(), 0u) << "every row says where it was measured";
  }
}

TEST(KernelTuning, AGpuWithoutRowsRunsTheDefaults) {
  const cuda::KernelTuning t = cuda::TuningFor("a GPU no table row names");
  const cuda::KernelTuning defaults;
  for (const cuda::TuningKnob& knob : cuda::TuningKnobs()) EXPECT_EQ(t.*(knob.field), defaults.*(knob.field));
}

bool IsArchitecture(const std::string& gpu) { return gpu.rfind("sm_", 0) == 0; }

int Value(const cuda::KernelTuning& t, const std::string& knob_name) {
  for (const cuda::TuningKnob& knob : cuda::TuningKnobs()) {
    if (knob_name == knob.name) return t.*(knob.field);
  }
  ADD_FAILURE() << "no knob " << knob_name;
  return -1;
}

// A kind's own rows are taken, also over its architecture's; an
// architecture's rows serve a kind of it that has none of its own, and only
// that architecture.
TEST(KernelTuning, EveryRowIsTakenAndAKindsOwnRowsWinOverItsArchitectures) {
  const cuda::KernelTuning defaults;
  for (const cuda::TuningRow& row : cuda::TuningTable()) {
    SCOPED_TRACE(std::string(row.gpu) + " " + row.knob);
    if (IsArchitecture(row.gpu)) {
      const int cc = std::stoi(std::string(row.gpu).substr(3));
      EXPECT_EQ(Value(cuda::TuningFor("a GPU no table row names", cc), row.knob), row.value);
      EXPECT_EQ(Value(cuda::TuningFor("a GPU no table row names", cc + 1), row.knob), Value(defaults, row.knob));
      EXPECT_EQ(Value(cuda::TuningFor("a GPU no table row names"), row.knob), Value(defaults, row.knob));
    } else {
      EXPECT_EQ(Value(cuda::TuningFor(row.gpu), row.knob), row.value);
      for (const cuda::TuningRow& arch : cuda::TuningTable()) {
        if (!IsArchitecture(arch.gpu)) continue;
        const int cc = std::stoi(std::string(arch.gpu).substr(3));
        EXPECT_EQ(Value(cuda::TuningFor(row.gpu, cc), row.knob), row.value) << "under " << arch.gpu;
      }
    }
  }
}

TEST(KernelTuning, MalformedRowsAreNamedInOneLine) {
  const std::vector<cuda::TuningRow> good = {{"NVIDIA H200", "attention_forward", 1, "a call"},
                                             {"sm_90", "attention_backward", 2, "a call"}};
  EXPECT_EQ(cuda::CheckTuningRows(good), "");
  const struct {
    cuda::TuningRow row;
    const char* says;
  } bad[] = {{{"NVIDIA H200", "attention_sideways", 1, "a call"}, "no knob of that name"},
             {{"NVIDIA H200", "attention_forward", 7, "a call"}, "not one of the knob's candidates"},
             {{"", "attention_forward", 1, "a call"}, "no GPU kind"},
             {{"sm_9x", "attention_forward", 1, "a call"}, "as sm_90"},
             {{"sm_", "attention_forward", 1, "a call"}, "as sm_90"},
             {{"sm_090", "attention_forward", 1, "a call"}, "as sm_90"}};
  for (const auto& b : bad) {
    const std::string problem = cuda::CheckTuningRows({b.row});
    EXPECT_NE(problem.find(b.says), std::string::npos) << b.row.gpu << " " << b.row.knob << ": " << problem;
    EXPECT_EQ(problem.find('\n'), std::string::npos) << "one line";
  }
}

// PSTAR_KERNEL_TUNING's pairs over a kind's tuning: all applied, or none
// and the first bad pair named in one line.
TEST(KernelTuning, OverridesApplyEveryPairOrNone) {
  cuda::KernelTuning t = cuda::TuningFor("NVIDIA H200", 90);
  const cuda::KernelTuning before = t;
  EXPECT_EQ(cuda::ApplyTuningOverrides("attention_forward=4,attention_backward=6,", &t), "");
  EXPECT_EQ(t.attention_forward, 4);
  EXPECT_EQ(t.attention_backward, 6);
  EXPECT_EQ(t.cross_entropy_threads, before.cross_entropy_threads) << "knobs not named keep the table's value";
  const struct {
    const char* spec;
    const char* says;
  } bad[] = {{"attention_forward=1,attention_sideways=2", "no kernel tuning knob \"attention_sideways\""},
             {"attention_forward=1,attention_backward=9", "attention_backward=9: not one of its candidates (0, 1, 2"},
             {"attention_forward", "\"attention_forward\" is not knob=value"},
             {"attention_forward=", "attention_forward=: not one of its candidates"},
             {"attention_forward=1x", "attention_forward=1x: not one of its candidates"},
             {"attention_forward=99999999999999999999", "attention_forward=99999999999999999999: not one of"},
             {"attention_forward=-1", "attention_forward=-1: not one of its candidates"},
             {"=1", "no kernel tuning knob \"\""}};
  for (const auto& b : bad) {
    cuda::KernelTuning u = before;
    const std::string problem = cuda::ApplyTuningOverrides(b.spec, &u);
    EXPECT_NE(problem.find(b.says), std::string::npos) << b.spec << ": " << problem;
    EXPECT_EQ(problem.find('\n'), std::string::npos) << "one line";
    EXPECT_EQ(u.attention_forward, before.attention_forward) << b.spec << ": nothing applied";
  }
}

// On a GPU: every candidate of every knob gives the default's values.
TEST(KernelTuning, EveryCandidateComputesTheSameValues) {
  PSTAR_REQUIRE_GPU();
  std::mt19937 rng(41);
  // The cross-entropy at each block size: the same losses and dlogits.
  const int64_t N = 9, V = 5003;
  const auto logits = RandomValues<float>(size_t(N * V), rng, 2.0f);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& t : targets) t = int32_t(rng() % uint32_t(V));
  DeviceBuffer<int32_t> d_targets(targets);
  std::vector<float> base_losses, base_grad;
  for (int threads : {512, 256, 1024}) {
    SCOPED_TRACE("cross_entropy_threads " + std::to_string(threads));
    DeviceBuffer<float> d_logits(logits), d_losses(N);
    cuda::CrossEntropy<float>(d_losses.get(), d_logits.get(), d_targets.get(), 0.5f, true, N, V, V, nullptr,
                              threads);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    if (base_losses.empty()) {
      base_losses = d_losses.Download();
      base_grad = d_logits.Download();
      continue;
    }
    EXPECT_TRUE(AllClose(d_losses.Download(), base_losses, 1e-6)) << "losses";
    EXPECT_TRUE(AllClose(d_logits.Download(), base_grad, 1e-6)) << "dlogits";
  }
  // The bias gradient at each group size: the same sums.
  const int64_t rows = 20000, cols = 300;
  const auto dy = RandomValues<float>(size_t(rows * cols), rng);
  DeviceBuffer<float> d_dy(dy), scratch(cuda::BiasGradientScratchElements(rows, cols));
  std::vector<float> base;
  for (int group_rows : {64, 32, 128, 256}) {
    SCOPED_TRACE("bias_grad_group_rows " + std::to_string(group_rows));
    DeviceBuffer<float> d_bias(std::vector<float>(size_t(cols), 0.0f));
    cuda::AddBiasGradient<float, float>(d_bias.get(), scratch.get(), d_dy.get(), rows, cols, nullptr, group_rows);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    if (base.empty()) {
      base = d_bias.Download();
      continue;
    }
    EXPECT_TRUE(AllClose(d_bias.Download(), base, 1e-5)) << "bias gradient";
  }
}

}  // namespace
}  // namespace pstar::test
