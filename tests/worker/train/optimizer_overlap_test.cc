// The optimizer's host updates overlapped with the rest of the step
// (runtime.optimizer_overlap pipeline and speculate): the results are the
// bits of the synchronous schedule for every budget, precision, tier,
// clipping and overflow case, across a checkpoint and with several ranks;
// the chunk event log shows each chunk's next use after its own update, the
// next forward under way before the last update ends, and updates during
// the backward pass, undone when the step clips or skips.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

struct TrainedRun {
  std::vector<float> losses, scales;
  std::vector<uint8_t> skipped;
  std::vector<int32_t> speculated;  // per step
  std::vector<uint8_t> rolled_back;
  int32_t undo_chunks = 0;
  std::vector<std::vector<float>> params, exp_avg, exp_avg_sq;
  int32_t num_chunks = 0, device_adam_chunks = 0;
};

std::string Set(const std::string& key, int64_t v) { return key + "=" + std::to_string(v); }

// The device bytes of the smallest budget the plan admits.
int64_t MinBudget(const std::vector<std::string>& overrides, test::TinyJob job = test::TinyGptConfig) {
  auto plan = PlanMemory(job(overrides));
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? plan->min_device_bytes : 0;
}

// Trains `steps` steps (resuming from checkpoint.dir when asked), then reads
// every tensor's param and moments. `job`: the tiny GPT-2 job or another
// decoder's.
TrainedRun Train(std::vector<std::string> overrides, const TokenSource& data, const char* overlap, bool resume = false,
                 int64_t save_after = -1, test::TinyJob job = test::TinyGptConfig) {
  overrides.push_back(std::string("runtime.optimizer_overlap=") + overlap);
  const Config config = job(overrides);
  auto t = Trainer::Create(config, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return {};
  Trainer& trainer = **t;
  if (resume) {
    std::vector<std::string> warnings;
    auto step = trainer.Resume(&warnings);
    EXPECT_TRUE(step.ok()) << step.status().message();
  }
  TrainedRun r;
  while (trainer.steps_taken() < config.train.steps) {
    auto st = trainer.Step();
    EXPECT_TRUE(st.ok()) << st.status().message();
    if (!st.ok()) return {};
    r.losses.push_back(st->loss);
    r.scales.push_back(st->loss_scale);
    r.skipped.push_back(st->skipped);
    r.speculated.push_back(st->speculated_chunks);
    r.rolled_back.push_back(st->rolled_back);
    if (trainer.steps_taken() == save_after) {
      const Status saved = trainer.SaveCheckpoint();
      EXPECT_TRUE(saved.ok()) << saved.message();
      return r;
    }
  }
  r.num_chunks = trainer.store().chunks().num_chunks();
  r.undo_chunks = trainer.undo_chunks();
  r.device_adam_chunks = trainer.store().chunks().device_adam_chunks();
  r.params = test::TensorCopies(trainer.store(), StateKind::kParam);
  r.exp_avg = test::TensorCopies(trainer.store(), StateKind::kExpAvg);
  r.exp_avg_sq = test::TensorCopies(trainer.store(), StateKind::kExpAvgSq);
  return r;
}

void ExpectSameBits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what << ": tensor " << i;
    ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float))) << what << ": tensor " << i;
  }
}

void ExpectBitIdentical(const TrainedRun& a, const TrainedRun& b, const std::string& what) {
  ASSERT_FALSE(a.losses.empty()) << what;
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float))) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
  EXPECT_EQ(a.skipped, b.skipped) << what;
  ExpectSameBits(a.params, b.params, what + ": params");
  ExpectSameBits(a.exp_avg, b.exp_avg, what + ": exp_avg");
  ExpectSameBits(a.exp_avg_sq, b.exp_avg_sq, what + ": exp_avg_sq");
}

int64_t Count(const std::vector<int32_t>& v) {
  int64_t n = 0;
  for (int32_t x : v) n += x;
  return n;
}

