// Training with a disk tier: the optimizer moments the host budget cannot
// hold are homed on disk, and every result is bit-identical to the same run
// with everything in RAM, at every disk/host/device split and with two ZeRO
// ranks; checkpoints move between runs with and without the tier; a file
// damaged under the run ends it with one line and the last checkpoint loads.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

std::string Set(const std::string& key, int64_t v) { return key + "=" + std::to_string(v); }

// One rank's view of a run: its losses and its shard of every chunk of the
// kinds a checkpoint holds.
struct RankRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> shards;  // owned floats per (kind, chunk): param, exp_avg, exp_avg_sq
  int32_t num_chunks = 0, disk_chunks = 0, disk_masters = 0, device_adam_chunks = 0;
  int64_t disk_read = 0, disk_written = 0;
  std::string disk_path;
  std::string error;
};

// Trains `world` ranks from step `from` (resuming when > 0) to `to`, saving
// a checkpoint after every step when `save`; `job`: the tiny GPT-2 job or
// another decoder's.
std::vector<RankRun> TrainRanks(int world, const std::vector<std::string>& overrides, const TokenSource& data,
                                int64_t from, int64_t to, bool save, test::TinyJob job = test::TinyGptConfig) {
  const Config config = job(overrides);
  auto comms = test::MakeThreadGroupCommunicators(world);
  std::vector<RankRun> runs(static_cast<size_t>(world), RankRun{});
  auto run = [&](int rank) {
    RankRun& r = runs[size_t(rank)];
    auto t = Trainer::Create(config, data, comms[size_t(rank)].get());
    if (!t.ok()) {
      r.error = t.status().message();
      return;
    }
    if (from > 0) {
      auto resumed = (*t)->Resume(nullptr);
      if (!resumed.ok() || *resumed != from) {
        r.error = "resume: " + (resumed.ok() ? std::to_string(*resumed) : resumed.status().message());
        return;
      }
    }
    for (int64_t s = from; s < to; ++s) {
      auto st = (*t)->Step();
      if (!st.ok()) {
        r.error = st.status().message();
        return;
      }
      r.losses.push_back(st->loss);
      if (save) {
        if (Status saved = (*t)->SaveCheckpoint(); !saved.ok()) {
          r.error = saved.message();
          return;
        }
      }
    }
    ParamStore& store = (*t)->store();
    ChunkManager& chunks = store.chunks();
    r.num_chunks = chunks.num_chunks();
    r.disk_chunks = chunks.disk_moment_chunks();
    r.disk_masters = chunks.disk_master_chunks();
    r.device_adam_chunks = chunks.device_adam_chunks();
    if (chunks.disk() != nullptr) {
      r.disk_read = chunks.disk()->read_bytes();
      r.disk_written = chunks.disk()->written_bytes();
      r.disk_path = chunks.disk()->path();
    }
    // What this rank owns of every tensor (chunk padding is never read).
    const ParamLayout& layout = store.layout();
    for (StateKind kind : {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      for (int32_t c = 0; c < chunks.num_chunks(); ++c) {
        const float* p = store.PeekShard(kind, c);
        std::vector<float> owned;
        for (TensorId id : layout.chunk_tensors(c)) {
          const ParamStore::Slice sl = store.OwnedSlice(id);
          owned.insert(owned.end(), p + sl.shard_offset, p + sl.shard_offset + (sl.end - sl.begin));
        }
        r.shards.push_back(std::move(owned));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(run, r);
  for (auto& th : threads) th.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(runs[size_t(r)].error, "") << "rank " << r;
  return runs;
}

void ExpectBitIdentical(const std::vector<RankRun>& a, const std::vector<RankRun>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].losses.size(), b[r].losses.size()) << what;
    EXPECT_EQ(0, std::memcmp(a[r].losses.data(), b[r].losses.data(), a[r].losses.size() * sizeof(float)))
        << what << ": losses of rank " << r;
    ASSERT_EQ(a[r].shards.size(), b[r].shards.size()) << what;
    for (size_t i = 0; i < a[r].shards.size(); ++i) {
      ASSERT_EQ(a[r].shards[i].size(), b[r].shards[i].size()) << what;
      if (a[r].shards[i].empty()) continue;  // a chunk this rank owns nothing of
      ASSERT_EQ(0, std::memcmp(a[r].shards[i].data(), b[r].shards[i].data(), a[r].shards[i].size() * sizeof(float)))
          << what << ": rank " << r << ", shard " << i
                                                << " (kind-major: param, exp_avg, exp_avg_sq)";
    }
  }
}

// The plan's least host bytes for `overrides`.
int64_t MinHostBytes(const std::vector<std::string>& overrides) {
  auto plan = PlanMemory(test::TinyGptConfig(overrides));
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? plan->min_host_bytes : 0;
}

TEST(DiskTierTraining, BitIdenticalForEveryDiskHostAndDeviceSplit) {
  test::TempDir dir("disk-training");
  auto data = test::RandomTokens(3000, 40, 31);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=5"};
  const auto reference = TrainRanks(1, base, data, 0, 5, false);
  const std::string nvme = "runtime.nvme_path=" + dir.path();
  struct Split {
    std::string what;
    std::vector<std::string> overrides;
  };
  // A host budget between "everything" and "no moments at all".
  std::vector<std::string> no_hybrid = base;
  no_hybrid.push_back("optimizer.params.use_hybrid_adam=false");
  const int64_t tight_host = MinHostBytes(no_hybrid) - 1;
  std::vector<Split> splits = {
      {"all moments on disk", {"optimizer.params.use_hybrid_adam=false", nvme}},
      {"a host budget spills some", {"optimizer.params.use_hybrid_adam=false", nvme, Set("runtime.host_memory", tight_host)}},
      {"device, host and disk", {nvme, "runtime.device_memory=" + std::to_string(int64_t(0))}},
      {"accumulation and no read-ahead depth", {"optimizer.params.use_hybrid_adam=false", nvme,
                                                 "train.grad_accum_steps=2", "runtime.prefetch_depth=0",
                                                 "runtime.nvme_read_ahead=0", "runtime.nvme_io_threads=1"}},
      {"a deep disk read-ahead on 5 threads", {"optimizer.params.use_hybrid_adam=false", nvme,
                                               "runtime.nvme_read_ahead=6", "runtime.nvme_io_threads=5"}},
  };
  // A device budget that homes some moments on the device and leaves others.
  {
    auto plan = PlanMemory(test::TinyGptConfig(base));
    ASSERT_TRUE(plan.ok());
    splits[2].overrides[1] =
        Set("runtime.device_memory", plan->activation_bytes + int64_t(double(plan->model_bytes) * 0.6));
  }
  for (const Split& s : splits) {
    std::vector<std::string> o = base;
    o.insert(o.end(), s.overrides.begin(), s.overrides.end());
    if (s.what.find("accumulation") != std::string::npos) {
      // The reference takes the same accumulation.
      std::vector<std::string> ref = base;
      ref.push_back("train.grad_accum_steps=2");
      const auto want = TrainRanks(1, ref, data, 0, 5, false);
      const auto got = TrainRanks(1, o, data, 0, 5, false);
      ExpectBitIdentical(want, got, s.what);
      EXPECT_EQ(got[0].disk_chunks, got[0].num_chunks) << s.what;
      continue;
    }
    const auto got = TrainRanks(1, o, data, 0, 5, false);
    ExpectBitIdentical(reference, got, s.what);
    const RankRun& r = got[0];
    EXPECT_GT(r.disk_chunks, 0) << s.what;
    EXPECT_GT(r.disk_read, 0) << s.what;
    EXPECT_GT(r.disk_written, 0) << s.what;
    EXPECT_FALSE(r.disk_path.empty()) << s.what;
    EXPECT_FALSE(std::filesystem::exists(r.disk_path)) << s.what << ": the file goes with the run";
    if (s.what == "all moments on disk") { EXPECT_EQ(r.disk_chunks, r.num_chunks); }
    if (s.what == "a host budget spills some") { EXPECT_LT(r.disk_chunks, r.num_chunks); }
    if (s.what == "device, host and disk") {
      EXPECT_GT(r.device_adam_chunks, 0);
      EXPECT_EQ(r.device_adam_chunks + r.disk_chunks, r.num_chunks);
    }
  }
}

// The Llama family's decoder through the disk tier: every moment on disk,
// and split between device, host and disk, at one and two ranks.
TEST(DiskTierTraining, LlamaIsBitIdenticalThroughTheDiskTier) {
  test::TempDir dir("disk-training-llama");
  auto data = test::RandomTokens(3000, 150, 37);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=4"};
  const auto reference = TrainRanks(1, base, data, 0, 4, false, test::TinyLlamaConfig);
  auto plan = PlanMemory(test::TinyLlamaConfig(base));
  ASSERT_TRUE(plan.ok());
  const std::string nvme = "runtime.nvme_path=" + dir.path();
  const std::vector<std::vector<std::string>> splits = {
      {"optimizer.params.use_hybrid_adam=false", nvme},
      {nvme, Set("runtime.device_memory", plan->activation_bytes + int64_t(double(plan->model_bytes) * 0.6))}};
  for (const auto& split : splits) {
    std::vector<std::string> o = base;
    o.insert(o.end(), split.begin(), split.end());
    const auto got = TrainRanks(1, o, data, 0, 4, false, test::TinyLlamaConfig);
    ExpectBitIdentical(reference, got, split.back());
    const RankRun& r = got[0];
    EXPECT_GT(r.disk_chunks, 0) << split.back();
    EXPECT_GT(r.disk_written, 0) << split.back();
    if (split.size() == 2 && split[0] == nvme) {
      // Device, host and disk: the device homes some moments, the disk the rest.
      EXPECT_GT(r.device_adam_chunks, 0);
      EXPECT_EQ(r.device_adam_chunks + r.disk_chunks, r.num_chunks);
    } else {
      EXPECT_EQ(r.disk_chunks, r.num_chunks);
      EXPECT_GT(r.disk_read, 0);
    }
  }
  std::vector<std::string> two = base;
  two.insert(two.end(), {"optimizer.params.use_hybrid_adam=false", nvme});
  const auto one_rank = TrainRanks(2, base, data, 0, 4, false, test::TinyLlamaConfig);
  const auto on_disk = TrainRanks(2, two, data, 0, 4, false, test::TinyLlamaConfig);
  ExpectBitIdentical(one_rank, on_disk, "two ranks, moments on disk");
}

// nvme_spill: "auto" homes on disk what a host budget needs (nothing under a
// roomy one), "all" everything that may go there whatever the budget (the
// operator's pods are sized so, their budget a check with headroom).
TEST(DiskTierTraining, SpillAllHomesEverythingWhateverTheBudget) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<std::string> base = {"default_chunk_size=1024", std::string("train.precision=") + precision,
                                           "optimizer.params.use_hybrid_adam=false", "runtime.nvme_path=/scratch",
                                           "runtime.host_memory=8GiB"};
    auto roomy = PlanMemory(test::TinyGptConfig(base));
    ASSERT_TRUE(roomy.ok()) << roomy.status().message();
    EXPECT_EQ(roomy->disk_moment_chunks, 0) << precision;
    std::vector<std::string> all = base;
    all.push_back("runtime.nvme_spill=all");
    auto spilled = PlanMemory(test::TinyGptConfig(all));
    ASSERT_TRUE(spilled.ok()) << spilled.status().message();
    EXPECT_EQ(spilled->disk_moment_chunks, spilled->num_chunks) << precision;
    EXPECT_EQ(spilled->disk_master_chunks, std::string(precision) == "bf16" ? spilled->num_chunks : 0) << precision;
    EXPECT_LT(spilled->min_host_bytes, roomy->min_host_bytes) << precision;
  }
}

