#include "operator/job/sizing.h"

#include <gtest/gtest.h>

#include "operator/job/desired_objects.h"
#include "operator/job/worker_overrides.h"
#include "tests/operator/job/job_fixtures.h"
#include "worker/config/config.h"
#include "worker/plan/memory_plan.h"

namespace pstar::op {
namespace {

using test::FullJob;
using test::MinimalJob;
using test::MustParse;

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kGiB = int64_t(1) << 30;

MemoryPlan PlanOf(const JobSpec& spec) {
  auto config = ParseConfig(spec.config.dump(), "test");
  EXPECT_TRUE(config.ok()) << config.status().message();
  auto plan = PlanMemory(*config, spec.world_size());
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

TEST(HumanBytesTest, Formats) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(512 * kMiB), "512 MiB");
  EXPECT_EQ(HumanBytes(18 * kGiB), "18 GiB");
  EXPECT_EQ(HumanBytes(37 * kGiB + 512 * kMiB), "37.5 GiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
}

TEST(SizePodsTest, CpuJobFiguresFollowThePlan) {
  JobSpec spec = MustParse(MinimalJob());  // cpu, 2 x 2
  const MemoryPlan plan = PlanOf(spec);
  auto sized = SizePods(spec);
  ASSERT_TRUE(sized.ok()) << sized.status().message();
  const PodSizing& s = *sized;
  EXPECT_EQ(s.parameters, plan.parameters);
  EXPECT_EQ(s.model_bytes, plan.model_bytes);
  EXPECT_EQ(s.chunk_bytes, plan.chunk_bytes);
  EXPECT_EQ(s.num_chunks, plan.num_chunks);
  // The plan counts the emulated device tier into min_host_bytes already.
  ASSERT_TRUE(plan.device_is_host_memory);
  EXPECT_GE(s.host_bytes_per_rank, plan.min_host_bytes);
  EXPECT_LT(s.host_bytes_per_rank, plan.min_host_bytes + kMiB);
  EXPECT_EQ(s.host_bytes_per_rank % kMiB, 0);
  EXPECT_EQ(s.device_bytes_per_rank, plan.device_bytes);
  EXPECT_EQ(s.min_device_bytes_per_rank, plan.min_device_bytes);
  EXPECT_EQ(s.ranks_per_pod, 2);
  EXPECT_EQ(s.shm_bytes, kShmCpuBytes);
  EXPECT_EQ(s.launcher_overhead_bytes, kLauncherOverheadBytes);
  EXPECT_EQ(s.need_bytes, 2 * s.host_bytes_per_rank + kShmCpuBytes + kLauncherOverheadBytes);
  EXPECT_EQ(s.request_bytes, s.need_bytes);
  EXPECT_FALSE(s.request_fixed);
  // 10% headroom by default, rounded up to a MiB.
  EXPECT_GE(s.limit_bytes, s.need_bytes * 11 / 10);
  EXPECT_LT(s.limit_bytes, s.need_bytes * 11 / 10 + kMiB);
  // The worker's budget is its share of the limit, and at least its need.
  EXPECT_EQ(s.worker_host_budget_bytes,
            (s.limit_bytes - s.shm_bytes - s.launcher_overhead_bytes) / 2 / kMiB * kMiB);
  EXPECT_GE(s.worker_host_budget_bytes, s.host_bytes_per_rank);
  EXPECT_GE(s.worker_host_budget_bytes, plan.min_host_bytes);
}

TEST(SizePodsTest, ADiskTierTakesTheMomentsOutOfThePodsMemory) {
  const JobSpec plain = MustParse(MinimalJob());  // cpu, 2 x 2: every update on the host
  Json job = MinimalJob();
  job["spec"]["diskTier"] = Json::parse(R"({"volume": "scratch", "size": "10Gi"})");
  job["spec"]["template"]["spec"]["volumes"] = Json::parse(R"([{"name": "scratch", "emptyDir": {}}])");
  const JobSpec disk = MustParse(job);
  auto a = SizePods(plain);
  auto b = SizePods(disk);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  const MemoryPlan p = PlanOf(plain);
  // Both moments of every chunk shard leave each rank's host memory (less the windows they are read through).
  const int64_t moments = 2 * int64_t(p.num_chunks) * p.chunk_bytes / plain.world_size();
  EXPECT_EQ(a->disk_bytes_per_rank, 0);
  EXPECT_GT(b->disk_bytes_per_rank, 0);
  EXPECT_LT(b->host_bytes_per_rank, a->host_bytes_per_rank);
  EXPECT_LE(b->host_bytes_per_rank, a->host_bytes_per_rank - moments + b->disk_bytes_per_rank / 2 + kMiB);
  EXPECT_LT(b->request_bytes, a->request_bytes);
  // The ranks, told nvme_spill=all and the limit's share as their budget (a
  // check with headroom), plan what the pod was sized by: every moment on disk.
  const Json pod0 = DesiredPod(disk, *b, 0, 0);
  std::vector<std::string> sets;
  const Json& args = pod0["spec"]["containers"][0]["args"];
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--set" && args[i + 1].get<std::string>().rfind("runtime.", 0) == 0) sets.push_back(args[i + 1]);
  }
  auto worker_config = ParseConfig(disk.config.dump(), "test", sets);
  ASSERT_TRUE(worker_config.ok()) << worker_config.status().message();
  EXPECT_EQ(worker_config->runtime.host_memory, b->worker_host_budget_bytes);
  EXPECT_EQ(worker_config->runtime.nvme_spill, DiskSpill::kAll);
  auto worker_plan = PlanMemory(*worker_config, disk.world_size());
  ASSERT_TRUE(worker_plan.ok()) << worker_plan.status().message();
  EXPECT_EQ(worker_plan->disk_moment_chunks, worker_plan->num_chunks);
  EXPECT_EQ((worker_plan->min_host_bytes + kMiB - 1) / kMiB * kMiB, b->host_bytes_per_rank);
  EXPECT_GT(b->worker_host_budget_bytes, b->host_bytes_per_rank) << "the budget keeps the limit's headroom";
  // status.memory shows what each rank and each pod homes on the volume.
  EXPECT_EQ(SizingStatus(*a)["diskPerPod"], "0");
  EXPECT_EQ(SizingStatus(*b)["diskPerRank"], StatusQuantity(b->disk_bytes_per_rank));
  EXPECT_EQ(SizingStatus(*b)["diskPerPod"], StatusQuantity(2 * b->disk_bytes_per_rank));
  // The pod's ephemeral storage request covers the emptyDir, and the ranks are told where and how much.
  const Json pod = DesiredPod(disk, *b, 0, 0);
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"], "10Gi");
  // Too small a size is refused with both numbers.
  job["spec"]["diskTier"]["size"] = "4Ki";
  auto small = SizePods(MustParse(job));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("spec.diskTier.size 4Ki"), std::string::npos) << small.status().message();
  EXPECT_NE(small.status().message().find("for the pod's 2 ranks"), std::string::npos) << small.status().message();
}