TEST(OptimizerOverlap, AutoIsOffOnTheCpuAndSpeculateOnCuda) {
  EXPECT_EQ(test::TinyGptConfig({}).runtime.optimizer_overlap, OptimizerOverlap::kOff);
  auto cuda = ParseConfig(test::kTinyGptJob, "test", {"runtime.device=cuda"});
  ASSERT_TRUE(cuda.ok()) << cuda.status().message();
  EXPECT_EQ(cuda->runtime.optimizer_overlap, OptimizerOverlap::kSpeculate);
  auto undo_off = ParseConfig(test::kTinyGptJob, "test", {"runtime.optimizer_overlap=off", "runtime.undo_memory=1MiB"});
  ASSERT_FALSE(undo_off.ok());
  EXPECT_NE(undo_off.status().message().find("runtime.undo_memory"), std::string::npos) << undo_off.status().message();
  auto bad = ParseConfig(test::kTinyGptJob, "test", {"runtime.optimizer_overlap=sometimes"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("runtime.optimizer_overlap"), std::string::npos) << bad.status().message();
}

TEST(OptimizerOverlap, OverlappedUpdatesGiveTheSynchronousBitsInEveryCase) {
  auto data = test::RandomTokens(4000, 40, 11);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=5"};
  const std::string host = "optimizer.params.use_hybrid_adam=false";
  const std::string no_clip = "train.grad_clip=0";
  std::vector<std::string> bf16 = base;
  bf16.push_back("train.precision=bf16");
  const int64_t bf16_min = MinBudget(bf16);
  struct Case {
    std::string what;
    std::vector<std::string> overrides;
  };
  std::vector<Case> cases = {
      {"everything resident", {no_clip}},
      {"the smallest budget, host Adam", {host, no_clip}},
      {"a budget between", {Set("runtime.device_memory", MinBudget(base) * 2), no_clip}},
      {"clipping on every step", {host, "train.grad_clip=0.01"}},
      {"accumulation, no prefetch, lru",
       {host, no_clip, "train.grad_accum_steps=2", "runtime.prefetch_depth=0", "runtime.eviction=lru"}},
      {"activation checkpointing", {host, no_clip, "train.activation_checkpointing=true"}},
      {"bf16", {host, no_clip, "train.precision=bf16"}},
      {"bf16 at the smallest budget", {host, no_clip, "train.precision=bf16", Set("runtime.device_memory", bf16_min)}},
      {"bf16, 16-bit gradients", {host, no_clip, "train.precision=bf16", "train.grad_precision=16bit"}},
      {"fp16 with overflow skips",
       {host, no_clip, "train.precision=fp16", "fp16.initial_scale_power=24", "fp16.hysteresis=1", "train.steps=8"}},
  };
  for (Case& c : cases) {
    std::vector<std::string> o = base;
    o.insert(o.end(), c.overrides.begin(), c.overrides.end());
    const TrainedRun off = Train(o, data, "off");
    const TrainedRun pipelined = Train(o, data, "pipeline");
    const TrainedRun speculated = Train(o, data, "speculate");
    ExpectBitIdentical(off, pipelined, c.what);
    ExpectBitIdentical(off, speculated, c.what + ", speculated");
    EXPECT_GE(off.num_chunks, 4) << c.what << ": enough chunks to pipeline";
    EXPECT_EQ(Count(pipelined.speculated), 0) << c.what;
    const bool clean = c.what != "clipping on every step" && c.what.find("fp16") == std::string::npos;
    if (clean && c.what != "everything resident" && c.what != "a budget between") {
      // Nothing clips or skips: every step from the second speculates on every chunk, and keeps it.
      for (size_t s = 1; s < speculated.speculated.size(); ++s) {
        EXPECT_EQ(speculated.speculated[s], speculated.num_chunks) << c.what << ", step " << s;
        EXPECT_FALSE(speculated.rolled_back[s]) << c.what << ", step " << s;
      }
    }
    if (c.what == "clipping on every step") {
      // A step speculates only after one that needed no clip: never here.
      EXPECT_EQ(Count(speculated.speculated), 0);
    }
    if (c.what == "fp16 with overflow skips") {
      EXPECT_TRUE(std::find(off.skipped.begin(), off.skipped.end(), 1) != off.skipped.end()) << "some steps skip";
    }
    if (c.what.find("host Adam") != std::string::npos) { EXPECT_EQ(off.device_adam_chunks, 0); }
    if (c.what == "everything resident") { EXPECT_EQ(Count(speculated.speculated), 0) << "Adam runs on the device"; }
    if (c.what == "a budget between") {
      EXPECT_GT(off.device_adam_chunks, 0);
      EXPECT_LT(off.device_adam_chunks, off.num_chunks);
      EXPECT_EQ(speculated.undo_chunks, off.num_chunks - off.device_adam_chunks) << "the chunks Adam runs on the host";
    }
  }
}

// The Llama family's decoder: both overlaps give the synchronous bits with
// host Adam at the smallest budget, a mixed placement, bf16 and activation
// checkpointing.
TEST(OptimizerOverlap, LlamaOverlappedUpdatesGiveTheSynchronousBits) {
  auto data = test::RandomTokens(4000, 150, 17);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=5", "train.grad_clip=0"};
  const std::string host = "optimizer.params.use_hybrid_adam=false";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"the smallest budget, host Adam", {host}},
      {"a budget between", {Set("runtime.device_memory", MinBudget(base, test::TinyLlamaConfig) * 2)}},
      {"bf16, activation checkpointing", {host, "train.precision=bf16", "train.activation_checkpointing=true"}},
  };
  for (const auto& [what, overrides] : cases) {
    std::vector<std::string> o = base;
    o.insert(o.end(), overrides.begin(), overrides.end());
    const TrainedRun off = Train(o, data, "off", false, -1, test::TinyLlamaConfig);
    const TrainedRun pipelined = Train(o, data, "pipeline", false, -1, test::TinyLlamaConfig);
    const TrainedRun speculated = Train(o, data, "speculate", false, -1, test::TinyLlamaConfig);
    ExpectBitIdentical(off, pipelined, what);
    ExpectBitIdentical(off, speculated, what + ", speculated");
    EXPECT_GE(off.num_chunks, 4) << what << ": enough chunks to pipeline";
    if (what != "a budget between") {
      for (size_t s = 1; s < speculated.speculated.size(); ++s) {
        EXPECT_EQ(speculated.speculated[s], speculated.num_chunks) << what << ", step " << s;
      }
    }
  }
}