// 16-bit runs: the fp32 masters follow the moments to disk, and their 16-bit
// homes on the host are what streams; every split gives the same bits.
TEST(DiskTierTraining, SixteenBitMastersOnDiskAreBitIdenticalForEverySplit) {
  test::TempDir dir("disk-training-masters");
  auto data = test::RandomTokens(3000, 40, 36);
  for (const char* precision : {"bf16", "fp16"}) {
    const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=5",
                                           std::string("train.precision=") + precision,
                                           "optimizer.params.use_hybrid_adam=false"};
    const auto want = TrainRanks(1, base, data, 0, 5, false);
    std::vector<std::string> all = base;
    all.push_back("runtime.nvme_path=" + dir.path());
    const auto got = TrainRanks(1, all, data, 0, 5, false);
    ExpectBitIdentical(want, got, std::string(precision) + ", masters and moments on disk");
    EXPECT_EQ(got[0].disk_chunks, got[0].num_chunks);
    EXPECT_EQ(got[0].disk_masters, got[0].num_chunks);
    // A host budget between "every moment on disk" and "every master too":
    // some masters stay on the host.
    auto plan_all = PlanMemory(test::TinyGptConfig(all));
    ASSERT_TRUE(plan_all.ok()) << plan_all.status().message();
    int64_t budget = plan_all->min_host_bytes;
    std::vector<std::string> some;
    for (int tries = 0; tries < 64; ++tries, budget += 1024) {
      some = all;
      some.push_back(Set("runtime.host_memory", budget));
      auto plan = PlanMemory(test::TinyGptConfig(some));
      ASSERT_TRUE(plan.ok());
      if (plan->disk_master_chunks > 0 && plan->disk_master_chunks < plan->disk_moment_chunks) break;
    }
    const auto partial = TrainRanks(1, some, data, 0, 5, false);
    ExpectBitIdentical(want, partial, std::string(precision) + ", some masters on disk");
    EXPECT_GT(partial[0].disk_masters, 0) << precision;
    EXPECT_LT(partial[0].disk_masters, partial[0].disk_chunks) << precision;
  }
  // Two ZeRO ranks: each gathers the others' 16-bit shards from their homes.
  const std::vector<std::string> two = {"default_chunk_size=1024", "train.steps=4", "train.batch_size=2",
                                        "train.precision=bf16"};
  std::vector<std::string> two_disk = two;
  two_disk.push_back("runtime.nvme_path=" + dir.path());
  const auto got = TrainRanks(2, two_disk, data, 0, 4, false);
  ExpectBitIdentical(TrainRanks(2, two, data, 0, 4, false), got, "two ranks, bf16");
  for (const RankRun& r : got) EXPECT_EQ(r.disk_masters, r.num_chunks);
}