TEST(SizePodsTest, WorldSizeSplitsTheChunks) {
  Json job = MinimalJob();
  job["spec"]["config"]["model"]["preset"] = "gpt2-124m";
  job["spec"]["numNodes"] = 1;
  job["spec"]["nprocPerNode"] = 1;
  auto one = SizePods(MustParse(job));
  job["spec"]["numNodes"] = 4;
  auto four = SizePods(MustParse(job));
  ASSERT_TRUE(one.ok() && four.ok());
  // Each of four ranks holds a quarter of the home copies.
  const MemoryPlan plan4 = PlanOf(MustParse(job));
  EXPECT_GE(four->host_bytes_per_rank, plan4.min_host_bytes);
  EXPECT_LT(four->host_bytes_per_rank, plan4.min_host_bytes + kMiB);
  EXPECT_LT(four->host_bytes_per_rank, one->host_bytes_per_rank);
  EXPECT_EQ(four->parameters, one->parameters);
}

// A Llama-family job is sized from the same plan the worker makes for it: its
// description (grouped-query heads, SwiGLU, an untied classifier) sets the
// parameter count, the vocabulary tables in row parts set the chunk (not the
// 525M-element embedding), and four ranks each need less than one.
TEST(SizePodsTest, ALlamaJobIsSizedByItsDescription) {
  Json job = MinimalJob();
  job["spec"]["device"] = "cuda";
  job["spec"]["numNodes"] = 1;
  job["spec"]["nprocPerNode"] = 1;
  job["spec"]["config"] = Json::parse(R"({"model": {"preset": "llama-3.1-8b"},
      "runtime": {"device_memory": "64GiB"},
      "train": {"precision": "bf16", "grad_precision": "16bit", "batch_size": 8, "seq_len": 2048,
                "activation_checkpointing": true, "steps": 10}})");
  const JobSpec one_spec = MustParse(job);
  // The worker's plan under the settings the operator gives it.
  auto planned = [](const JobSpec& spec) {
    auto config = ParseConfig(spec.config.dump(), "test", PlannedOverrides(spec));
    EXPECT_TRUE(config.ok()) << config.status().message();
    return *PlanMemory(*config, spec.world_size());
  };
  const MemoryPlan plan = planned(one_spec);
  auto one = SizePods(one_spec);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->parameters, 8030261248);
  EXPECT_EQ(one->parameters, plan.parameters);
  EXPECT_EQ(one->chunk_bytes, plan.chunk_bytes);
  EXPECT_EQ(one->num_chunks, plan.num_chunks);
  EXPECT_LT(one->chunk_bytes, 1 * kGiB) << "the 128k vocabulary set the chunk size";
  EXPECT_EQ(plan.tensors, 291) << "tensors as checkpoints name them";
  EXPECT_EQ(plan.row_parts, 10) << "the embedding and lm_head in five parts each";
  EXPECT_GE(one->host_bytes_per_rank, plan.min_host_bytes);
  EXPECT_LT(one->host_bytes_per_rank, plan.min_host_bytes + kMiB);
  job["spec"]["nprocPerNode"] = 4;
  const JobSpec four_spec = MustParse(job);
  const MemoryPlan plan4 = planned(four_spec);
  auto four = SizePods(four_spec);
  ASSERT_TRUE(four.ok()) << four.status().message();
  EXPECT_GE(four->host_bytes_per_rank, plan4.min_host_bytes);
  EXPECT_LT(four->host_bytes_per_rank, plan4.min_host_bytes + kMiB);
  EXPECT_LT(four->host_bytes_per_rank, one->host_bytes_per_rank);
  EXPECT_EQ(four->ranks_per_pod, 4);
  // A description that cannot be (32 query heads over 5 kv heads) is the
  // config's one-line refusal.
  job["spec"]["config"]["model"]["n_kv_head"] = 5;
  auto bad = ParseJob(job);
  const std::string message = bad.ok() ? (SizePods(*bad).ok() ? "" : SizePods(*bad).status().message())
                                       : bad.status().message();
  EXPECT_NE(message.find("n_kv_head"), std::string::npos) << message;
}