TEST(OptimizerOverlap, OverlappedUpdatesWithADiskTierGiveTheSynchronousBits) {
  test::TempDir dir("overlap-disk");
  auto data = test::RandomTokens(4000, 40, 12);
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<std::string> o = {"default_chunk_size=1024", "train.steps=4",
                                        "optimizer.params.use_hybrid_adam=false", "train.grad_clip=0",
                                        std::string("train.precision=") + precision, "runtime.nvme_path=" + dir.path()};
    auto plan = PlanMemory(test::TinyGptConfig(o));
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    // A host budget that spills some chunks to disk, and room in it for two
    // chunks' undo copies, counted in the plan like the rest (the split
    // between host and disk does not change the bits).
    std::vector<std::string> spill = o;
    spill.push_back(Set("runtime.host_memory", plan->min_host_bytes + 6 * plan->chunk_bytes + plan->model_bytes / 3));
    std::vector<std::string> spill_undo = spill;
    spill_undo.push_back(Set("runtime.undo_memory", 6 * plan->chunk_bytes));
    for (bool some_on_host : {false, true}) {
      const std::string what = std::string(precision) + (some_on_host ? ", some on disk" : ", all on disk");
      const TrainedRun off = Train(some_on_host ? spill : o, data, "off");
      const TrainedRun pipelined = Train(some_on_host ? spill : o, data, "pipeline");
      const TrainedRun speculated = Train(some_on_host ? spill_undo : o, data, "speculate");
      ExpectBitIdentical(off, pipelined, what);
      ExpectBitIdentical(off, speculated, what + ", speculated");
      if (some_on_host) {
        EXPECT_EQ(speculated.undo_chunks, 2) << what;
        EXPECT_GT(Count(speculated.speculated), 0) << what << ": the chunks on the host speculate";
      } else {
        EXPECT_EQ(Count(speculated.speculated), 0) << what << ": every chunk's moments are on disk";
      }
    }
  }
}