TEST(DiskTierTraining, TwoZeroRanksAreBitIdenticalWithMomentsOnDisk) {
  test::TempDir dir("disk-training-zero");
  auto data = test::RandomTokens(3000, 40, 32);
  const std::vector<std::string> base = {"default_chunk_size=1024", "train.steps=4", "train.batch_size=2"};
  std::vector<std::string> with_disk = base;
  with_disk.push_back("runtime.nvme_path=" + dir.path());
  const auto want = TrainRanks(2, base, data, 0, 4, false);
  const auto got = TrainRanks(2, with_disk, data, 0, 4, false);
  ExpectBitIdentical(want, got, "two ranks");
  for (const RankRun& r : got) {
    EXPECT_EQ(r.disk_chunks, r.num_chunks);
    EXPECT_GT(r.disk_written, 0);
  }
  EXPECT_NE(got[0].disk_path, got[1].disk_path) << "one file per rank";
}

TEST(DiskTierTraining, CheckpointsMoveBetweenRunsWithAndWithoutTheTier) {
  test::TempDir disk("disk-training-ckpt-nvme");
  auto data = test::RandomTokens(3000, 40, 33);
  for (const char* precision : {"fp32", "bf16"}) {
  const std::vector<std::string> base = {"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                         std::string("train.precision=") + precision};
  const std::string nvme = "runtime.nvme_path=" + disk.path();
  const auto whole = TrainRanks(1, base, data, 0, 6, false);
  for (bool disk_first : {true, false}) {
    test::TempDir ckpt("disk-training-ckpt");
    std::vector<std::string> first = base, second = base;
    first.push_back("checkpoint.dir=" + ckpt.path());
    second.push_back("checkpoint.dir=" + ckpt.path());
    (disk_first ? first : second).push_back(nvme);
    const auto head = TrainRanks(1, first, data, 0, 3, true);
    const auto tail = TrainRanks(1, second, data, 3, 6, false);
    const std::string what = std::string(precision) + (disk_first ? ": saved with the tier, resumed without"
                                                                  : ": saved without, resumed with");
    ASSERT_EQ(tail[0].losses.size(), 3u) << what;
    std::vector<RankRun> joined = tail;
    joined[0].losses.insert(joined[0].losses.begin(), head[0].losses.begin(), head[0].losses.end());
    ExpectBitIdentical(whole, joined, what);
    EXPECT_GT((disk_first ? head : tail)[0].disk_chunks, 0) << what;
  }
  }
}

TEST(DiskTierTraining, UnusablePathsAndAllowancesFailAtStartWithOneLine) {
  test::TempDir dir("disk-training-bad");
  auto data = test::RandomTokens(3000, 40, 34);
  const std::vector<std::string> base = {"optimizer.params.use_hybrid_adam=false"};
  auto start = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> o = base;
    o.insert(o.end(), extra.begin(), extra.end());
    auto c = ParseConfig(test::kTinyGptJob, "test", o);
    if (!c.ok()) return c.status();
    auto t = Trainer::Create(*c, data);
    return t.ok() ? Status::Ok() : t.status();
  };
  const std::string file = dir.path() + "/a-file";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (const std::string& path : {dir.path() + "/absent", file, std::string("/proc/self")}) {
    const Status s = start({"runtime.nvme_path=" + path});
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
  const Status small = start({"runtime.nvme_path=" + dir.path(), "runtime.nvme_memory=4096"});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.message().find("runtime.nvme_memory"), std::string::npos) << small.message();
  const Status orphan = start({"runtime.nvme_memory=1GiB"});
  ASSERT_FALSE(orphan.ok());
  EXPECT_NE(orphan.message().find("runtime.nvme_path"), std::string::npos) << orphan.message();
}