TEST(SizePodsTest, CudaShmDefault) {
  Json job = MinimalJob();
  job["spec"]["device"] = "cuda";
  job["spec"]["nprocPerNode"] = 4;
  auto s = SizePods(MustParse(job));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->shm_bytes, kShmBaseBytes + 4 * kShmPerRankBytes);
  EXPECT_EQ(s->shm_bytes, 512 * kMiB);
  job["spec"]["hostMemory"] = {{"shmSize", "3Gi"}};
  EXPECT_EQ(SizePods(MustParse(job))->shm_bytes, 3 * kGiB);
}

TEST(SizePodsTest, HeadroomPercent) {
  Json job = MinimalJob();
  job["spec"]["hostMemory"] = {{"headroomPercent", 0}};
  auto s = SizePods(MustParse(job));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->limit_bytes, s->need_bytes);  // need is whole MiB
  job["spec"]["hostMemory"] = {{"headroomPercent", 100}};
  s = SizePods(MustParse(job));
  EXPECT_EQ(s->limit_bytes, 2 * s->need_bytes);
  EXPECT_EQ(s->worker_host_budget_bytes,
            (s->limit_bytes - s->shm_bytes - s->launcher_overhead_bytes) / 2 / kMiB * kMiB);
}

TEST(SizePodsTest, FixedRequestAndLimit) {
  Json job = MinimalJob();
  job["spec"]["hostMemory"] = {{"request", "8Gi"}, {"limit", "10Gi"}};
  auto s = SizePods(MustParse(job));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->request_bytes, 8 * kGiB);
  EXPECT_EQ(s->limit_bytes, 10 * kGiB);
  EXPECT_TRUE(s->request_fixed);
  EXPECT_EQ(s->worker_host_budget_bytes, (10 * kGiB - s->shm_bytes - s->launcher_overhead_bytes) / 2 / kMiB * kMiB);
  // A fixed request alone: the limit still has headroom over the need, and is
  // never below the request.
  job["spec"]["hostMemory"] = {{"request", "8Gi"}};
  s = SizePods(MustParse(job));
  EXPECT_EQ(s->limit_bytes, 8 * kGiB);
  // The same through the template's resources.
  job["spec"].erase("hostMemory");
  job["spec"]["template"] = {{"container", {{"resources", {{"limits", {{"memory", "12Gi"}}}}}}}};
  s = SizePods(MustParse(job));
  EXPECT_EQ(s->limit_bytes, 12 * kGiB);
  EXPECT_EQ(s->request_bytes, s->need_bytes);
}

