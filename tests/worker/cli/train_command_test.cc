// pstar train's phases, called one by one as TrainCommand calls them.
#include "worker/cli/train_command.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"
#include "tests/worker/tiny_gpt_job.h"

namespace pstar::cli {
namespace {

TEST(TrainFlags, TakesItsOwnFlagsInBothFormsAndLeavesTheJobsToTheJob) {
  auto flags = ParseTrainFlags({"--chunk-events", "ev.csv", "--log-format=json", "--set", "train.steps=3", "--profile"});
  ASSERT_TRUE(flags.ok()) << flags.status().message();
  EXPECT_EQ(flags->chunk_events_path, "ev.csv");
  EXPECT_EQ(flags->log_format, LogFormat::kJson);
  EXPECT_EQ(flags->job.overrides, std::vector<std::string>{"train.steps=3"});
  EXPECT_TRUE(flags->job.Has("--profile"));
  EXPECT_FALSE(flags->job.Has("--comm-alone"));

  auto other = ParseTrainFlags({"--chunk-events=out.csv", "--log-format", "text"});
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_EQ(other->chunk_events_path, "out.csv");
  EXPECT_EQ(other->log_format, LogFormat::kText);
}

TEST(TrainFlags, RefusesEachMalformedFlagByName) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--chunk-events"}, "--chunk-events needs a file to write"},
      {{"--chunk-events="}, "--chunk-events needs a file to write"},
      {{"--log-format"}, "--log-format needs a value (text or json)"},
      {{"--log-format=yaml"}, "--log-format: expected text or json, got 'yaml'"},
  };
  for (const auto& [args, message] : cases) {
    auto flags = ParseTrainFlags(args);
    ASSERT_FALSE(flags.ok()) << args[0];
    EXPECT_EQ(flags.status().message(), message);
  }
  EXPECT_FALSE(ParseTrainFlags({"--no-such-flag"}).ok());
}

Config TinyJob(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {"data.generated_tokens=4096", "train.log_every=100"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return test::TinyGptConfig(overrides);
}

TEST(TrainPhases, SetUpTrainAndResumeOneRank) {
  test::TempDir dir("train-phases");
  const std::string ckpt = dir.path() + "/ckpt";
  const Config c = TinyJob({"checkpoint.dir=" + ckpt, "checkpoint.resume=false"});
  TrainFlags flags;
  std::atomic<bool> stop{false};
  {
    auto rank = SetUpRank(c, flags);
    ASSERT_TRUE(rank.ok()) << rank.status().message();
    EXPECT_TRUE((*rank)->lead());
    EXPECT_EQ((*rank)->env.world_size, 1);
    EXPECT_EQ((*rank)->val_data, nullptr);
    auto first = FirstStep(**rank, c);
    ASSERT_TRUE(first.ok()) << first.status().message();
    EXPECT_EQ(*first, 0);
    EXPECT_EQ(TrainSteps(**rank, c, flags, *first, &stop), kExitOk);
    EXPECT_EQ((*rank)->trainer->steps_taken(), c.train.steps);
  }
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/latest"));
  {
    // A fresh run into the directory would prune what it holds.
    auto rank = SetUpRank(c, flags);
    ASSERT_TRUE(rank.ok()) << rank.status().message();
    auto first = FirstStep(**rank, c);
    ASSERT_FALSE(first.ok());
    EXPECT_NE(first.status().message().find("already holds checkpoints and checkpoint.resume is false"),
              std::string::npos)
        << first.status().message();
  }
  {
    const Config resumed = TinyJob({"checkpoint.dir=" + ckpt, "checkpoint.resume=true", "train.steps=6"});
    auto rank = SetUpRank(resumed, flags);
    ASSERT_TRUE(rank.ok()) << rank.status().message();
    auto first = FirstStep(**rank, resumed);
    ASSERT_TRUE(first.ok()) << first.status().message();
    EXPECT_EQ(*first, c.train.steps);
  }
}

TEST(TrainPhases, AStopRequestEndsTheRunAfterOneStepWithACheckpoint) {
  test::TempDir dir("train-stop");
  const std::string ckpt = dir.path() + "/ckpt";
  const Config c = TinyJob({"checkpoint.dir=" + ckpt});
  TrainFlags flags;
  std::atomic<bool> stop{true};
  auto rank = SetUpRank(c, flags);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(TrainSteps(**rank, c, flags, 0, &stop), kExitInterrupted);
  EXPECT_EQ((*rank)->trainer->steps_taken(), 1);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/latest"));
}

TEST(TrainPhases, TheWarmupSnapshotHoldsTheFirstStepsTraffic) {
  // A device tier smaller than the model: chunks move every step.
  const Config c = TinyJob({"runtime.device_memory=125184"});
  TrainFlags flags;
  auto rank = SetUpRank(c, flags);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  const TrafficAtWarmup before = ReadTrafficAtWarmup(**rank);
  ASSERT_TRUE((*rank)->trainer->Step().ok());
  const TrafficAtWarmup after = ReadTrafficAtWarmup(**rank);
  const RuntimeCounters& rc = (*rank)->trainer->store().chunks().counters();
  for (int d = 0; d < kNumDirections; ++d) {
    EXPECT_EQ(after.moved[size_t(d)], rc.moved_bytes[size_t(d)].load());
    EXPECT_GT(after.moved[size_t(d)], before.moved[size_t(d)]);
  }
  EXPECT_EQ(after.param_h2d, rc.moved_kind_bytes[0][size_t(StateKind::kParam)]);
}

}  // namespace
}  // namespace pstar::cli
