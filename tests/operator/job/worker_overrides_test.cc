// The operator's --set list: one list for the pods' arguments and the plan.
#include "operator/job/worker_overrides.h"

#include <gtest/gtest.h>

#include "operator/job/desired_objects.h"
#include "tests/operator/job/job_fixtures.h"

namespace pstar::op {
namespace {

std::vector<std::string> PodSets(const Json& pod) {
  std::vector<std::string> sets;
  const Json& args = pod["spec"]["containers"][0]["args"];
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--set") sets.push_back(args[i + 1].get<std::string>());
  }
  return sets;
}

TEST(WorkerOverrides, ThePodsSetEveryOverrideInOrder) {
  const JobSpec spec = test::MustParse(test::FullJob());
  auto sizing = SizePods(spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  std::vector<std::string> want;
  for (const WorkerOverride& o : WorkerOverrides(spec, &*sizing)) want.push_back(o.Set());
  EXPECT_EQ(PodSets(DesiredPod(spec, *sizing, 0, 0)), want);
  ASSERT_GE(want.size(), 2u);
  EXPECT_EQ(want[0], "runtime.device=cuda");
  EXPECT_EQ(want[1], "runtime.host_memory=" + std::to_string(sizing->worker_host_budget_bytes));
}

TEST(WorkerOverrides, ThePlanSeesWhatThePodsSetOfWhatItDependsOn) {
  Json job = test::MinimalJob();
  job["spec"]["diskTier"] = {{"volume", "scratch"}, {"size", "100Gi"}};
  job["spec"]["template"]["spec"]["volumes"] = Json::parse(R"([{"name": "scratch", "emptyDir": {}}])");
  job["spec"]["metricsPort"] = 9400;
  const JobSpec spec = test::MustParse(job);
  ASSERT_TRUE(spec.disk_tier.enabled());
  EXPECT_EQ(PlannedOverrides(spec), (std::vector<std::string>{"runtime.device=cpu",
                                                              "runtime.nvme_path=" + spec.disk_tier.mount_path,
                                                              "runtime.nvme_spill=all"}));
  // Unplanned: the budget the sizing computes, the size it checks itself,
  // the endpoint known only in the pod.
  std::vector<std::string> unplanned;
  for (const WorkerOverride& o : WorkerOverrides(spec, nullptr)) {
    if (!o.planned) unplanned.push_back(o.key);
  }
  EXPECT_EQ(unplanned, (std::vector<std::string>{"runtime.nvme_memory", "metrics.port", "metrics.bind_address"}));
  // The disk tier was planned: the pods' memory dropped by what it homes.
  auto sizing = SizePods(spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  EXPECT_GT(sizing->disk_bytes_per_rank, 0);
}

TEST(WorkerOverrides, AnExportDirIsPlannedSoItsBuffersCountInThePodsMemory) {
  Json job = test::MinimalJob();
  job["spec"]["config"]["checkpoint"] = {{"dir", "/out/ckpt"}};
  job["spec"]["template"] = {
      {"spec", {{"volumes", Json::parse(R"([{"name": "out", "emptyDir": {}}])")}}},
      {"container", {{"volumeMounts", Json::parse(R"([{"name": "out", "mountPath": "/out"}])")}}}};
  const JobSpec without = test::MustParse(job);
  job["spec"]["exportDir"] = "/out/hf";
  const JobSpec with = test::MustParse(job);
  EXPECT_EQ(PlannedOverrides(with),
            (std::vector<std::string>{"runtime.device=cpu", "checkpoint.export_dir=/out/hf"}));
  auto a = SizePods(without), b = SizePods(with);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().message() << b.status().message();
  EXPECT_GT(b->worker_host_budget_bytes, a->worker_host_budget_bytes);
}

}  // namespace
}  // namespace pstar::op
