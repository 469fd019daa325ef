// Mixed precision on the CPU backend, which rounds the linear layers'
// operands exactly as the GPU's 16-bit GEMMs read them: bf16 and fp16 train
// and differ from fp32 by rounding only; every device budget gives the same
// bits; fp16 overflows skip the step and lower the loss scale, clean windows
// raise it, and the scale survives a checkpoint. Gradients kept in 16 bits
// (train.grad_precision: 16bit) train as well, halve the gradients' host
// homes, and give the same bits for every budget too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tests/test_util.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

struct TrainedRun {
  std::vector<StepStats> steps;
  std::vector<std::vector<float>> params, exp_avg_sq;
};

TrainedRun Train(const Config& config, const TokenSource& data) {
  TrainedRun r;
  auto t = Trainer::Create(config, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return r;
  for (int64_t s = 0; s < config.train.steps; ++s) {
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok()) << st.status().message();
    if (!st.ok()) return r;
    r.steps.push_back(*st);
  }
  r.params = test::TensorCopies((*t)->store(), StateKind::kParam);
  r.exp_avg_sq = test::TensorCopies((*t)->store(), StateKind::kExpAvgSq);
  return r;
}

std::vector<float> Losses(const TrainedRun& r) {
  std::vector<float> out;
  for (const StepStats& s : r.steps) out.push_back(s.loss);
  return out;
}

bool SameBits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

Config Make(std::vector<std::string> overrides) { return test::TinyGptConfig(overrides); }

// A text the tiny model can learn (random tokens cannot go below ln 40): a
// period-13 cycle with a little noise.
VectorTokenSource LearnableTokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = rng() % 10 == 0 ? int32_t(rng() % 40) : int32_t((i * 7) % 13);
  return VectorTokenSource(std::move(t));
}

// The invariants every decoder keeps, on the tiny GPT-2 and Llama jobs.
using MixedPrecisionFamilies = test::TinyFamilyTest;
INSTANTIATE_TEST_SUITE_P(Decoders, MixedPrecisionFamilies, testing::ValuesIn(test::TinyFamilies()),
                         test::TinyFamilyName);

TEST_P(MixedPrecisionFamilies, Bf16AndFp16TrainAndDifferFromFp32ByRoundingOnly) {
  auto data = LearnableTokens(4000, 21);
  const TrainedRun fp32 = Train(Job({"train.steps=25"}), data);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const TrainedRun low = Train(Job({"train.steps=25", std::string("train.precision=") + precision,
                                "fp16.initial_scale_power=8"}),
                          data);
    ASSERT_EQ(low.steps.size(), fp32.steps.size());
    EXPECT_NE(Losses(low), Losses(fp32)) << "the rounding must show";
    for (size_t s = 0; s < fp32.steps.size(); ++s) {
      EXPECT_TRUE(std::isfinite(low.steps[s].loss));
      EXPECT_NEAR(low.steps[s].loss, fp32.steps[s].loss, 0.03 * fp32.steps[s].loss) << "step " << s;
      EXPECT_FALSE(low.steps[s].skipped) << "step " << s;
    }
    EXPECT_LT(low.steps.back().loss, low.steps.front().loss - 0.3f) << "it learns";
    EXPECT_EQ(low.steps[0].loss_scale, std::string(precision) == "fp16" ? 256.0f : 1.0f);
  }
}

TEST_P(MixedPrecisionFamilies, BitIdenticalForEveryDeviceBudget) {
  auto data = Tokens(3000, 22);
  for (const char* precision : {"bf16", "fp16"}) {
    const std::string p = std::string("train.precision=") + precision;
    const TrainedRun all = Train(Job({p, "default_chunk_size=1024"}), data);
    auto plan = PlanMemory(Job({p, "default_chunk_size=1024"}));
    ASSERT_TRUE(plan.ok());
    for (int64_t budget : {plan->activation_bytes + plan->model_bytes / 2, plan->min_device_bytes}) {
      const TrainedRun r = Train(Job({p, "default_chunk_size=1024", "runtime.device_memory=" + std::to_string(budget)}),
                          data);
      EXPECT_EQ(Losses(r), Losses(all)) << precision << " at " << budget;
      EXPECT_TRUE(SameBits(r.params, all.params)) << precision << " at " << budget;
      EXPECT_TRUE(SameBits(r.exp_avg_sq, all.exp_avg_sq)) << precision << " at " << budget;
    }
  }
}

TEST(MixedPrecision, OneRankTakesAnyChunkSizeWith16BitParams) {
  // 1040 elements: whole 64-byte lines in fp32, half lines in 16 bits; the
  // 16-bit slots round up, so one rank trains as in fp32.
  auto data = test::RandomTokens(2000, 40, 25);
  const TrainedRun r = Train(Make({"train.steps=2", "train.precision=bf16", "default_chunk_size=1040"}), data);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(r.steps[1].loss));
}

