// The steps of DecideJobActions that read a job's pods.
#include "operator/reconciler/gang_pods.h"

#include <gtest/gtest.h>

#include "operator/job/desired_objects.h"

namespace pstar::op {
namespace {

Json Pod(const std::string& name, int attempt, int index, const std::string& phase = "Running") {
  return {{"metadata",
           {{"name", name},
            {"labels", {{kAttemptLabel, std::to_string(attempt)}, {kNodeIndexLabel, std::to_string(index)}}}}},
          {"status", {{"phase", phase}}}};
}

Json Exited(Json pod, int code, const std::string& finished_at, const std::string& reason = "Error") {
  pod["status"]["phase"] = "Failed";
  pod["status"]["containerStatuses"] = Json::array(
      {{{"name", kContainerName},
        {"state", {{"terminated", {{"exitCode", code}, {"finishedAt", finished_at}, {"reason", reason}}}}}}});
  return pod;
}

TEST(GangPods, SortsPodsIntoTheAttemptsGangAndTheStaleOnes) {
  Json going = Pod("old-going", 0, 0);
  going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  Json drained = Pod("drained", 1, 1);
  drained["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  const std::vector<Json> pods = {Pod("old", 0, 0), going, Pod("a", 1, 0), drained, Pod("outside", 1, 5)};
  const GangPods g = ClassifyPods(pods, /*attempt=*/1, /*num_nodes=*/2);
  EXPECT_FALSE(g.ahead);
  EXPECT_TRUE(g.stale);
  EXPECT_EQ(g.stale_to_delete, (std::vector<std::string>{"old", "outside"}));
  ASSERT_EQ(g.gang.size(), 2u);
  EXPECT_EQ(NameOf(*g.gang.at(0)), "a");
  ASSERT_NE(g.deleted, nullptr);
  EXPECT_EQ(NameOf(*g.deleted), "drained");

  EXPECT_TRUE(ClassifyPods({Pod("next", 2, 0)}, 1, 2).ahead);
  const GangPods unlabelled = ClassifyPods({Json{{"metadata", {{"name", "x"}}}}}, 0, 1);
  EXPECT_TRUE(unlabelled.stale);
  EXPECT_TRUE(unlabelled.gang.empty());
}

TEST(GangPods, TheFirstFailureDecidesUnlessAPermanentCodeDoes) {
  const Json early = Exited(Pod("early", 0, 0), 1, "2026-01-01T00:00:01Z");
  const Json late = Exited(Pod("late", 0, 1), 3, "2026-01-01T00:00:09Z");
  const std::map<int, const Json*> gang = {{0, &early}, {1, &late}};
  RunPolicy policy;
  policy.restart_policy = RestartPolicy::kOnFailure;
  GangFailure f = FirstFailure(gang, policy);
  ASSERT_NE(f.pod, nullptr);
  EXPECT_EQ(NameOf(*f.pod), "early");
  EXPECT_FALSE(f.permanent);

  policy.restart_policy = RestartPolicy::kExitCode;
  policy.permanent_exit_codes = {3};
  f = FirstFailure(gang, policy);
  ASSERT_NE(f.pod, nullptr);
  EXPECT_EQ(NameOf(*f.pod), "late");
  EXPECT_TRUE(f.permanent);
  EXPECT_EQ(FailureText(*f.pod), "pod late exited with code 3");

  const Json running = Pod("fine", 0, 0);
  EXPECT_EQ(FirstFailure({{0, &running}}, policy).pod, nullptr);
}

TEST(GangPods, FindsTheOomKillAndCountsTheGang) {
  const Json oom = Exited(Pod("oom", 0, 0), 137, "2026-01-01T00:00:05Z", "OOMKilled");
  const Json ready = Pod("ready", 0, 1);
  Json unready = Pod("unready", 0, 2);
  unready["status"]["conditions"] = Json::array({{{"type", "Ready"}, {"status", "False"}}});
  const Json done = Pod("done", 0, 3, "Succeeded");
  const std::map<int, const Json*> gang = {{0, &oom}, {1, &ready}, {2, &unready}, {3, &done}};
  ASSERT_NE(OomKilledPod(gang), nullptr);
  EXPECT_EQ(NameOf(*OomKilledPod(gang)), "oom");
  EXPECT_EQ(FailureText(oom), "pod oom exited with code 137 (signal 9)");
  const GangCounts n = CountGang(gang);
  EXPECT_EQ(n.succeeded, 1);
  EXPECT_EQ(n.running, 2);
  EXPECT_EQ(n.ready, 1);
  EXPECT_EQ(OomKilledPod({{1, &ready}}), nullptr);
}

}  // namespace
}  // namespace pstar::op
