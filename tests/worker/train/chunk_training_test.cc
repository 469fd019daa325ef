// Training through the chunk runtime: the result is bit-identical for every
// device budget, chunk size, prefetch depth and eviction policy; the device
// tier never exceeds its budget; OPT moves no more than LRU; budgets that
// cannot work fail at start with the numbers.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/worker/tiny_gpt_job.h"
#include "worker/model/gpt.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

Config MakeConfig(const std::vector<std::string>& overrides) { return test::TinyGptConfig(overrides); }
using test::RandomTokens;

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // per tensor, after training
  std::vector<std::vector<float>> exp_avg, exp_avg_sq;  // per tensor, after training
  int64_t moved_after_warmup = 0;           // bytes, both directions, after step 1
  int64_t evictions = 0;
  int64_t prefetch_hits = 0;
  int64_t peak = 0, capacity = 0;
  int32_t device_adam_chunks = 0;
  int32_t num_chunks = 0;
};

int64_t Moved(const ChunkManager& m) {
  return m.counters().moved_bytes[0] + m.counters().moved_bytes[1];
}

RunResult Train(const Config& config, const TokenSource& data) {
  auto t = Trainer::Create(config, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return {};
  RunResult r;
  ChunkManager& chunks = (*t)->store().chunks();
  chunks.SetMomentObserver([](const ChunkManager& m) {
    // Count resident chunks one by one, independently of the runtime's own tally.
    int64_t resident = 0;
    for (int k = 0; k < kNumStateKinds; ++k) {
      for (int32_t c = 0; c < m.num_chunks(); ++c) resident += m.OnDevice({StateKind(k), c});
    }
    ASSERT_EQ(m.non_model_bytes() + resident * m.chunk_bytes(), m.device_bytes_in_use());
    ASSERT_LE(m.device_bytes_in_use(), m.device_capacity_bytes());
  });
  int64_t moved_at_warmup = 0;
  for (int64_t s = 0; s < config.train.steps; ++s) {
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok());
    r.losses.push_back(st->loss);
    if (s == 0) moved_at_warmup = Moved(chunks);
  }
  r.moved_after_warmup = Moved(chunks) - moved_at_warmup;
  for (int k = 0; k < kNumStateKinds; ++k) r.evictions += chunks.counters().evictions[size_t(k)];
  r.prefetch_hits = chunks.counters().prefetch_hits;
  r.peak = chunks.peak_device_bytes();
  r.capacity = chunks.device_capacity_bytes();
  r.device_adam_chunks = chunks.device_adam_chunks();
  r.num_chunks = chunks.num_chunks();
  r.params = test::TensorCopies((*t)->store(), StateKind::kParam);
  r.exp_avg = test::TensorCopies((*t)->store(), StateKind::kExpAvg);
  r.exp_avg_sq = test::TensorCopies((*t)->store(), StateKind::kExpAvgSq);
  return r;
}

void ExpectBitIdentical(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float))) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)))
        << what << ": tensor " << i;
    ASSERT_EQ(0, std::memcmp(a.exp_avg[i].data(), b.exp_avg[i].data(), a.exp_avg[i].size() * sizeof(float)))
        << what << ": exp_avg of tensor " << i;
    ASSERT_EQ(0, std::memcmp(a.exp_avg_sq[i].data(), b.exp_avg_sq[i].data(),
                             a.exp_avg_sq[i].size() * sizeof(float)))
        << what << ": exp_avg_sq of tensor " << i;
  }
}

// Device bytes for `fraction` of the model data plus the activations, never below the minimum.
int64_t Budget(const Config& c, double fraction) {
  auto plan = PlanMemory(c);
  EXPECT_TRUE(plan.ok());
  int64_t b = plan->activation_bytes + int64_t(double(plan->model_bytes) * fraction);
  return std::max(b, plan->min_device_bytes);
}

std::string Set(const std::string& key, int64_t v) { return key + "=" + std::to_string(v); }