TEST(OptimizerOverlap, AnOverlappedRunResumesToTheBitsOfAnUninterruptedOne) {
  auto data = test::RandomTokens(4000, 40, 13);
  for (const char* overlap : {"pipeline", "speculate"}) {
    test::TempDir dir("overlap-ckpt");
    const std::vector<std::string> o = {"default_chunk_size=1024", "train.steps=6",
                                        "optimizer.params.use_hybrid_adam=false", "train.grad_clip=0",
                                        "checkpoint.dir=" + dir.path()};
    const TrainedRun straight = Train(o, data, "off");
    const TrainedRun first = Train(o, data, overlap, /*resume=*/false, /*save_after=*/3);
    ASSERT_EQ(first.losses.size(), 3u);
    TrainedRun rest = Train(o, data, overlap, /*resume=*/true);
    ASSERT_EQ(rest.losses.size(), 3u);
    rest.losses.insert(rest.losses.begin(), first.losses.begin(), first.losses.end());
    rest.scales.insert(rest.scales.begin(), first.scales.begin(), first.scales.end());
    rest.skipped.insert(rest.skipped.begin(), first.skipped.begin(), first.skipped.end());
    ExpectBitIdentical(straight, rest, std::string(overlap) + ": saved after step 3, resumed");
    if (std::string(overlap) == "speculate") {
      EXPECT_GT(Count(first.speculated), 0);
      EXPECT_EQ(rest.speculated.size(), 3u);
      EXPECT_GT(Count(rest.speculated), 0) << "a resumed run speculates from its second step";
    }
  }
}

// Two ZeRO ranks (threads sharing a test communicator): every rank's shards
// are the same bits with the updates pipelined as without (speculate
// pipelines there: a gradient is final only after its reduce-scatter).
TEST(OptimizerOverlap, TwoRanksOverlappedGiveTheirSynchronousBits) {
  auto data = test::RandomTokens(4000, 40, 14);
  const std::vector<std::string> everything = {"default_chunk_size=1024", "train.steps=4", "train.batch_size=2"};
  std::vector<std::string> streaming = everything;  // every param chunk gathered per use
  streaming.push_back(Set("runtime.device_memory", MinBudget(everything)));
  for (const auto& base : {everything, streaming}) {
    auto run = [&](const char* overlap) {
      auto comms = test::MakeThreadGroupCommunicators(2);
      std::vector<std::vector<float>> shards(2);
      std::vector<std::vector<float>> losses(2);
      std::vector<std::string> errors(2);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < 2; ++rank) {
        threads.emplace_back([&, rank] {
          std::vector<std::string> o = base;
          o.push_back(std::string("runtime.optimizer_overlap=") + overlap);
          auto t = Trainer::Create(test::TinyGptConfig(o), data, comms[size_t(rank)].get());
          if (!t.ok()) {
            errors[size_t(rank)] = t.status().message();
            return;
          }
          for (int s = 0; s < 4; ++s) {
            auto st = (*t)->Step();
            if (!st.ok()) {
              errors[size_t(rank)] = st.status().message();
              return;
            }
            losses[size_t(rank)].push_back(st->loss);
          }
          ParamStore& store = (*t)->store();
          // This rank's slices of every tensor (a shard's tail is not data).
          for (StateKind kind : {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
            for (int32_t c = 0; c < store.layout().num_chunks(); ++c) {
              const float* shard = store.PeekShard(kind, c);
              for (TensorId id : store.layout().chunk_tensors(c)) {
                const ParamStore::Slice sl = store.OwnedSlice(id);
                shards[size_t(rank)].insert(shards[size_t(rank)].end(), shard + sl.shard_offset,
                                            shard + sl.shard_offset + (sl.end - sl.begin));
              }
            }
          }
        });
      }
      for (auto& th : threads) th.join();
      for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e;
      return std::make_pair(losses, shards);
    };
    const auto off = run("off");
    for (const char* overlap : {"pipeline", "speculate"}) {
    const auto pipelined = run(overlap);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(off.first[size_t(rank)], pipelined.first[size_t(rank)]) << "rank " << rank;
      ASSERT_EQ(off.second[size_t(rank)].size(), pipelined.second[size_t(rank)].size());
      EXPECT_EQ(0, std::memcmp(off.second[size_t(rank)].data(), pipelined.second[size_t(rank)].data(),
                               off.second[size_t(rank)].size() * sizeof(float)))
          << "rank " << rank;
    }
    }
  }
}