TEST(MixedPrecision, SixteenBitParamChunksMoveAtMostHalfTheParamBytes) {
  // At the fp32 run's smallest device budget, params stream every step; in
  // bf16 they stream as 16-bit copies of the fp32 masters.
  auto data = test::RandomTokens(3000, 40, 24);
  auto fp32_plan = PlanMemory(Make({"default_chunk_size=1024"}));
  ASSERT_TRUE(fp32_plan.ok());
  auto param_bytes_per_step = [&](const char* precision) -> int64_t {
    auto t = Trainer::Create(Make({std::string("train.precision=") + precision, "default_chunk_size=1024",
                                   "runtime.device_memory=" + std::to_string(fp32_plan->min_device_bytes)}),
                             data);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!t.ok()) return -1;
    const auto& moved = (*t)->store().chunks().counters().moved_kind_bytes[int(Direction::kHostToDevice)];
    EXPECT_TRUE((*t)->Step().ok());  // the trace is recorded
    const int64_t before = moved[int(StateKind::kParam)];
    for (int s = 0; s < 3; ++s) EXPECT_TRUE((*t)->Step().ok());
    return (moved[int(StateKind::kParam)] - before) / 3;
  };
  const int64_t fp32 = param_bytes_per_step("fp32");
  const int64_t bf16 = param_bytes_per_step("bf16");
  EXPECT_GT(bf16, 0);
  EXPECT_LE(2 * bf16, fp32) << "bf16 " << bf16 << " bytes, fp32 " << fp32;
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  auto data = LearnableTokens(4000, 23);
  // 2^24 times the loss gradient cannot be held in fp16 (max 65504).
  const Config c = Make({"train.steps=40", "train.precision=fp16", "fp16.initial_scale_power=24",
                         "fp16.hysteresis=1", "fp16.loss_scale_window=1000"});
  auto t = Trainer::Create(c, data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const auto initial = test::TensorCopies((*t)->store(), StateKind::kParam);
  auto first = (*t)->Step();
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(first->skipped);
  EXPECT_FALSE(std::isfinite(first->grad_norm));
  EXPECT_EQ(first->loss_scale, std::ldexp(1.0f, 24));
  EXPECT_TRUE(SameBits(test::TensorCopies((*t)->store(), StateKind::kParam), initial)) << "a skipped step changes nothing";
  std::vector<StepStats> rest;
  for (int s = 1; s < 40; ++s) {
    auto st = (*t)->Step();
    ASSERT_TRUE(st.ok()) << st.status().message();
    rest.push_back(*st);
  }
  // The scale halves on every overflow until the gradients fit, then stays.
  float expected = std::ldexp(1.0f, 23);
  size_t applied = 0;
  for (const StepStats& s : rest) {
    EXPECT_EQ(s.loss_scale, expected) << "step " << s.step;
    if (s.skipped) {
      expected *= 0.5f;
    } else {
      ++applied;
      EXPECT_TRUE(std::isfinite(s.grad_norm));
    }
  }
  EXPECT_GT(applied, 10u);
  EXPECT_LT(expected, std::ldexp(1.0f, 23)) << "several overflows";
  EXPECT_LT(rest.back().loss, first->loss - 0.2f) << "it learns once the scale fits";
}

TEST(MixedPrecision, Fp16ScaleGrowsAfterACleanWindowAndHysteresisDelaysTheCut) {
  auto data = test::RandomTokens(3000, 40, 24);
  const TrainedRun r = Train(Make({"train.steps=6", "train.precision=fp16", "fp16.initial_scale_power=2",
                            "fp16.loss_scale_window=2"}),
                      data);
  ASSERT_EQ(r.steps.size(), 6u);
  const float want[] = {4, 4, 8, 8, 16, 16};  // doubles after every two clean steps
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_FALSE(r.steps[s].skipped);
    EXPECT_EQ(r.steps[s].loss_scale, want[s]) << "step " << s;
  }
  // Hysteresis 2: the first overflow keeps the scale, the second halves it.
  auto t = Trainer::Create(Make({"train.steps=3", "train.precision=fp16", "fp16.initial_scale_power=40",
                                 "fp16.hysteresis=2"}),
                           data);
  ASSERT_TRUE(t.ok());
  std::vector<float> scales;
  for (int s = 0; s < 3; ++s) scales.push_back((*t)->Step()->loss_scale);
  EXPECT_EQ(scales[0], std::ldexp(1.0f, 40));
  EXPECT_EQ(scales[1], std::ldexp(1.0f, 40));
  EXPECT_EQ(scales[2], std::ldexp(1.0f, 39));
}