// The invariants every decoder keeps, on the tiny GPT-2 and Llama jobs.
using ChunkTrainingFamilies = test::TinyFamilyTest;
INSTANTIATE_TEST_SUITE_P(Decoders, ChunkTrainingFamilies, testing::ValuesIn(test::TinyFamilies()),
                         test::TinyFamilyName);

TEST_P(ChunkTrainingFamilies, BitIdenticalForEveryBudgetChunkSizeAndPrefetchDepth) {
  auto data = Tokens(3000, 7);
  for (int64_t chunk : {0, 1024, 4096}) {
    const std::string chunk_set = Set("default_chunk_size", chunk);
    const RunResult reference = Train(Job({chunk_set}), data);
    EXPECT_EQ(reference.device_adam_chunks, reference.num_chunks) << "everything fits: Adam runs on the device";
    EXPECT_EQ(reference.moved_after_warmup, 0) << "everything resident: nothing moves after the first step";
    // 0.9 and 0.5 leave room beyond the streaming reserve: some or all chunks
    // home their moments on the device, the rest stay on the host.
    bool mixed = false;  // some run homes part of the moments on the device, not all
    for (double fraction : {0.9, 0.5, 0.25, 0.0}) {
      const int64_t budget = Budget(Job({chunk_set}), fraction);
      for (int64_t depth : {0, 2, 8}) {
        for (const char* policy : {"opt", "lru"}) {
          if (std::string(policy) == "lru" && depth == 8) continue;
          const std::string what = "chunk " + std::to_string(chunk) + ", budget " + std::to_string(budget) +
                                   ", prefetch " + std::to_string(depth) + ", " + policy;
          RunResult r = Train(Job({chunk_set, Set("runtime.device_memory", budget),
                                          Set("runtime.prefetch_depth", depth),
                                          std::string("runtime.eviction=") + policy}),
                              data);
          ExpectBitIdentical(reference, r, what);
          EXPECT_LE(r.peak, budget) << what;
          if (fraction == 0.9) { EXPECT_GT(r.device_adam_chunks, 0) << what; }
          if (fraction <= 0.5) { EXPECT_LT(r.device_adam_chunks, r.num_chunks) << what; }
          mixed = mixed || (r.device_adam_chunks > 0 && r.device_adam_chunks < r.num_chunks);
          if (fraction == 0.0) {
            EXPECT_GT(r.moved_after_warmup, 0) << what << ": chunks must move";
          }
        }
      }
    }
    EXPECT_TRUE(mixed) << "chunk " << chunk << ": no budget gave a mixed Adam placement";
  }
}

TEST_P(ChunkTrainingFamilies, GradientAccumulationAtTheMinimumBudgetIsBitIdentical) {
  auto data = Tokens(3000, 8);
  const std::vector<std::string> base = {"train.grad_accum_steps=3", "default_chunk_size=1024"};
  const RunResult reference = Train(Job(base), data);
  auto tight = base;
  tight.push_back(Set("runtime.device_memory", Budget(Job(base), 0.0)));
  tight.push_back("runtime.prefetch_depth=3");
  RunResult r = Train(Job(tight), data);
  ExpectBitIdentical(reference, r, "accumulation at the minimum budget");
  EXPECT_GT(r.evictions, 0);
}

TEST(ChunkTraining, PrefetchHitsWhenTheTraceIsValid) {
  auto data = RandomTokens(3000, 40, 9);
  const std::vector<std::string> base = {"default_chunk_size=1024", "runtime.prefetch_depth=2"};
  RunResult r = Train(MakeConfig({base[0], base[1], Set("runtime.device_memory", Budget(MakeConfig(base), 0.25))}),
                      data);
  EXPECT_GT(r.prefetch_hits, 0);
}