TEST(SizePodsTest, FixedBelowTheNeedIsAnError) {
  Json job = MinimalJob();
  auto computed = SizePods(MustParse(job));
  ASSERT_TRUE(computed.ok());
  job["spec"]["hostMemory"] = {{"request", "100Mi"}};
  auto s = SizePods(MustParse(job));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "spec.hostMemory.request 100Mi (100 MiB) is below the memory each pod needs: " +
                                      DescribePodNeed(*computed));
  EXPECT_NE(s.status().message().find(HumanBytes(computed->need_bytes)), std::string::npos);
  job["spec"]["hostMemory"] = {{"limit", "200Mi"}};
  s = SizePods(MustParse(job));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("spec.hostMemory.limit 200Mi (200 MiB) is below", 0), 0u);
  job["spec"].erase("hostMemory");
  job["spec"]["template"] = {{"container", {{"resources", {{"requests", {{"memory", "1Mi"}}}}}}}};
  s = SizePods(MustParse(job));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("spec.template.container.resources.requests.memory 1Mi (1 MiB) is below", 0),
            0u);
}

TEST(SizePodsTest, UnplannableConfig) {
  Json job = MinimalJob();
  job["spec"]["config"]["default_chunk_size"] = 10;  // smaller than the largest tensor
  auto spec = ParseJob(job);  // the config parses; laying it out fails
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto s = SizePods(*spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("spec.config: ", 0), 0u) << s.status().message();
}

TEST(SizingStatusTest, QuantitiesAndCounts) {
  PodSizing s;
  s.parameters = 124439808;
  s.model_bytes = 4 * kGiB;
  s.chunk_bytes = 32 * kMiB;
  s.num_chunks = 8;
  s.host_bytes_per_rank = 18 * kGiB;
  s.device_bytes_per_rank = 6 * kGiB;
  s.min_device_bytes_per_rank = 1536 * kMiB;
  s.shm_bytes = kGiB;
  s.launcher_overhead_bytes = 512 * kMiB;
  s.request_bytes = 37 * kGiB + 512 * kMiB;
  s.limit_bytes = 40 * kGiB;
  s.worker_host_budget_bytes = 19 * kGiB;
  s.ranks_per_pod = 2;
  s.disk_bytes_per_rank = 3 * kGiB;
  const Json j = SizingStatus(s);
  EXPECT_EQ(j["hostMemoryPerPod"], "38400Mi");
  EXPECT_EQ(j["hostMemoryLimitPerPod"], "40Gi");
  EXPECT_EQ(j["hostMemoryPerRank"], "18Gi");
  EXPECT_EQ(j["workerHostBudget"], "19Gi");
  EXPECT_EQ(j["shmSize"], "1Gi");
  EXPECT_EQ(j["launcherOverhead"], "512Mi");
  EXPECT_EQ(j["deviceMemoryPerRank"], "6Gi");
  EXPECT_EQ(j["minDeviceMemoryPerRank"], "1536Mi");
  EXPECT_EQ(j["modelParameters"], 124439808);
  EXPECT_EQ(j["model"], "124.4M params");
  EXPECT_EQ(j["modelBytes"], "4Gi");
  EXPECT_EQ(j["chunkBytes"], "32Mi");
  EXPECT_EQ(j["chunks"], 8);
  EXPECT_EQ(j["diskPerRank"], "3Gi");
  EXPECT_EQ(j["diskPerPod"], "6Gi");
  EXPECT_EQ(j.size(), 15u);
  // Without a disk tier both read 0.
  EXPECT_EQ(SizingStatus(PodSizing{})["diskPerPod"], "0");
}