// Index of the first event matching, or -1.
int64_t Find(const std::vector<ChunkEvent>& events, int64_t step, ChunkEventKind kind, int32_t chunk = -2) {
  for (const ChunkEvent& e : events) {
    if (e.step == step && e.kind == kind && (chunk == -2 || e.chunk == chunk)) return e.seq;
  }
  return -1;
}

int64_t FindLast(const std::vector<ChunkEvent>& events, int64_t step, ChunkEventKind kind) {
  int64_t last = -1;
  for (const ChunkEvent& e : events) {
    if (e.step == step && e.kind == kind) last = e.seq;
  }
  return last;
}

TEST(OptimizerOverlap, TheNextForwardStartsBeforeTheLastUpdateEndsAndEachUseFollowsItsOwnUpdate) {
  auto data = test::RandomTokens(4000, 40, 15);
  const std::vector<std::string> o = {"default_chunk_size=1024", "train.steps=4",
                                      "optimizer.params.use_hybrid_adam=false", "runtime.optimizer_overlap=pipeline"};
  auto t = Trainer::Create(test::TinyGptConfig(o), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  Trainer& trainer = **t;
  ChunkEventLog log;
  trainer.SetEventLog(&log);
  ASSERT_TRUE(trainer.Step().ok());
  const std::vector<int32_t> order = trainer.store().ForwardChunkOrder();
  ASSERT_GE(order.size(), 4u);
  const int32_t last = order.back();
  // The update thread holds step 1's last update until step 2's forward has
  // used a chunk: only a pipelined schedule gets there.
  std::mutex mu;
  std::condition_variable cv;
  bool forward_started = false, held = false, timed_out = false;
  log.SetListener([&](const ChunkEvent& e) {
    std::unique_lock<std::mutex> lock(mu);
    if (e.step == 2 && e.kind == ChunkEventKind::kForwardUse) {
      forward_started = true;
      cv.notify_all();
    }
    if (e.step == 1 && e.kind == ChunkEventKind::kUpdateBegin && e.chunk == last) {
      held = true;
      timed_out = !cv.wait_for(lock, std::chrono::seconds(20), [&] { return forward_started; });
    }
  });
  for (int s = 1; s < 4; ++s) ASSERT_TRUE(trainer.Step().ok());
  trainer.FinishUpdates();
  log.SetListener(nullptr);
  EXPECT_TRUE(held);
  EXPECT_FALSE(timed_out) << "step 2's forward waited for step 1's last update";
  const std::vector<ChunkEvent> events = log.Events();
  // The forward under way before the last update ends.
  EXPECT_LT(Find(events, 2, ChunkEventKind::kForwardUse), Find(events, 1, ChunkEventKind::kUpdateEnd, last));
  EXPECT_LT(Find(events, 1, ChunkEventKind::kStepEnd), FindLast(events, 1, ChunkEventKind::kUpdateEnd))
      << "step 1 returned before its updates ended";
  // Each chunk's next use after its own update, in every step.
  for (int64_t step = 0; step < 3; ++step) {
    for (int32_t c : order) {
      const int64_t updated = Find(events, step, ChunkEventKind::kUpdateEnd, c);
      const int64_t used = Find(events, step + 1, ChunkEventKind::kForwardUse, c);
      ASSERT_GE(updated, 0) << "step " << step << " chunk " << c;
      ASSERT_GE(used, 0) << "step " << step + 1 << " chunk " << c;
      EXPECT_LT(updated, used) << "step " << step << " chunk " << c;
    }
  }
  // The updates go in the forward's order.
  std::vector<int32_t> updated;
  for (const ChunkEvent& e : events) {
    if (e.step == 2 && e.kind == ChunkEventKind::kUpdateBegin) updated.push_back(e.chunk);
  }
  EXPECT_EQ(updated, order);
  EXPECT_NE(log.ToCsv().find("update_end"), std::string::npos);
}

TEST(OptimizerOverlap, WithOverlapOffEveryUpdateEndsBeforeTheStepReturns) {
  auto data = test::RandomTokens(4000, 40, 16);
  auto t = Trainer::Create(test::TinyGptConfig({"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                                "runtime.optimizer_overlap=off"}),
                           data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChunkEventLog log;
  (*t)->SetEventLog(&log);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*t)->Step().ok());
  const std::vector<ChunkEvent> events = log.Events();
  for (int64_t step = 0; step < 2; ++step) {
    EXPECT_LT(FindLast(events, step, ChunkEventKind::kUpdateEnd), Find(events, step, ChunkEventKind::kStepEnd));
  }
  EXPECT_EQ(Find(events, 0, ChunkEventKind::kUpdateWait), -1);
}

TEST(OptimizerOverlap, SpeculativeUpdatesRunDuringTheBackwardPassEachAfterItsGradientIsFinal) {
  auto data = test::RandomTokens(4000, 40, 17);
  auto t = Trainer::Create(test::TinyGptConfig({"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                                "train.grad_clip=0", "runtime.optimizer_overlap=speculate"}),
                           data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  Trainer& trainer = **t;
  EXPECT_EQ(trainer.undo_chunks(), trainer.store().chunks().num_chunks()) << "the host budget holds every undo copy";
  ChunkEventLog log;
  trainer.SetEventLog(&log);
  // The step's thread waits, at its first backward use after a gradient of
  // step 2 became final, for an update of step 2 to begin: only updates
  // started during the backward pass let it go on.
  std::mutex mu;
  std::condition_variable cv;
  bool final_seen = false, update_begun = false, held = false, timed_out = false;
  log.SetListener([&](const ChunkEvent& e) {
    std::unique_lock<std::mutex> lock(mu);
    if (e.step != 2) return;
    if (e.kind == ChunkEventKind::kUpdateBegin) {
      update_begun = true;
      cv.notify_all();
    } else if (e.kind == ChunkEventKind::kGradFinal) {
      final_seen = true;
    } else if (e.kind == ChunkEventKind::kBackwardUse && final_seen && !held) {
      held = true;
      timed_out = !cv.wait_for(lock, std::chrono::seconds(20), [&] { return update_begun; });
    }
  });
  std::vector<StepStats> stats;
  for (int s = 0; s < 4; ++s) {
    auto st = trainer.Step();
    ASSERT_TRUE(st.ok()) << st.status().message();
    stats.push_back(*st);
  }
  trainer.FinishUpdates();
  log.SetListener(nullptr);
  EXPECT_TRUE(held);
  EXPECT_FALSE(timed_out) << "no update began during step 2's backward pass";
  EXPECT_EQ(stats[0].speculated_chunks, 0) << "the first step learns where gradients become final";
  for (int s = 1; s < 4; ++s) {
    EXPECT_EQ(stats[size_t(s)].speculated_chunks, trainer.store().chunks().num_chunks()) << "step " << s;
    EXPECT_FALSE(stats[size_t(s)].rolled_back) << "step " << s;
  }
  EXPECT_EQ(trainer.speculation_totals().steps, 3);
  EXPECT_EQ(trainer.speculation_totals().rolled_back, 0);
  const std::vector<ChunkEvent> events = log.Events();
  EXPECT_LT(Find(events, 2, ChunkEventKind::kUpdateBegin), FindLast(events, 2, ChunkEventKind::kBackwardUse))
      << "an update during the backward pass";
  for (int32_t c = 0; c < trainer.store().chunks().num_chunks(); ++c) {
    for (int64_t step = 1; step < 4; ++step) {
      const int64_t final_at = Find(events, step, ChunkEventKind::kGradFinal, c);
      const int64_t begun = Find(events, step, ChunkEventKind::kUpdateBegin, c);
      ASSERT_GE(final_at, 0) << "chunk " << c << " step " << step;
      ASSERT_GE(begun, 0) << "chunk " << c << " step " << step;
      EXPECT_LT(final_at, begun) << "chunk " << c << " step " << step;
      // Its last use in the step came before it was final.
      for (const ChunkEvent& e : events) {
        if (e.step == step && e.chunk == c &&
            (e.kind == ChunkEventKind::kForwardUse || e.kind == ChunkEventKind::kBackwardUse)) {
          EXPECT_LT(e.seq, final_at) << "chunk " << c << " step " << step;
        }
      }
    }
  }
}

TEST(OptimizerOverlap, AClippedStepUndoesItsSpeculationAndRedoesItWithTheClip) {
  auto data = test::RandomTokens(4000, 40, 18);
  // A high learning rate, whose norms rise after the first steps.
  std::vector<std::string> o = {"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                "train.grad_clip=0", "train.steps=10", "optimizer.params.lr=0.3"};
  // The unclipped norms say where a clip first bites after clean steps:
  // step s, whose norm exceeds every earlier one; the clip goes between.
  std::vector<double> norms;
  {
    auto probe = Trainer::Create(test::TinyGptConfig(o), data);
    ASSERT_TRUE(probe.ok());
    for (int s = 0; s < 10; ++s) norms.push_back((*probe)->Step()->grad_norm);
  }
  int64_t clipped = -1;
  double highest = norms[0];
  for (size_t s = 1; s < norms.size() && clipped < 0; ++s) {
    if (norms[s] > highest * 1.001) clipped = int64_t(s);
    highest = std::max(highest, norms[s]);
  }
  ASSERT_GT(clipped, 0) << "no step's norm exceeds the ones before it";
  double before = 0.0;
  for (int64_t s = 0; s < clipped; ++s) before = std::max(before, norms[size_t(s)]);
  const float clip = float((before + norms[size_t(clipped)]) / 2);
  o[2] = "train.grad_clip=" + std::to_string(clip);
  o[3] = "train.steps=" + std::to_string(clipped + 1);
  std::vector<std::string> speculate = o;
  speculate.push_back("runtime.optimizer_overlap=speculate");
  auto t = Trainer::Create(test::TinyGptConfig(speculate), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChunkEventLog log;
  (*t)->SetEventLog(&log);
  StepStats last;
  for (int64_t s = 0; s <= clipped; ++s) last = *(*t)->Step();
  (*t)->FinishUpdates();
  EXPECT_EQ(last.speculated_chunks, (*t)->store().chunks().num_chunks());
  EXPECT_TRUE(last.rolled_back);
  EXPECT_EQ((*t)->speculation_totals().rolled_back, 1);
  EXPECT_EQ((*t)->speculation_totals().steps, clipped);
  const std::vector<ChunkEvent> events = log.Events();
  int64_t undone = 0;
  for (const ChunkEvent& e : events) {
    if (e.step != clipped || e.kind != ChunkEventKind::kUpdateUndone) continue;
    ++undone;
    // Undone after its speculative update, then updated again with the clip.
    int64_t begins_before = 0, begins_after = 0;
    for (const ChunkEvent& f : events) {
      if (f.step != clipped || f.chunk != e.chunk || f.kind != ChunkEventKind::kUpdateBegin) continue;
      (f.seq < e.seq ? begins_before : begins_after) += 1;
    }
    EXPECT_EQ(begins_before, 1) << "chunk " << e.chunk;
    EXPECT_EQ(begins_after, 1) << "chunk " << e.chunk;
  }
  EXPECT_EQ(undone, (*t)->store().chunks().num_chunks());
  // And the bits are the synchronous run's.
  std::vector<std::string> off = o;
  off.push_back("runtime.optimizer_overlap=off");
  auto reference = Trainer::Create(test::TinyGptConfig(off), data);
  ASSERT_TRUE(reference.ok());
  for (int64_t s = 0; s <= clipped; ++s) ASSERT_TRUE((*reference)->Step().ok());
  for (StateKind kind : {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    ExpectSameBits(test::TensorCopies((*reference)->store(), kind), test::TensorCopies((*t)->store(), kind),
                   StateKindName(kind));
  }
}

TEST(OptimizerOverlap, AnOverflowSkipUndoesTheSpeculationAndUpdatesNothing) {
  auto data = test::RandomTokens(4000, 40, 20);
  // fp16 whose scale doubles after two clean steps until it overflows again:
  // those steps speculated (the one before was clean) and are skipped.
  const std::vector<std::string> o = {"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                      "train.grad_clip=0",       "train.precision=fp16",
                                      "fp16.initial_scale_power=20", "fp16.hysteresis=1",
                                      "fp16.loss_scale_window=2", "train.steps=16"};
  const TrainedRun off = Train(o, data, "off");
  const TrainedRun speculated = Train(o, data, "speculate");
  ExpectBitIdentical(off, speculated, "fp16 overflow skips");
  int64_t skipped_after_speculating = 0;
  for (size_t s = 0; s < speculated.skipped.size(); ++s) {
    if (speculated.skipped[s] && speculated.speculated[s] > 0) {
      ++skipped_after_speculating;
      EXPECT_TRUE(speculated.rolled_back[s]) << "step " << s;
    }
    if (!speculated.skipped[s]) { EXPECT_FALSE(speculated.rolled_back[s]) << "step " << s; }
  }
  EXPECT_GT(skipped_after_speculating, 0) << "an overflow after a clean step";
}

TEST(OptimizerOverlap, TheUndoBudgetBoundsTheChunksSpeculatedAndThePlanCountsIt) {
  auto data = test::RandomTokens(4000, 40, 19);
  const std::vector<std::string> o = {"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                      "train.grad_clip=0", "train.steps=4"};
  auto plan = PlanMemory(test::TinyGptConfig(o));
  ASSERT_TRUE(plan.ok());
  const int64_t per_chunk = 3 * plan->chunk_bytes;  // one rank: a shard is the chunk
  // Two chunks' undo copies, set: at most two speculate, and the plan's host minimum grows by them.
  std::vector<std::string> two = o;
  two.push_back(Set("runtime.undo_memory", 2 * per_chunk + per_chunk / 2));
  two.push_back("runtime.optimizer_overlap=speculate");
  auto planned = PlanMemory(test::TinyGptConfig(two));
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned->host_undo_bytes, 2 * per_chunk + per_chunk / 2);
  EXPECT_EQ(planned->min_host_bytes, plan->min_host_bytes + planned->host_undo_bytes);
  EXPECT_NE(FormatPlan(*planned).find("speculation undo"), std::string::npos);
  const TrainedRun off = Train(o, data, "off");
  std::vector<std::string> two_only(two.begin(), two.end() - 1);
  const TrainedRun bounded = Train(two_only, data, "speculate");
  EXPECT_EQ(bounded.undo_chunks, 2);
  for (size_t s = 1; s < bounded.speculated.size(); ++s) EXPECT_EQ(bounded.speculated[s], 2) << "step " << s;
  ExpectBitIdentical(off, bounded, "two undo slots");
  // Left to the host budget, which has no room beyond the plan: none speculate.
  std::vector<std::string> tight = o;
  tight.push_back(Set("runtime.host_memory", plan->min_host_bytes));
  const TrainedRun none = Train(tight, data, "speculate");
  EXPECT_EQ(none.undo_chunks, 0);
  EXPECT_EQ(Count(none.speculated), 0);
  ExpectBitIdentical(Train(tight, data, "off"), none, "no undo room");
}

TEST(OptimizerOverlap, EveryStepReportsWhereItWaitedAndTheProfileAddsKernelAndCopyTimes) {
  auto data = test::RandomTokens(4000, 40, 21);
  auto t = Trainer::Create(test::TinyGptConfig({"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                                "train.grad_clip=0", "runtime.optimizer_overlap=speculate",
                                                Set("runtime.device_memory", MinBudget({"default_chunk_size=1024"}))}),
                           data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto first = (*t)->Step();
  ASSERT_TRUE(first.ok());
  EXPECT_GT(first->compute_seconds, 0.0);
  EXPECT_GE(first->update_wait_seconds, 0.0);
  EXPECT_EQ(first->kernel_seconds, -1.0) << "not profiled";
  EXPECT_EQ(first->h2d_seconds, -1.0);
  (*t)->EnableProfiling(0);
  double adam = first->host_adam_seconds;
  for (int s = 0; s < 3; ++s) {
    auto st = (*t)->Step();
    ASSERT_TRUE(st.ok());
    EXPECT_GT(st->compute_seconds, 0.0);
    EXPECT_GE(st->kernel_seconds, 0.0);
    EXPECT_GE(st->compute_idle_seconds, 0.0);
    EXPECT_GT(st->h2d_seconds, 0.0) << "the smallest budget moves chunks every step";
    EXPECT_GE(st->d2h_seconds, 0.0);
    adam += st->host_adam_seconds;
  }
  (*t)->FinishUpdates();
  EXPECT_GT(adam, 0.0);
  EXPECT_GE((*t)->speculation_totals().host_adam_seconds, adam) << "the totals hold every step's and the drained rest";
}

}  // namespace
}  // namespace pstar