// The step-aligned series describe each whole step: the phases' moves add up to
// the step's, the optimizer phase's residency is where the step left the
// chunks, and the peak is at least every residency the step passed through.
TEST(ChunkTraining, TheStepSeriesDescribeTheLastWholeStep) {
  auto data = RandomTokens(3000, 40, 13);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.grad_accum_steps=2",
                                         "runtime.prefetch_depth=2"};
  std::vector<std::string> overrides = base;
  overrides.push_back(Set("runtime.device_memory", Budget(MakeConfig(base), 0.0)));
  auto t = Trainer::Create(MakeConfig(overrides), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChunkManager& chunks = (*t)->store().chunks();
  const RuntimeCounters& c = chunks.counters();
  auto device_chunk_bytes = [&c] {
    int64_t sum = 0;
    for (int k = 0; k < kNumStateKinds; ++k) sum += c.resident_bytes[int(Tier::kDevice)][size_t(k)];
    return sum;
  };
  int64_t observed_peak = 0;
  chunks.SetMomentObserver([&](const ChunkManager&) { observed_peak = std::max(observed_peak, device_chunk_bytes()); });
  EXPECT_EQ(c.steps_recorded, 0);
  for (int64_t s = 0; s < 3; ++s) {
    std::array<std::array<int64_t, kNumStateKinds>, kNumDirections> before{};
    for (int d = 0; d < kNumDirections; ++d) {
      for (int k = 0; k < kNumStateKinds; ++k) before[size_t(d)][size_t(k)] = c.moved_kind_bytes[size_t(d)][size_t(k)];
    }
    observed_peak = device_chunk_bytes();
    ASSERT_TRUE((*t)->Step().ok());
    EXPECT_EQ(c.steps_recorded, s + 1);
    for (int d = 0; d < kNumDirections; ++d) {
      for (int k = 0; k < kNumStateKinds; ++k) {
        int64_t phases = 0;
        for (int p = 0; p < kNumStepPhases; ++p) phases += c.step_moved_bytes[size_t(p)][size_t(d)][size_t(k)];
        EXPECT_EQ(phases, c.moved_kind_bytes[size_t(d)][size_t(k)] - before[size_t(d)][size_t(k)])
            << "step " << s << " " << DirectionName(Direction(d)) << " " << StateKindName(StateKind(k));
      }
    }
    int64_t phase_max = 0;
    for (int p = 0; p < kNumStepPhases; ++p) {
      int64_t on_device = 0;
      for (int k = 0; k < kNumStateKinds; ++k) on_device += c.step_resident_bytes[size_t(p)][int(Tier::kDevice)][size_t(k)];
      phase_max = std::max(phase_max, on_device);
    }
    for (int t_ = 0; t_ < kNumTiers; ++t_) {
      for (int k = 0; k < kNumStateKinds; ++k) {
        EXPECT_EQ(c.step_resident_bytes[int(StepPhase::kOptimizer)][size_t(t_)][size_t(k)],
                  c.resident_bytes[size_t(t_)][size_t(k)])
            << "step " << s << " tier " << TierName(Tier(t_)) << " " << StateKindName(StateKind(k));
      }
    }
    const int64_t peak = c.step_peak_bytes[int(Tier::kDevice)];
    EXPECT_GE(peak, phase_max) << "step " << s;
    EXPECT_GE(peak, observed_peak) << "step " << s;
    EXPECT_LE(peak, chunks.device_capacity_bytes() - chunks.non_model_bytes()) << "step " << s;
    // At this budget params stream in during the forward and gradients go home in the backward.
    const size_t h2d = size_t(Direction::kHostToDevice), d2h = size_t(Direction::kDeviceToHost);
    EXPECT_GT(c.step_moved_bytes[int(StepPhase::kForward)][h2d][int(StateKind::kParam)], 0) << "step " << s;
    EXPECT_GT(c.step_moved_bytes[int(StepPhase::kBackward)][d2h][int(StateKind::kGrad)], 0) << "step " << s;
  }
}

