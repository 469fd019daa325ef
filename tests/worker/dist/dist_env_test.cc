#include "worker/dist/dist_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "worker/dist/launch_options.h"

namespace pstar {
namespace {

// A lookup over a fixed set of variables.
class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  explicit FakeEnv(const std::vector<std::string>& entries) {
    for (const std::string& e : entries) vars_[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  }
  std::function<const char*(const char*)> Lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

Result<DistEnv> Parse(std::map<std::string, std::string> vars) {
  FakeEnv env(std::move(vars));
  return ParseDistEnv(env.Lookup());
}

TEST(DistEnv, DefaultsToASingleLocalRank) {
  auto env = Parse({});
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_EQ(env->local_rank, 0);
  EXPECT_EQ(env->local_world_size, 1);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->rdzv_id, "pstar");
}

TEST(DistEnv, ReadsTorchrunVariables) {
  auto env = Parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "1234"}, {"PSTAR_RDZV_ID", "job-7"},
                    {"PSTAR_STORE_TOKEN", "0123abcd"}});
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_addr, "10.0.0.9");
  EXPECT_EQ(env->master_port, 1234);
  EXPECT_EQ(env->rdzv_id, "job-7");
  EXPECT_EQ(env->store_token, "0123abcd");
}

TEST(DistEnv, BadValuesNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "x1"}, {"WORLD_SIZE", "2"}}, "RANK must be an integer, got 'x1'"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK must be in 0..1 (WORLD_SIZE 2), got 2"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK must be in 0..1"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE must be at least 1"},
      {{{"WORLD_SIZE", "4"}}, "RANK is not set, but WORLD_SIZE is 4"},
      {{{"WORLD_SIZE", "2.5"}}, "WORLD_SIZE must be an integer"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
       "LOCAL_RANK must be in 0..1"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}, "LOCAL_WORLD_SIZE must be in 1..2"},
      {{{"MASTER_PORT", "70000"}}, "MASTER_PORT must be in 1..65535, got 70000"},
      {{{"MASTER_PORT", "http"}}, "MASTER_PORT must be an integer, got 'http'"},
      {{{"PSTAR_STORE_TOKEN", std::string(2000, 't')}}, "PSTAR_STORE_TOKEN must have at most 1024 bytes"},
  };
  for (const Case& c : cases) {
    auto env = Parse(c.vars);
    ASSERT_FALSE(env.ok()) << c.needle;
    EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(env.status().message().find(c.needle), std::string::npos) << env.status().message();
  }
}

TEST(LaunchOptions, ParsesOptionsAndTheCommand) {
  auto o = ParseLaunchArgs({"--nproc-per-node", "4", "--nnodes=2", "--node-rank", "1", "--master-addr",
                            "node0", "--master-port", "4000", "--rdzv-id", "run-3", "--", "train", "--config",
                            "x.yaml"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->nproc_per_node, 4);
  EXPECT_EQ(o->nnodes, 2);
  EXPECT_EQ(o->node_rank, 1);
  EXPECT_EQ(o->master_addr, "node0");
  EXPECT_EQ(o->master_port, 4000);
  EXPECT_EQ(o->rdzv_id, "run-3");
  EXPECT_EQ(o->world_size(), 8);
  EXPECT_EQ(o->command, (std::vector<std::string>{"train", "--config", "x.yaml"}));
}

TEST(LaunchOptions, RefusesBadArguments) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--", "info"}, "--nproc-per-node is required"},
      {{"--nproc-per-node", "2"}, "no command"},
      {{"--nproc-per-node", "2", "--"}, "no command"},
      {{"--nproc-per-node", "0", "--", "info"}, "--nproc-per-node must be an integer in 1.."},
      {{"--nproc-per-node", "two", "--", "info"}, "got 'two'"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"--nproc-per-node", "2", "--node-rank", "1", "--", "info"}, "--node-rank 1 is not below --nnodes 1"},
      {{"--nproc-per-node", "2", "--master-port", "0", "--", "info"}, "--master-port must be an integer in 1..65535"},
      {{"--nproc-per-node", "2", "--bogus", "--", "info"}, "unknown option '--bogus'"},
      {{"--nproc-per-node", "2", "info"}, "unknown option 'info'"},
      {{"--nproc-per-node", "2", "--", "launch", "--nproc-per-node", "2"}, "cannot be 'launch'"},
  };
  for (const auto& [args, needle] : cases) {
    auto o = ParseLaunchArgs(args);
    ASSERT_FALSE(o.ok()) << needle;
    EXPECT_EQ(o.status().message().rfind("launch: ", 0), 0u) << o.status().message();
    EXPECT_NE(o.status().message().find(needle), std::string::npos) << o.status().message();
  }
}