// One form for every byte count, odd ones included (a plan's device bytes,
// a fixed request): whole MiB rounded up, Gi when whole; never bare bytes or Ki.
TEST(SizingStatusTest, EveryByteCountHasOneForm) {
  EXPECT_EQ(StatusQuantity(13928998656), "13284Mi");
  EXPECT_EQ(StatusQuantity(33714176), "33Mi");  // 32924Ki
  EXPECT_EQ(StatusQuantity(48 * kGiB), "48Gi");
  EXPECT_EQ(StatusQuantity(1), "1Mi");
  EXPECT_EQ(StatusQuantity(0), "0");
  PodSizing s;
  s.device_bytes_per_rank = 13928998656;
  s.request_bytes = 33714176;
  s.limit_bytes = 48 * kGiB;
  s.model_bytes = 497759232 + 3;
  const Json j = SizingStatus(s);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string() || it.key() == "model") continue;
    const std::string v = it.value();
    EXPECT_TRUE(v == "0" || (v.size() > 2 && (v.ends_with("Mi") || v.ends_with("Gi")) &&
                             v.find_first_not_of("0123456789") == v.size() - 2))
        << it.key() << ": " << v;
  }
}

// --- CheckNodeFit ---------------------------------------------------------

// The sizing of the brief's example: 2 ranks x 18 GiB + 1 GiB shm + 512 MiB.
PodSizing ExampleSizing() {
  PodSizing s;
  s.ranks_per_pod = 2;
  s.host_bytes_per_rank = 18 * kGiB;
  s.shm_bytes = kGiB;
  s.launcher_overhead_bytes = 512 * kMiB;
  s.need_bytes = 37 * kGiB + 512 * kMiB;
  s.request_bytes = s.need_bytes;
  s.limit_bytes = 40 * kGiB;
  return s;
}

