// Data-parallel training as a user runs it: ranks as processes over Gloo on
// loopback, started by `pstar launch` or by hand with the torchrun variables.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"

namespace pstar {
namespace {

using test::RunProcess;

const char* kJob =
    "model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 16}\n"
    "data: {source: generated, generated_tokens: 20000}\n"
    "optimizer: {type: AdamW, params: {lr: 0.005}}\n"
    "train: {batch_size: 4, seq_len: 16, steps: 6, log_every: 1, warmup_steps: 2}\n"
    "default_chunk_size: 4096\n";

std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  std::regex line(R"(step +\d+/\d+ \| loss ([0-9.]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  return losses;
}

double RelativeL2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(Distributed, LaunchedRanksMatchOneRankAndExportTheSameModel) {
  test::TempDir dir("dist");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const std::string job = dir.path() + "/job.yaml";
  auto one = RunProcess({test::PstarBinary(), "train", "--config", job, "--set", "checkpoint.dir=" + dir.path() + "/one"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (int world : {2, 4}) {
    const std::string ckpt = dir.path() + "/world" + std::to_string(world);
    // The same global batch: 4 rows split over the ranks; a tight device tier for 2 ranks.
    std::vector<std::string> argv = {test::PstarBinary(), "launch", "--nproc-per-node", std::to_string(world),
                                     "--master-port", std::to_string(test::FreePort()), "--", "train",
                                     "--config", job, "--set", "train.batch_size=" + std::to_string(4 / world),
                                     "--set", "checkpoint.dir=" + ckpt, "--set", "dist.timeout_seconds=60"};
    if (world == 2) {
      argv.push_back("--set");
      argv.push_back("runtime.device_memory=700KiB");
    }
    auto many = RunProcess(argv);
    ASSERT_EQ(many.exit_code, 0) << many.out << many.err;
    const auto a = Losses(one.out), b = Losses(many.out);
    ASSERT_EQ(a.size(), 6u) << one.out;
    ASSERT_EQ(b.size(), 6u) << many.out;
    for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(a[s], b[s], 2e-4) << "world " << world << " step " << s + 1;
    // Export both and compare every weight.
    auto ex1 = RunProcess({test::PstarBinary(), "export", "--checkpoint", dir.path() + "/one", "--output",
                           dir.path() + "/export-one"});
    ASSERT_EQ(ex1.exit_code, 0) << ex1.err;
    auto ex2 = RunProcess({test::PstarBinary(), "export", "--checkpoint", ckpt, "--output", ckpt + "-export"});
    ASSERT_EQ(ex2.exit_code, 0) << ex2.err;
    auto f1 = SafetensorsFile::Read(dir.path() + "/export-one/model.safetensors");
    auto f2 = SafetensorsFile::Read(ckpt + "-export/model.safetensors");
    ASSERT_TRUE(f1.ok() && f2.ok());
    ASSERT_EQ(f1->tensors().size(), f2->tensors().size());
    for (const auto& [name, tensor] : f1->tensors()) {
      auto x = f1->ToDoubles(name), y = f2->ToDoubles(name);
      ASSERT_TRUE(x.ok() && y.ok()) << name;
      EXPECT_LT(RelativeL2(*y, *x), 1e-3) << "world " << world << ": " << name;
    }
  }
}

TEST(Distributed, CheckpointDirRulesAtStart) {
  test::TempDir dir("ckptrules");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const std::string job = dir.path() + "/job.yaml", ckpt = "checkpoint.dir=" + dir.path() + "/c";
  auto first = RunProcess({test::PstarBinary(), "train", "--config", job, "--set", ckpt});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // Already at train.steps: nothing to do.
  auto again = RunProcess({test::PstarBinary(), "train", "--config", job, "--set", ckpt});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("nothing to train"), std::string::npos) << again.out;
  // A fresh run must not prune the checkpoints that are there.
  auto fresh = RunProcess({test::PstarBinary(), "train", "--config", job, "--set", ckpt, "--set",
                           "checkpoint.resume=false"});
  EXPECT_EQ(fresh.exit_code, 2);
  EXPECT_NE(fresh.err.find("already holds checkpoints"), std::string::npos) << fresh.err;
  // More steps continue from the checkpoint.
  auto more = RunProcess({test::PstarBinary(), "train", "--config", job, "--set", ckpt, "--set", "train.steps=8"});
  EXPECT_EQ(more.exit_code, 0) << more.err;
  EXPECT_NE(more.out.find("resumed: from the checkpoint of step 6"), std::string::npos) << more.out;
  EXPECT_EQ(Losses(more.out).size(), 2u) << more.out;
}

// Env for rank `rank` of `world` ranks started by hand.
std::vector<std::string> RankEnv(int rank, int world, int port) {
  return {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=" + std::to_string(rank),
          "LOCAL_WORLD_SIZE=" + std::to_string(world), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
          "PSTAR_RDZV_ID=test-" + std::to_string(port)};
}

TEST(Distributed, ALostRankEndsTheOthersWithinTheTimeout) {
  test::TempDir dir("lost");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const int port = test::FreePort();
  const std::vector<std::string> argv = {test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml",
                                         "--set", "train.steps=100000", "--set", "train.batch_size=2",
                                         "--set", "dist.timeout_seconds=5"};
  test::ChildProcess rank0(argv, RankEnv(0, 2, port));
  test::ChildProcess rank1(argv, RankEnv(1, 2, port));
  // Wait until training runs, then kill rank 1 outright.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (rank0.Stdout().find("step ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(rank0.Running()) << rank0.Wait().err;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  rank1.Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  while (rank0.Running() && std::chrono::steady_clock::now() - killed < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(rank0.Running()) << "rank 0 still running 30 s after its peer died";
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(15));
  auto r = rank0.Wait();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pstar: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << "the message should name the lost peer: " << r.err;
}

TEST(Distributed, LaunchExitsNonZeroWhenARankIsKilled) {
  test::TempDir dir("launchkill");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  test::ChildProcess launch({test::PstarBinary(), "launch", "--nproc-per-node", "2", "--master-port",
                             std::to_string(test::FreePort()), "--", "train", "--config", dir.path() + "/job.yaml",
                             "--set", "train.steps=100000", "--set", "train.batch_size=2", "--set",
                             "dist.timeout_seconds=5"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (launch.Stdout().find("step ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(launch.Running());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Kill one of its ranks.
  std::ifstream children("/proc/" + std::to_string(launch.pid()) + "/task/" + std::to_string(launch.pid()) +
                         "/children");
  int child = 0;
  ASSERT_TRUE(children >> child) << "no child ranks found";
  ::kill(child, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  while (launch.Running() && std::chrono::steady_clock::now() - killed < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(launch.Running()) << "launch still running 30 s after a rank died";
  auto r = launch.Wait();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(20));
}

TEST(Distributed, AMissingPeerFailsAfterTheRendezvousTimeout) {
  test::TempDir dir("nopeer");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const int port = test::FreePort();
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 of 2 with nobody hosting the store at MASTER_ADDR:MASTER_PORT.
  test::ChildProcess rank1({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                            "dist.timeout_seconds=2"},
                           RankEnv(1, 2, port));
  auto r = rank1.Wait();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("pstar: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_GE(took, std::chrono::milliseconds(1500));
  EXPECT_LT(took, std::chrono::seconds(20));
}

}  // namespace
}  // namespace pstar