TEST(MixedPrecision, OverflowAtTheMinimumScaleIsDivergence) {
  auto data = test::RandomTokens(3000, 40, 25);
  auto t = Trainer::Create(Make({"train.precision=fp16", "fp16.initial_scale_power=40",
                                 "fp16.min_loss_scale=1099511627776", "fp16.hysteresis=1"}),
                           data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto st = (*t)->Step();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("training diverged at step 1"), std::string::npos) << st.status().message();
  EXPECT_NE(st.status().message().find("loss scale"), std::string::npos) << st.status().message();
}

TEST(MixedPrecision, TheLossScaleSurvivesACheckpoint) {
  auto data = test::RandomTokens(3000, 40, 26);
  test::TempDir dir("mixed-ckpt");
  const std::vector<std::string> job = {"train.steps=6", "train.precision=fp16", "fp16.initial_scale_power=2",
                                        "fp16.loss_scale_window=2", "checkpoint.dir=" + dir.path()};
  float scale_at_save = 0;
  {
    auto t = Trainer::Create(Make(job), data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    for (int s = 0; s < 4; ++s) ASSERT_TRUE((*t)->Step().ok());
    ASSERT_TRUE((*t)->SaveCheckpoint().ok());
    scale_at_save = (*t)->Step()->loss_scale;  // what step 5 runs with
  }
  auto t = Trainer::Create(Make(job), data);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> warnings;
  auto resumed = (*t)->Resume(&warnings);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(*resumed, 4);
  EXPECT_EQ((*t)->Step()->loss_scale, scale_at_save);
  EXPECT_EQ(scale_at_save, 16.0f);
}

TEST(MixedPrecision, SixteenBitGradientsTrainAndAreBitIdenticalForEveryBudget) {
  auto data = LearnableTokens(4000, 27);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const std::vector<std::string> base = {"train.steps=12", std::string("train.precision=") + precision,
                                           "fp16.initial_scale_power=8", "default_chunk_size=1024"};
    std::vector<std::string> half = base;
    half.push_back("train.grad_precision=16bit");
    const TrainedRun wide = Train(Make(base), data);
    const TrainedRun all = Train(Make(half), data);
    ASSERT_EQ(all.steps.size(), wide.steps.size());
    EXPECT_NE(Losses(all), Losses(wide)) << "16-bit gradients must round";
    for (size_t s = 0; s < wide.steps.size(); ++s) {
      EXPECT_NEAR(all.steps[s].loss, wide.steps[s].loss, 0.02 * wide.steps[s].loss) << "step " << s;
      EXPECT_FALSE(all.steps[s].skipped) << "step " << s;
    }
    EXPECT_LT(all.steps.back().loss, all.steps.front().loss - 0.2f) << "it learns";

    auto wide_plan = PlanMemory(Make(base));
    auto plan = PlanMemory(Make(half));
    ASSERT_TRUE(plan.ok() && wide_plan.ok());
    EXPECT_EQ(plan->grad_home, precision);
    // Everything resident homes the fp32 masters and the moments on the
    // device: the host holds only the gradients, at half size.
    EXPECT_EQ(plan->param_device, precision);
    EXPECT_EQ(plan->host_chunk_bytes, int64_t(plan->num_chunks) * plan->chunk_bytes / 2);
    EXPECT_EQ(wide_plan->host_chunk_bytes - plan->host_chunk_bytes, int64_t(plan->num_chunks) * plan->chunk_bytes / 2);
    EXPECT_EQ(plan->min_device_bytes - wide_plan->min_device_bytes, TierLayout::StagingBytes(plan->chunk_bytes, plan->runtime));
    // Budgets where gradients are written home and read back, with and
    // without moments homed on the device.
    for (int64_t budget : {plan->activation_bytes + plan->model_bytes / 2, plan->min_device_bytes}) {
      std::vector<std::string> o = half;
      o.push_back("runtime.device_memory=" + std::to_string(budget));
      const TrainedRun r = Train(Make(o), data);
      EXPECT_EQ(Losses(r), Losses(all)) << "at " << budget;
      EXPECT_TRUE(SameBits(r.params, all.params)) << "at " << budget;
      EXPECT_TRUE(SameBits(r.exp_avg_sq, all.exp_avg_sq)) << "at " << budget;
    }
  }
}

TEST(MixedPrecision, SixteenBitGradientsNeedA16BitPrecision) {
  auto fp32 = ParseConfig("model: {preset: tiny}\ntrain: {precision: fp32, grad_precision: 16bit}\n", "job.yaml", {});
  ASSERT_FALSE(fp32.ok());
  EXPECT_NE(fp32.status().message().find("train.grad_precision"), std::string::npos) << fp32.status().message();
  auto bad = ParseConfig("model: {preset: tiny}\ntrain: {grad_precision: half}\n", "job.yaml", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("must be fp32 or 16bit"), std::string::npos) << bad.status().message();
  // Several ranks take them too (reduce-scattered in 16 bits).
  auto plan = PlanMemory(Make({"train.precision=bf16", "train.grad_precision=16bit"}), 2);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->grad_home, "bf16");
}

}  // namespace
}  // namespace pstar
