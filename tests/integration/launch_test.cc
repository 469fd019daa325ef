// pstar launch as a user runs it: ranks forked with their environment, a
// two-rank training run over Gloo, the first failing rank stopping the rest,
// signals forwarded, bad usage refused.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "tests/test_util.h"

namespace pstar {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// A tiny training job of `steps` steps, logging every step.
std::string WriteJob(const test::TempDir& dir, int64_t steps) {
  const std::string path = dir.path() + "/job.yaml";
  test::WriteText(path,
                  "model: {n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, max_seq_len: 16}\n"
                  "train: {batch_size: 2, seq_len: 8, steps: " + std::to_string(steps) +
                      ", log_every: 1, threads: 1}\n");
  return path;
}

// Waits up to 20 s until rank 0 has logged `steps` training steps.
bool WaitForSteps(const test::ChildProcess& launch, int steps) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Count(launch.Stdout(), "| loss ") < steps) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return true;
}

// The pid of a process whose environment holds every one of `entries`.
pid_t FindProcessWithEnv(const std::vector<std::string>& entries) {
  const std::string nul(1, '\0');
  for (const auto& proc : std::filesystem::directory_iterator("/proc")) {
    const std::string name = proc.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(proc.path() / "environ", std::ios::binary);
    const std::string env = nul + std::string(std::istreambuf_iterator<char>(in), {});
    bool all = true;
    for (const std::string& e : entries) all = all && env.find(nul + e + nul) != std::string::npos;
    if (all) return pid_t(std::stol(name));
  }
  return -1;
}

TEST(Launch, RunsEveryRankAndExitsZero) {
  auto r = test::RunProcess({test::PstarBinary(), "launch", "--nproc-per-node", "2", "--", "info"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Count(r.out, "pstar "), 2) << r.out;
  EXPECT_EQ(Count(r.out, "cuda: "), 2) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(Launch, TrainsTwoRanksOverGloo) {
  test::TempDir dir("launch");
  auto r = test::RunProcess({test::PstarBinary(), "launch", "--nproc-per-node", "2", "--master-port",
                             std::to_string(test::FreePort()), "--", "train", "--config", WriteJob(dir, 3)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: steps=3"), std::string::npos) << r.out;
}

// torchrun's spellings: underscores, --opt=value, and --standalone (one node,
// a rendezvous port picked free by the launcher).
TEST(Launch, TakesTorchrunSpellingsAndStandalone) {
  test::TempDir dir("launch");
  auto r = test::RunProcess({test::PstarBinary(), "launch", "--nproc_per_node=2", "--standalone", "--", "train",
                             "--config", WriteJob(dir, 2)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: steps=2"), std::string::npos) << r.out;
  auto spelled = test::RunProcess({test::PstarBinary(), "launch", "--nproc_per_node", "2", "--nnodes", "1",
                                   "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                                   std::to_string(test::FreePort()), "--rdzv_id", "torchrun-spelling", "--", "train",
                                   "--config", WriteJob(dir, 2)});
  ASSERT_EQ(spelled.exit_code, 0) << spelled.err;
  EXPECT_NE(spelled.out.find("summary: steps=2"), std::string::npos) << spelled.out;
  auto two_nodes = test::RunProcess(
      {test::PstarBinary(), "launch", "--nproc_per_node", "1", "--standalone", "--nnodes", "2", "--", "info"});
  EXPECT_EQ(two_nodes.exit_code, 2);
  EXPECT_NE(two_nodes.err.find("--standalone runs one node"), std::string::npos) << two_nodes.err;
}

TEST(Launch, AFailingRankStopsTheRestAndSetsTheExitCode) {
  const auto start = Clock::now();
  auto r = test::RunProcess(
      {test::PstarBinary(), "launch", "--nproc-per-node", "2", "--", "train", "--config", "/nonexistent.yaml"});
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("config /nonexistent.yaml"), std::string::npos) << r.err;
  // One line from launch, naming the rank that failed and how.
  EXPECT_EQ(Count(r.err, "exited with status 2; stopping the other ranks\n"), 1) << r.err;
  EXPECT_TRUE(r.err.find("pstar: error: rank 0 exited") != std::string::npos ||
              r.err.find("pstar: error: rank 1 exited") != std::string::npos)
      << r.err;
}

TEST(Launch, AKilledRankEndsTheJobNamingIt) {
  test::TempDir dir("launch");
  const int port = test::FreePort();
  const std::string id = "kill-test-" + std::to_string(port);
  test::ChildProcess launch({test::PstarBinary(), "launch", "--nproc-per-node", "2", "--master-port",
                             std::to_string(port), "--rdzv-id", id, "--", "train", "--config",
                             WriteJob(dir, 1000000)});
  ASSERT_TRUE(WaitForSteps(launch, 3)) << launch.Stdout();
  const pid_t rank1 = FindProcessWithEnv({"PSTAR_RDZV_ID=" + id, "RANK=1"});
  ASSERT_GT(rank1, 0);
  const auto start = Clock::now();
  ::kill(rank1, SIGKILL);
  auto r = launch.Wait();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(8));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_NE(r.err.find("pstar: error: rank 1 was killed by signal 9"), std::string::npos) << r.err;
  // Rank 0 either stopped on the launcher's SIGTERM between steps or lost its
  // peer inside a collective; then its error names the peer.
  const size_t lost = r.err.find("lost the connection to");
  if (lost != std::string::npos) {
    EXPECT_EQ(r.err.find("lost the connection to rank 1"), lost) << r.err;
  }
}

TEST(Launch, ForwardsSigtermToTheRanks) {
  test::TempDir dir("launch");
  // One rank: this tests the launcher's signal handling, not a distributed run.
  test::ChildProcess launch({test::PstarBinary(), "launch", "--nproc-per-node", "1", "--master-port",
                             std::to_string(test::FreePort()), "--", "train", "--config", WriteJob(dir, 1000000)});
  ASSERT_TRUE(WaitForSteps(launch, 1)) << launch.Stdout();
  const auto start = Clock::now();
  launch.Signal(SIGTERM);
  auto r = launch.Wait();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(8));
  // The rank stopped on the forwarded signal (train exits 130 when asked to
  // stop) and launch passed its code on; nothing had to be killed.
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("stopping after step"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("killing them"), std::string::npos) << r.err;
}

TEST(Launch, BadUsageIsOneErrorLineAndExitTwo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"launch", "--bogus"}, {"launch", "--nproc-per-node", "2"},
        {"launch", "--", "info"}, {"launch", "--nproc-per-node", "x", "--", "info"}}) {
    std::vector<std::string> argv = {test::PstarBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = test::RunProcess(argv);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(Count(r.err, "\n"), 1) << r.err;
    EXPECT_EQ(r.err.rfind("pstar: error: launch: ", 0), 0u) << r.err;
  }
}

}  // namespace
}  // namespace pstar