TEST(ChunkTraining, OptMovesNoMoreThanLruOnTheRecordedTrace) {
  auto data = RandomTokens(3000, 40, 10);
  int strictly_fewer = 0;
  for (double fraction : {0.5, 0.35, 0.25, 0.0}) {
    const std::vector<std::string> base = {"default_chunk_size=1024", "runtime.prefetch_depth=0"};
    const std::string budget = Set("runtime.device_memory", Budget(MakeConfig(base), fraction));
    RunResult opt = Train(MakeConfig({base[0], base[1], budget, "runtime.eviction=opt"}), data);
    RunResult lru = Train(MakeConfig({base[0], base[1], budget, "runtime.eviction=lru"}), data);
    EXPECT_LE(opt.moved_after_warmup, lru.moved_after_warmup) << budget;
    if (opt.moved_after_warmup < lru.moved_after_warmup) ++strictly_fewer;
  }
  EXPECT_GT(strictly_fewer, 0);
}

// With and without activation checkpointing, and with the classifier's
// dlogits kept whole (its weight gradient at the end, beside the
// embeddings') and in row blocks (all of it at the turn).
TEST_P(ChunkTrainingFamilies, TheRecordedTraceIsTheStaticAccessSequence) {
  auto data = Tokens(3000, 11);
  for (int form = 0; form < 4; ++form) {
    const bool recompute = form % 2 == 1, blocks = form >= 2;
    std::vector<std::string> overrides = {std::string("train.activation_checkpointing=") +
                                          (recompute ? "true" : "false")};
    if (blocks) overrides.insert(overrides.end(), GetParam().classifier_blocks.begin(), GetParam().classifier_blocks.end());
    Config c = Job(overrides);
    const int64_t tokens = c.train.batch_size * c.train.seq_len;
    ASSERT_EQ(ClassifierKeepsLogits(c.model.gpt, tokens), !blocks);
    auto t = Trainer::Create(c, data);
    ASSERT_TRUE(t.ok());
    ParamStore& store = (*t)->store();
    store.SetRecording(true);
    ASSERT_TRUE((*t)->Step().ok());
    auto expected = GptAccessSequence(c.model.gpt, store.layout(), recompute, tokens);
    std::vector<AccessMoment> recorded;
    for (const AccessRecord& a : store.trace()) {
      if (recorded.size() <= size_t(a.moment)) recorded.resize(size_t(a.moment) + 1);
      recorded[size_t(a.moment)].tensors.push_back(a.tensor);
      recorded[size_t(a.moment)].pass = a.pass;
      recorded[size_t(a.moment)].params = a.params;
      recorded[size_t(a.moment)].grads = a.grads;
    }
    ASSERT_EQ(recorded.size(), expected.size());
    for (size_t m = 0; m < expected.size(); ++m) {
      EXPECT_EQ(recorded[m].tensors, expected[m].tensors) << "moment " << m;
      EXPECT_EQ(recorded[m].pass, expected[m].pass) << "moment " << m;
      EXPECT_EQ(recorded[m].params, expected[m].params) << "moment " << m;
      EXPECT_EQ(recorded[m].grads, expected[m].grads) << "moment " << m;
    }
  }
}

TEST(ChunkTraining, TooSmallBudgetsFailAtStartWithTheNumbers) {
  auto data = RandomTokens(3000, 40, 12);
  Config c = MakeConfig({"default_chunk_size=1024"});
  auto plan = PlanMemory(c);
  ASSERT_TRUE(plan.ok());
  auto t = Trainer::Create(MakeConfig({"default_chunk_size=1024", Set("runtime.device_memory", plan->min_device_bytes - 1)}), data);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("need at least " + std::to_string(plan->min_device_bytes) + " bytes"),
            std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("available " + std::to_string(plan->min_device_bytes - 1) + " bytes"),
            std::string::npos)
      << t.status().message();

  auto h = Trainer::Create(MakeConfig({"runtime.host_memory=1MiB"}), data);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("host memory budget too small"), std::string::npos) << h.status().message();
  EXPECT_NE(h.status().message().find("available 1048576 bytes"), std::string::npos) << h.status().message();
}

}  // namespace
}  // namespace pstar