Json Node(const std::string& name, const std::string& memory, int gpus = 0, Json labels = Json::object()) {
  Json node = {{"apiVersion", "v1"},
               {"kind", "Node"},
               {"metadata", {{"name", name}, {"labels", std::move(labels)}}},
               {"spec", Json::object()},
               {"status",
                {{"allocatable", {{"memory", memory}, {"cpu", "16"}}},
                 {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  if (gpus > 0) node["status"]["allocatable"]["nvidia.com/gpu"] = std::to_string(gpus);
  return node;
}

JobSpec CudaSpec(int nodes, int nproc) {
  Json job = MinimalJob();
  job["spec"]["device"] = "cuda";
  job["spec"]["numNodes"] = nodes;
  job["spec"]["nprocPerNode"] = nproc;
  return MustParse(job);
}

TEST(CheckNodeFitTest, MessageWhenTheLargestNodeIsTooSmall) {
  const JobSpec spec = CudaSpec(1, 2);
  NodeFit fit = CheckNodeFit(spec, ExampleSizing(), {Node("n2", "16Gi", 8), Node("n1", "32Gi", 8)});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.eligible_nodes, 2);
  EXPECT_EQ(fit.best_node, "n1");
  EXPECT_EQ(fit.largest_allocatable_bytes, 32 * kGiB);
  EXPECT_EQ(fit.needed_bytes, 37 * kGiB + 512 * kMiB);
  EXPECT_EQ(fit.message,
            "each pod needs 37.5 GiB of host memory (2 ranks x 18 GiB + 1 GiB shm + 512 MiB launcher); "
            "the largest eligible node, n1, has 32 GiB allocatable");
}

TEST(CheckNodeFitTest, FitsAndKiloByteAllocatable) {
  const JobSpec spec = CudaSpec(1, 2);
  // Kubelets report allocatable memory in Ki.
  NodeFit fit = CheckNodeFit(spec, ExampleSizing(), {Node("big", "65536000Ki", 2), Node("small", "8Gi", 2)});
  EXPECT_TRUE(fit.fits) << fit.message;
  EXPECT_EQ(fit.best_node, "big");
  EXPECT_EQ(fit.largest_allocatable_bytes, int64_t(65536000) * 1024);
  EXPECT_EQ(fit.message.rfind("fits: each pod needs 37.5 GiB", 0), 0u) << fit.message;
}

TEST(CheckNodeFitTest, NoNodesIsUnchecked) {
  NodeFit fit = CheckNodeFit(CudaSpec(1, 2), ExampleSizing(), {});
  EXPECT_TRUE(fit.fits);
  EXPECT_EQ(fit.eligible_nodes, 0);
  EXPECT_EQ(fit.message.rfind("node fit unchecked", 0), 0u);
}

TEST(CheckNodeFitTest, GpusPerNode) {
  const JobSpec spec = CudaSpec(1, 4);
  NodeFit fit = CheckNodeFit(spec, ExampleSizing(), {Node("n1", "64Gi", 2), Node("cpu-only", "512Gi")});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.eligible_nodes, 0);
  EXPECT_EQ(fit.message, "no node can run the job's pods: of 2 nodes, 2 have fewer than 4 allocatable nvidia.com/gpu");
  // A cpu job does not look at GPUs.
  Json job = MinimalJob();
  job["spec"]["numNodes"] = 1;
  fit = CheckNodeFit(MustParse(job), ExampleSizing(), {Node("cpu-only", "512Gi")});
  EXPECT_TRUE(fit.fits) << fit.message;
}

TEST(CheckNodeFitTest, NodeSelectorAndAffinity) {
  Json job = MinimalJob();
  job["spec"]["numNodes"] = 1;
  job["spec"]["template"] = {{"spec", {{"nodeSelector", {{"pool", "train"}}}}}};
  const JobSpec spec = MustParse(job);
  std::vector<Json> nodes = {Node("big", "1Ti", 0, {{"pool", "serve"}}), Node("mid", "48Gi", 0, {{"pool", "train"}})};
  NodeFit fit = CheckNodeFit(spec, ExampleSizing(), nodes);
  EXPECT_TRUE(fit.fits);
  EXPECT_EQ(fit.eligible_nodes, 1);
  EXPECT_EQ(fit.best_node, "mid");
  nodes.pop_back();
  fit = CheckNodeFit(spec, ExampleSizing(), nodes);
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.message, "no node can run the job's pods: of 1 node, 1 does not match the node selector or affinity");

  job["spec"]["template"] = {{"spec",
                              {{"affinity",
                                {{"nodeAffinity",
                                  {{"requiredDuringSchedulingIgnoredDuringExecution",
                                    {{"nodeSelectorTerms",
                                      {{{"matchExpressions", {{{"key", "zone"}, {"operator", "In"}, {"values", {"b"}}}}}},
                                       {{"matchFields",
                                         {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {"n3"}}}}}}}}}}}}}}}}};
  const JobSpec by_affinity = MustParse(job);
  nodes = {Node("n1", "64Gi", 0, {{"zone", "a"}}), Node("n2", "40Gi", 0, {{"zone", "b"}}), Node("n3", "50Gi")};
  fit = CheckNodeFit(by_affinity, ExampleSizing(), nodes);
  EXPECT_EQ(fit.eligible_nodes, 2);  // n2 by label, n3 by name
  EXPECT_EQ(fit.best_node, "n3");
}

TEST(CheckNodeFitTest, TaintsAndTolerations) {
  Json taints = {{{"key", "dedicated"}, {"value", "gpu"}, {"effect", "NoSchedule"}},
                 {{"key", "soft"}, {"effect", "PreferNoSchedule"}}};
  Json node = Node("tainted", "64Gi", 2);
  node["spec"]["taints"] = taints;
  const JobSpec plain = CudaSpec(1, 2);
  NodeFit fit = CheckNodeFit(plain, ExampleSizing(), {node});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.message, "no node can run the job's pods: of 1 node, 1 has taints the job does not tolerate");

  Json job = MinimalJob();
  job["spec"]["device"] = "cuda";
  job["spec"]["numNodes"] = 1;
  for (const Json& toleration :
       {Json{{"key", "dedicated"}, {"operator", "Equal"}, {"value", "gpu"}, {"effect", "NoSchedule"}},
        Json{{"key", "dedicated"}, {"operator", "Exists"}}, Json{{"operator", "Exists"}},
        Json{{"key", "dedicated"}, {"value", "gpu"}}}) {
    job["spec"]["template"] = {{"spec", {{"tolerations", {toleration}}}}};
    fit = CheckNodeFit(MustParse(job), ExampleSizing(), {node});
    EXPECT_TRUE(fit.fits) << toleration.dump() << ": " << fit.message;
  }
  for (const Json& toleration : {Json{{"key", "dedicated"}, {"value", "cpu"}},
                                 Json{{"key", "dedicated"}, {"operator", "Exists"}, {"effect", "NoExecute"}}}) {
    job["spec"]["template"] = {{"spec", {{"tolerations", {toleration}}}}};
    fit = CheckNodeFit(MustParse(job), ExampleSizing(), {node});
    EXPECT_FALSE(fit.fits) << toleration.dump();
  }
}