TEST(LaunchOptions, RankEnvironmentSetsTheRankVariablesAndKeepsTheRest) {
  auto o = ParseLaunchArgs({"--nproc-per-node", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr",
                            "10.1.2.3", "--master-port", "1234", "--rdzv-id", "job", "--", "info"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  const char* parent[] = {"PATH=/usr/bin", "RANK=9", "MASTER_PORT=1", "HOME=/root", nullptr};
  const std::vector<std::string> env = RankEnvironment(*o, 1, parent);
  auto count = [&](const std::string& entry) { return std::count(env.begin(), env.end(), entry); };
  EXPECT_EQ(count("PATH=/usr/bin"), 1);
  EXPECT_EQ(count("HOME=/root"), 1);
  EXPECT_EQ(count("RANK=9"), 0);
  EXPECT_EQ(count("MASTER_PORT=1"), 0);
  for (const char* e : {"RANK=3", "WORLD_SIZE=6", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=10.1.2.3",
                        "MASTER_PORT=1234", "PSTAR_RDZV_ID=job"}) {
    EXPECT_EQ(count(e), 1) << e;
  }
  // Without OMP_NUM_THREADS the node's cores are shared among its ranks.
  auto omp_entries = [](const std::vector<std::string>& entries) {
    return std::count_if(entries.begin(), entries.end(),
                         [](const std::string& e) { return e.rfind("OMP_NUM_THREADS=", 0) == 0; });
  };
  EXPECT_EQ(omp_entries(env), 1);
  const char* with_threads[] = {"OMP_NUM_THREADS=3", nullptr};
  const std::vector<std::string> kept = RankEnvironment(*o, 0, with_threads);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), "OMP_NUM_THREADS=3"), 1);
  EXPECT_EQ(omp_entries(kept), 1);

  // What a rank reads back is what launch meant.
  FakeEnv child(env);
  auto read = ParseDistEnv(child.Lookup());
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->rank, 3);
  EXPECT_EQ(read->world_size, 6);
  EXPECT_EQ(read->local_rank, 1);
  EXPECT_EQ(read->local_world_size, 2);
  EXPECT_EQ(read->master_addr, "10.1.2.3");
  EXPECT_EQ(read->master_port, 1234);
  EXPECT_EQ(read->store_token, "") << "none given: the environment's own, here none";

  // A token the launcher made replaces any the parent had.
  LaunchOptions with_token = *o;
  with_token.store_token = "feedbeef";
  const char* parent_token[] = {"PSTAR_STORE_TOKEN=old", nullptr};
  const std::vector<std::string> tokened = RankEnvironment(with_token, 0, parent_token);
  EXPECT_EQ(std::count(tokened.begin(), tokened.end(), "PSTAR_STORE_TOKEN=feedbeef"), 1);
  EXPECT_EQ(std::count(tokened.begin(), tokened.end(), "PSTAR_STORE_TOKEN=old"), 0);
  EXPECT_EQ(read->rdzv_id, "job");
}

}  // namespace
}  // namespace pstar