// `pstar train` with moments on disk and a checkpoint every step; the test
// damages the disk tier's file while it runs.
TEST(DiskTierTraining, AFileDamagedUnderTheRunEndsItWithOneLineAndTheLastCheckpointLoads) {
  for (const std::string damage : {"truncate", "delete"}) {
    test::TempDir dir("disk-training-damage");
    const std::string nvme = dir.path() + "/nvme", ckpt = dir.path() + "/ckpt";
    std::filesystem::create_directory(nvme);
    const std::string config = dir.path() + "/job.yaml";
    test::WriteText(config, std::string(test::kTinyGptJob) +
                                "default_chunk_size: 1024\n"
                                "runtime: {nvme_path: " + nvme + "}\n"
                                "checkpoint: {dir: " + ckpt + ", every_steps: 1, keep: 0}\n");
    test::ChildProcess run({test::PstarBinary(), "train", "--config", config, "--set", "train.steps=1000000",
                            "--set", "optimizer.params.use_hybrid_adam=false", "--set", "train.log_every=1000"});
    const std::string file = nvme + "/pstar-chunks-rank0.bin";
    // Once two checkpoints are out, the file is damaged.
    for (int i = 0; i < 6000 && !std::filesystem::exists(ckpt + "/step-00000002"); ++i) {
      ASSERT_TRUE(run.Running()) << run.Wait().err;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(std::filesystem::exists(file));
    ASSERT_EQ(damage == "truncate" ? ::truncate(file.c_str(), 0) : ::unlink(file.c_str()), 0) << damage;
    const test::ProcessResult r = run.Wait();
    EXPECT_EQ(r.exit_code, 1) << damage << ": " << r.err;
    const std::string want = damage == "truncate" ? "truncated under the run" : "was deleted under the run";
    EXPECT_NE(r.err.find("pstar: error: disk tier: " + file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    // The newest published checkpoint loads, without the tier.
    auto data = test::RandomTokens(3000, 40, 35);
    auto t = Trainer::Create(test::TinyGptConfig({"default_chunk_size=1024", "checkpoint.dir=" + ckpt}), data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    std::vector<std::string> warnings;
    auto step = (*t)->Resume(&warnings);
    ASSERT_TRUE(step.ok()) << damage << ": " << step.status().message();
    EXPECT_GE(*step, 2) << damage;
    EXPECT_TRUE(warnings.empty()) << damage << ": " << (warnings.empty() ? "" : warnings[0]);
  }
}

// A disk that fills up mid-run (pwrite failing with ENOSPC, through an
// LD_PRELOAD library, once a few steps' writes are in).
TEST(DiskTierTraining, ADiskThatFillsMidRunEndsItWithOneLineAndTheLastCheckpointLoads) {
  if (test::kAddressSanitizer) GTEST_SKIP() << "LD_PRELOAD beside the sanitizer runtime is not supported";
  test::TempDir dir("disk-training-full");
  const std::string nvme = dir.path() + "/nvme", ckpt = dir.path() + "/ckpt";
  std::filesystem::create_directory(nvme);
  const std::string config = dir.path() + "/job.yaml";
  test::WriteText(config, std::string(test::kTinyGptJob) +
                              "default_chunk_size: 1024\n"
                              "runtime: {nvme_path: " + nvme + "}\n"
                              "checkpoint: {dir: " + ckpt + ", every_steps: 1, keep: 0}\n");
  auto plan = PlanMemory(test::TinyGptConfig({"default_chunk_size=1024", "optimizer.params.use_hybrid_adam=false",
                                              "runtime.nvme_path=" + nvme}));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  // Every step writes every disk home once: the fifth step's writes fail.
  const int64_t after = 4 * plan->disk_bytes + 1;
  const test::ProcessResult r = [&] {
    test::ChildProcess run({test::PstarBinary(), "train", "--config", config, "--set", "train.steps=50",
                            "--set", "optimizer.params.use_hybrid_adam=false"},
                           {std::string("LD_PRELOAD=") + PSTAR_ENOSPC_SHIM,
                            "PSTAR_TEST_ENOSPC_AFTER_BYTES=" + std::to_string(after)});
    return run.Wait();
  }();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("pstar: error: disk tier: disk full writing "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(nvme + "/pstar-chunks-rank0.bin"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  auto data = test::RandomTokens(3000, 40, 37);
  auto t = Trainer::Create(test::TinyGptConfig({"default_chunk_size=1024", "checkpoint.dir=" + ckpt}), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::vector<std::string> warnings;
  auto step = (*t)->Resume(&warnings);
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_GE(*step, 3);
  EXPECT_LE(*step, 5);
  EXPECT_TRUE(warnings.empty()) << (warnings.empty() ? "" : warnings[0]);
}

}  // namespace
}  // namespace pstar