TEST(CheckNodeFitTest, UnschedulableAndNotReady) {
  Json cordoned = Node("cordoned", "64Gi", 2);
  cordoned["spec"]["unschedulable"] = true;
  Json down = Node("down", "64Gi", 2);
  down["status"]["conditions"][0]["status"] = "False";
  NodeFit fit = CheckNodeFit(CudaSpec(1, 2), ExampleSizing(), {cordoned, down});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.message, "no node can run the job's pods: of 2 nodes, 2 are unschedulable or not ready");
  fit = CheckNodeFit(CudaSpec(1, 2), ExampleSizing(), {cordoned, down, Node("up", "40Gi", 2)});
  EXPECT_TRUE(fit.fits);
  EXPECT_EQ(fit.best_node, "up");
}

TEST(CheckNodeFitTest, TheGangMustFitAsAWhole) {
  // Three pods of 37.5 GiB and two GPUs: n1 holds two by memory but one by GPUs.
  const JobSpec spec = CudaSpec(3, 2);
  NodeFit fit = CheckNodeFit(spec, ExampleSizing(), {Node("n1", "80Gi", 2), Node("n2", "40Gi", 2)});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.message,
            "each pod needs 37.5 GiB of host memory (2 ranks x 18 GiB + 1 GiB shm + 512 MiB launcher); the job has "
            "3 pods but the 2 eligible nodes can hold only 2 (the largest eligible node, n1, has 80 GiB allocatable)");
  fit = CheckNodeFit(spec, ExampleSizing(), {Node("n1", "80Gi", 4), Node("n2", "40Gi", 2)});
  EXPECT_TRUE(fit.fits) << fit.message;
}

TEST(CheckNodeFitTest, FixedRequestMessage) {
  PodSizing s = ExampleSizing();
  s.request_bytes = 64 * kGiB;
  s.request_fixed = true;
  NodeFit fit = CheckNodeFit(CudaSpec(1, 2), s, {Node("n1", "48Gi", 2)});
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.needed_bytes, 64 * kGiB);
  EXPECT_EQ(fit.message,
            "each pod requests 64 GiB of host memory (fixed in the spec; the plan needs 37.5 GiB: 2 ranks x 18 GiB + "
            "1 GiB shm + 512 MiB launcher); the largest eligible node, n1, has 48 GiB allocatable");
}

}  // namespace
}  // namespace pstar::op

namespace pstar::op {
namespace {

// A job asking for an absurd model is refused when its spec is read, naming
// the limit, instead of being sized (which once allocated until the operator
// died); the largest accepted model sizes in bounded time and memory.
using test::MinimalJob;

TEST(SizePodsTest, AbsurdSizesAreRefusedNamingTheLimit) {
  for (const char* layers : {"1000000000000", "1000000"}) {
    Json job = MinimalJob();
    job["spec"]["config"]["model"]["n_layer"] = std::stoll(layers);
    auto spec = ParseJob(job);
    ASSERT_FALSE(spec.ok()) << layers;
    EXPECT_NE(spec.status().message().find("spec.config: model.n_layer: is " + std::string(layers) +
                                           ", more than the 10000 layers pstar takes"),
              std::string::npos)
        << spec.status().message();
  }
  Json job = MinimalJob();
  job["spec"]["config"]["model"] = {{"n_layer", 10000}, {"n_head", 64}, {"n_embd", 8192}, {"vocab_size", 50257},
                                    {"max_seq_len", 1024}};
  auto spec = ParseJob(job);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto sized = SizePods(*spec);
  ASSERT_TRUE(sized.ok()) << sized.status().message();
}

}  // namespace
}  // namespace pstar::op
