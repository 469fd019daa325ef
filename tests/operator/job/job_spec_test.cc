#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"

#include <gtest/gtest.h>

#include "tests/operator/job/job_fixtures.h"

namespace pstar::op {
namespace {

using test::FullJob;
using test::MinimalJob;
using test::MustParse;

// The error ParseJob gives for `job`; fails the test when it parses.
std::string ErrorOf(const Json& job) {
  auto spec = ParseJob(job);
  EXPECT_FALSE(spec.ok()) << "parsed: " << job.dump();
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message().find('\n'), std::string::npos) << "one line: " << spec.status().message();
  return spec.status().message();
}

TEST(ParseJobTest, MinimalJobGetsDefaults) {
  Json job = MinimalJob();
  job["spec"].erase("numNodes");
  job["spec"].erase("nprocPerNode");
  job["spec"].erase("device");
  JobSpec s = MustParse(job);
  EXPECT_EQ(s.name, "demo");
  EXPECT_EQ(s.ns, "ml");
  EXPECT_EQ(s.uid, "0f1e2d3c-aaaa-bbbb-cccc-000000000001");
  EXPECT_EQ(s.generation, 3);
  EXPECT_EQ(s.num_nodes, 1);
  EXPECT_EQ(s.nproc_per_node, 1);
  EXPECT_EQ(s.device, JobDevice::kCuda);
  EXPECT_EQ(s.master_port, 29500);
  EXPECT_EQ(s.metrics_port, 9400);
  EXPECT_EQ(s.image, "");
  EXPECT_EQ(s.run_policy.backoff_limit, 3);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_EQ(s.run_policy.restart_policy, RestartPolicy::kExitCode);
  EXPECT_EQ(s.run_policy.permanent_exit_codes, std::vector<int32_t>{2});
  EXPECT_FALSE(s.run_policy.active_deadline_seconds.has_value());
  EXPECT_EQ(s.host_memory.headroom_percent, 10);
  EXPECT_EQ(s.host_memory.request_bytes, 0);
  EXPECT_TRUE(s.env.is_array() && s.env.empty());
  EXPECT_EQ(s.config["model"]["preset"], "tiny");
}

TEST(ParseJobTest, MissingNamespaceIsDefault) {
  Json job = MinimalJob();
  job["metadata"].erase("namespace");
  EXPECT_EQ(MustParse(job).ns, "default");
}

TEST(ParseJobTest, TheDiskTierNamesALocalVolumeOfTheTemplate) {
  auto with = [](const Json& disk_tier, const Json& volumes, const Json& mounts = Json()) {
    Json job = MinimalJob();
    job["spec"]["diskTier"] = disk_tier;
    job["spec"]["template"]["spec"]["volumes"] = volumes;
    if (!mounts.is_null()) job["spec"]["template"]["container"]["volumeMounts"] = mounts;
    return ParseJob(job);
  };
  const Json scratch = Json::parse(R"([{"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}}])");
  auto ok = with(Json::parse(R"({"volume": "scratch", "size": "100Gi"})"), scratch);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->disk_tier.mount_path, "/var/lib/pstar/disk-tier");
  EXPECT_EQ(ok->disk_tier.volume_kind, "emptyDir");
  auto eph = with(Json::parse(R"({"volume": "e", "size": "1Ti", "mountPath": "/scratch"})"),
                  Json::parse(R"([{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}])"));
  ASSERT_TRUE(eph.ok()) << eph.status().message();
  EXPECT_EQ(eph->disk_tier.volume_kind, "ephemeral");
  struct Bad {
    Json disk_tier, volumes, mounts;
    std::string want;
  };
  const std::vector<Bad> bad = {
      {Json::parse(R"({"volume": "missing", "size": "1Gi"})"), scratch, Json(), "spec.diskTier.volume 'missing' is not a volume"},
      {Json::parse(R"({"volume": "scratch"})"), scratch, Json(), "spec.diskTier.size is required"},
      {Json::parse(R"({"size": "1Gi"})"), scratch, Json(), "spec.diskTier.volume is required"},
      {Json::parse(R"({"volume": "scratch", "size": "1Gi", "mountPath": "relative"})"), scratch, Json(),
       "spec.diskTier.mountPath must be an absolute path"},
      {Json::parse(R"({"volume": "scratch", "size": "1Gi", "mountPath": "/dev/shm/x"})"), scratch, Json(),
       "spec.diskTier.mountPath"},
      {Json::parse(R"({"volume": "m", "size": "1Gi"})"),
       Json::parse(R"([{"name": "m", "emptyDir": {"medium": "Memory"}}])"), Json(), "an emptyDir in memory"},
      {Json::parse(R"({"volume": "c", "size": "1Gi"})"),
       Json::parse(R"([{"name": "c", "configMap": {"name": "x"}}])"), Json(), "must be an emptyDir, a generic ephemeral"},
      {Json::parse(R"({"volume": "scratch", "size": "1Gi"})"), scratch,
       Json::parse(R"([{"name": "scratch", "mountPath": "/elsewhere"}])"), "spec.diskTier.mountPath mounts it"},
  };
  for (const Bad& b : bad) {
    auto r = with(b.disk_tier, b.volumes, b.mounts);
    ASSERT_FALSE(r.ok()) << b.want;
    EXPECT_NE(r.status().message().find(b.want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
  // The config may not set what spec.diskTier sets.
  Json job = MinimalJob();
  job["spec"]["diskTier"] = Json::parse(R"({"volume": "scratch", "size": "100Gi"})");
  job["spec"]["template"]["spec"]["volumes"] = scratch;
  job["spec"]["config"]["runtime"] = Json::parse(R"({"nvme_path": "/x"})");
  auto clash = ParseJob(job);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("spec.config.runtime.nvme_path"), std::string::npos);
  // Its other settings too, alone (the worker's parser refuses them without
  // a path) or beside a path (this check).
  for (const char* key : {"nvme_memory", "nvme_spill"}) {
    const Json value = key == std::string("nvme_spill") ? Json("all") : Json("1GiB");
    for (const bool with_path : {false, true}) {
      job["spec"]["config"]["runtime"] = {{key, value}};
      if (with_path) job["spec"]["config"]["runtime"]["nvme_path"] = "/x";
      auto set = ParseJob(job);
      ASSERT_FALSE(set.ok()) << key;
      const std::string named = with_path ? "spec.config.runtime.nvme_path" : std::string("runtime.") + key;
      EXPECT_NE(set.status().message().find(named + (with_path ? " is set but" : ": is set but")), std::string::npos)
          << set.status().message();
    }
  }
}

TEST(ParseJobTest, FullJobReadsEveryField) {
  JobSpec s = MustParse(FullJob());
  EXPECT_EQ(s.num_nodes, 3);
  EXPECT_EQ(s.nproc_per_node, 4);
  EXPECT_EQ(s.world_size(), 12);
  EXPECT_EQ(s.device, JobDevice::kCuda);
  EXPECT_EQ(s.image, "registry.example.com/pstar-worker:dev");
  EXPECT_EQ(s.image_pull_policy, "IfNotPresent");
  EXPECT_EQ(s.master_port, 23456);
  EXPECT_EQ(s.metrics_port, 9500);
  EXPECT_EQ(s.nccl.socket_ifname, "eth0");
  ASSERT_TRUE(s.nccl.ib_disable.has_value());
  EXPECT_TRUE(*s.nccl.ib_disable);
  EXPECT_EQ(s.nccl.debug, "WARN");
  EXPECT_EQ(s.nccl.env.at("NCCL_P2P_DISABLE"), "1");
  EXPECT_EQ(s.nccl.env.at("NCCL_ALGO"), "Ring");
  EXPECT_EQ(s.host_memory.request_bytes, int64_t(40) << 30);
  EXPECT_EQ(s.host_memory.limit_bytes, int64_t(48) << 30);
  EXPECT_EQ(s.host_memory.headroom_percent, 25);
  EXPECT_EQ(s.host_memory.shm_bytes, int64_t(2) << 30);
  EXPECT_EQ(s.run_policy.backoff_limit, 5);
  EXPECT_EQ(s.run_policy.active_deadline_seconds, 86400);
  EXPECT_EQ(s.run_policy.ttl_seconds_after_finished, 600);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kAll);
  EXPECT_FALSE(s.run_policy.suspend);
  EXPECT_EQ(s.run_policy.restart_policy, RestartPolicy::kOnFailure);
  EXPECT_EQ(s.run_policy.permanent_exit_codes, (std::vector<int32_t>{2, 3, 127}));
  EXPECT_EQ(s.run_policy.priority_class, "high");
  EXPECT_EQ(s.run_policy.queue, "research-gpu");
  EXPECT_EQ(s.env.size(), 2u);
  const PodOverrides& o = s.overrides;
  EXPECT_EQ(o.labels["team"], "nlp");
  EXPECT_EQ(o.annotations["example.com/owner"], "alice");
  EXPECT_EQ(o.node_selector["gpu"], "a100");
  EXPECT_EQ(o.tolerations.size(), 1u);
  EXPECT_TRUE(o.affinity.contains("nodeAffinity"));
  EXPECT_EQ(o.volumes.size(), 3u);
  EXPECT_EQ(o.volume_mounts.size(), 2u);
  EXPECT_EQ(s.disk_tier.volume, "nvme");
  EXPECT_EQ(s.disk_tier.mount_path, "/nvme");
  EXPECT_EQ(s.disk_tier.size_bytes, int64_t(2) << 40);
  EXPECT_EQ(s.disk_tier.volume_kind, "hostPath");
  EXPECT_EQ(o.image_pull_secrets[0]["name"], "regcred");
  EXPECT_EQ(o.service_account_name, "trainer");
  EXPECT_EQ(o.priority_class_name, "high");
  EXPECT_EQ(o.scheduler_name, "volcano");
  EXPECT_EQ(o.pod_security_context["fsGroup"], 1000);
  EXPECT_EQ(o.pod_security_context["runAsNonRoot"], true);
  EXPECT_EQ(o.security_context["runAsUser"], 1000);
  EXPECT_EQ(o.resources["requests"]["cpu"], "8");
  EXPECT_EQ(o.memory_request_bytes, int64_t(40) << 30);
  EXPECT_EQ(o.memory_limit_bytes, 0);
  EXPECT_EQ(o.env[0]["name"], "OMP_NUM_THREADS");
}

TEST(ParseJobTest, PriorityClassFromSchedulingPolicy) {
  Json job = MinimalJob();
  job["spec"]["runPolicy"] = {{"schedulingPolicy", {{"priorityClass", "batch-low"}}}};
  EXPECT_EQ(MustParse(job).overrides.priority_class_name, "batch-low");
  job["spec"]["template"] = {{"spec", {{"priorityClassName", "other"}}}};
  EXPECT_NE(ErrorOf(job).find("conflicts with spec.runPolicy.schedulingPolicy.priorityClass"), std::string::npos);
}

TEST(ParseJobTest, NodeCounts) {
  Json job = MinimalJob();
  job["spec"]["numNodes"] = 0;
  EXPECT_EQ(ErrorOf(job), "spec.numNodes must be at least 1, got 0");
  job = MinimalJob();
  job["spec"]["nprocPerNode"] = -1;
  EXPECT_EQ(ErrorOf(job), "spec.nprocPerNode must be at least 1, got -1");
  job = MinimalJob();
  job["spec"]["numNodes"] = "2";
  EXPECT_EQ(ErrorOf(job), "spec.numNodes must be an integer, got a string");
  job = MinimalJob();
  job["spec"]["numNodes"] = 1.5;
  EXPECT_EQ(ErrorOf(job), "spec.numNodes must be an integer, got a fraction");
  job = MinimalJob();
  job["spec"]["numNodes"] = 100;
  job["spec"]["nprocPerNode"] = 64;
  EXPECT_NE(ErrorOf(job).find("6400 ranks; the world size must be at most 4096"), std::string::npos);
}

TEST(ParseJobTest, ConfigIsCheckedByTheWorkerParser) {
  Json job = MinimalJob();
  job["spec"]["config"]["model"]["preset"] = "gpt5";
  const std::string error = ErrorOf(job);
  EXPECT_EQ(error.rfind("spec.config: model.preset: unknown preset 'gpt5'", 0), 0u) << error;
  job = MinimalJob();
  job["spec"]["config"]["trian"] = {{"steps", 5}};
  EXPECT_NE(ErrorOf(job).find("spec.config: trian"), std::string::npos);
  job = MinimalJob();
  job["spec"].erase("config");
  EXPECT_EQ(ErrorOf(job), "spec.config is required (the worker's job config)");
  job = MinimalJob();
  job["spec"]["config"] = "model: tiny";
  EXPECT_EQ(ErrorOf(job), "spec.config must be an object, got a string");
}

TEST(ParseJobTest, SpecDeviceSetsTheWorkersDevice) {
  Json job = MinimalJob();  // device: cpu
  job["spec"]["config"]["runtime"]["device"] = "cuda";
  const std::string error = ErrorOf(job);
  EXPECT_EQ(error.rfind("spec.config.runtime.device", 0), 0u) << error;
  EXPECT_NE(error.find("spec.device is \"cpu\""), std::string::npos) << error;
  job["spec"]["device"] = "cuda";
  EXPECT_TRUE(ParseJob(job).ok());
  job["spec"]["config"]["runtime"]["device"] = "cpu";
  EXPECT_FALSE(ParseJob(job).ok());
}

TEST(ParseJobTest, ReservedEnvNames) {
  for (const std::string& name : ReservedEnvNames()) {
    Json job = MinimalJob();
    job["spec"]["env"] = {{{"name", name}, {"value", "x"}}};
    EXPECT_EQ(ErrorOf(job), "spec.env: " + name + " is set by the operator");
    job = MinimalJob();
    job["spec"]["template"] = {{"container", {{"env", {{{"name", name}, {"value", "x"}}}}}}};
    EXPECT_EQ(ErrorOf(job), "spec.template.container.env: " + name + " is set by the operator");
  }
  EXPECT_EQ(ReservedEnvNames().size(), 19u);
}

TEST(ParseJobTest, EnvEntries) {
  Json job = MinimalJob();
  job["spec"]["env"] = {{{"value", "x"}}};
  EXPECT_EQ(ErrorOf(job), "spec.env[0] needs a name");
  job["spec"]["env"] = {{{"name", "A"}, {"value", 3}}};
  EXPECT_EQ(ErrorOf(job), "spec.env[0].value must be a string, got a number");
  job["spec"]["env"] = {{{"name", "A"}, {"valu", "3"}}};
  EXPECT_NE(ErrorOf(job).find("spec.env[0] has unknown field valu"), std::string::npos);
  job["spec"]["env"] = {{{"name", "A"}, {"value", "1"}}};
  job["spec"]["template"] = {{"container", {{"env", {{{"name", "A"}, {"value", "2"}}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.container.env: A is set twice");
  job = MinimalJob();
  job["spec"]["env"] = {{{"name", "NCCL_DEBUG"}, {"value", "INFO"}}};
  job["spec"]["nccl"] = {{"debug", "WARN"}};
  EXPECT_EQ(ErrorOf(job), "spec.env: NCCL_DEBUG is set twice");
}

TEST(ParseJobTest, NcclEnvNeedsNcclNames) {
  Json job = MinimalJob();
  job["spec"]["nccl"] = {{"env", {{"GLOO_SOCKET_IFNAME", "eth0"}}}};
  EXPECT_EQ(ErrorOf(job), "spec.nccl.env.GLOO_SOCKET_IFNAME is not an NCCL variable (names start with NCCL_)");
  job["spec"]["nccl"] = {{"env", {{"NCCL_DEBUG", "INFO"}}}, {"debug", "WARN"}};
  EXPECT_EQ(ErrorOf(job), "spec.nccl.env: NCCL_DEBUG is also set by spec.nccl's own fields");
  job["spec"]["nccl"] = {{"env", {{"NCCL_ALGO", 1}}}};
  EXPECT_EQ(ErrorOf(job), "spec.nccl.env.NCCL_ALGO must be a string, got a number");
}

TEST(ParseJobTest, UnknownFieldsAreNamed) {
  Json job = MinimalJob();
  job["spec"]["numNode"] = 2;
  const std::string error = ErrorOf(job);
  EXPECT_EQ(error.rfind("spec: unknown field numNode (allowed: ", 0), 0u) << error;
  job = MinimalJob();
  job["spec"]["hostMemory"] = {{"requests", "1Gi"}, {"limt", "2Gi"}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.hostMemory: unknown fields limt, requests (allowed: headroomPercent, limit, "
                               "request, shmSize)",
                               0),
            0u);
  job = MinimalJob();
  job["spec"]["runPolicy"] = {{"schedulingPolicy", {{"queueName", "q"}}}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.runPolicy.schedulingPolicy: unknown field queueName", 0), 0u);
  job = MinimalJob();
  job["spec"]["numNodes"] = 2;
  job["spec"]["runPolicy"] = {{"schedulingPolicy", {{"minAvailable", 3}}}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.schedulingPolicy.minAvailable must be at most numNodes (2), got 3");
  job["spec"]["runPolicy"] = {{"schedulingPolicy", {{"minAvailable", 0}}}};
  EXPECT_NE(ErrorOf(job).find("spec.runPolicy.schedulingPolicy.minAvailable"), std::string::npos) << ErrorOf(job);
  job["spec"]["runPolicy"] = {{"schedulingPolicy", {{"minAvailable", 2}}}};
  EXPECT_EQ(MustParse(job).run_policy.min_available, 2);
  job = MinimalJob();
  job["spec"]["template"] = {{"spec", {{"nodeSelectors", {{"a", "b"}}}}}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.template.spec: unknown field nodeSelectors", 0), 0u);
  job = MinimalJob();
  job["spec"]["template"] = {{"container", {{"image", "x"}}}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.template.container: unknown field image", 0), 0u);
  job = MinimalJob();
  job["spec"]["template"] = {{"container", {{"resources", {{"limit", {{"cpu", "1"}}}}}}}};
  EXPECT_NE(ErrorOf(job).find("spec.template.container.resources has unknown field limit"), std::string::npos);
}

TEST(ParseJobTest, Quantities) {
  Json job = MinimalJob();
  job["spec"]["hostMemory"] = {{"request", "1.5Gi"}, {"limit", 3221225472}, {"shmSize", "500M"}};
  JobSpec s = MustParse(job);
  EXPECT_EQ(s.host_memory.request_bytes, int64_t(1536) << 20);
  EXPECT_EQ(s.host_memory.limit_bytes, int64_t(3) << 30);
  EXPECT_EQ(s.host_memory.shm_bytes, 500000000);
  job["spec"]["hostMemory"] = {{"request", "64Gb"}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.hostMemory.request: ", 0), 0u);
  EXPECT_NE(ErrorOf(job).find("64Gb"), std::string::npos);
  job["spec"]["hostMemory"] = {{"limit", "-1Gi"}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.hostMemory.limit: ", 0), 0u);
  job["spec"]["hostMemory"] = {{"shmSize", true}};
  EXPECT_EQ(ErrorOf(job), "spec.hostMemory.shmSize must be a quantity like \"64Gi\", got a boolean");
  job["spec"]["hostMemory"] = {{"request", "8Gi"}, {"limit", "4Gi"}};
  EXPECT_EQ(ErrorOf(job), "spec.hostMemory.limit 4Gi is below spec.hostMemory.request 8Gi");
  job["spec"]["hostMemory"] = {{"headroomPercent", 1001}};
  EXPECT_EQ(ErrorOf(job), "spec.hostMemory.headroomPercent must be at most 1000, got 1001");
  job["spec"]["hostMemory"] = {{"request", "8Gi"}};
  job["spec"]["template"] = {{"container", {{"resources", {{"requests", {{"memory", "9Gi"}}}}}}}};
  EXPECT_EQ(ErrorOf(job),
            "spec.template.container.resources.requests.memory 9Gi conflicts with spec.hostMemory.request 8Gi; set one");
  job["spec"]["template"] = {{"container", {{"resources", {{"requests", {{"memory", "9Gx"}}}}}}}};
  EXPECT_EQ(ErrorOf(job).rfind("spec.template.container.resources.requests.memory: ", 0), 0u);
}

TEST(ParseJobTest, NameLength) {
  EXPECT_EQ(MaxJobNameLength(1), 56);   // "-node-0"
  EXPECT_EQ(MaxJobNameLength(10), 56);  // "-node-9"
  EXPECT_EQ(MaxJobNameLength(11), 55);  // "-node-10"
  EXPECT_EQ(MaxJobNameLength(101), 54);
  Json job = MinimalJob(std::string(56, 'a'));
  job["spec"]["numNodes"] = 10;
  EXPECT_EQ(MustParse(job).name.size(), 56u);
  job["spec"]["numNodes"] = 11;
  EXPECT_EQ(ErrorOf(job), "metadata.name '" + std::string(56, 'a') +
                              "' is 56 characters; at most 55 leave room for the pod names (<name>-node-10) within 63");
  job = MinimalJob("Demo_1");
  EXPECT_NE(ErrorOf(job).find("must be a DNS label"), std::string::npos);
  job = MinimalJob("1demo");
  EXPECT_NE(ErrorOf(job).find("must be a DNS label"), std::string::npos);
  job = MinimalJob("");
  EXPECT_EQ(ErrorOf(job), "metadata.name is required");
}

TEST(ParseJobTest, ExitCodes) {
  Json job = MinimalJob();
  job["spec"]["runPolicy"] = {{"permanentExitCodes", {1, 0}}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.permanentExitCodes[1] must be an exit code from 1 to 255, got 0");
  job["spec"]["runPolicy"] = {{"permanentExitCodes", {256}}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.permanentExitCodes[0] must be an exit code from 1 to 255, got 256");
  job["spec"]["runPolicy"] = {{"permanentExitCodes", {"2"}}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.permanentExitCodes[0] must be an integer, got a string");
  job["spec"]["runPolicy"] = {{"permanentExitCodes", 2}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.permanentExitCodes must be an array of exit codes, got a number");
  job["spec"]["runPolicy"] = {{"permanentExitCodes", Json::array()}};
  EXPECT_TRUE(MustParse(job).run_policy.permanent_exit_codes.empty());
}

TEST(ParseJobTest, EnumsAndPorts) {
  Json job = MinimalJob();
  job["spec"]["device"] = "tpu";
  EXPECT_EQ(ErrorOf(job), "spec.device must be one of cuda, cpu, got 'tpu'");
  job = MinimalJob();
  job["spec"]["imagePullPolicy"] = "always";
  EXPECT_EQ(ErrorOf(job), "spec.imagePullPolicy must be one of Always, IfNotPresent, Never, got 'always'");
  job = MinimalJob();
  job["spec"]["runPolicy"] = {{"cleanPodPolicy", "Some"}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.cleanPodPolicy must be one of Running, All, None, got 'Some'");
  job = MinimalJob();
  job["spec"]["runPolicy"] = {{"restartPolicy", "Always"}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.restartPolicy must be one of ExitCode, OnFailure, Never, got 'Always'");
  job = MinimalJob();
  job["spec"]["runPolicy"] = {{"backoffLimit", -1}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.backoffLimit must be at least 0, got -1");
  job = MinimalJob();
  job["spec"]["runPolicy"] = {{"activeDeadlineSeconds", 0}};
  EXPECT_EQ(ErrorOf(job), "spec.runPolicy.activeDeadlineSeconds must be at least 1, got 0");
  job = MinimalJob();
  job["spec"]["masterPort"] = 70000;
  EXPECT_EQ(ErrorOf(job), "spec.masterPort must be at most 65535, got 70000");
  job = MinimalJob();
  job["spec"]["metricsPort"] = 65535;  // two ranks need 65535 and 65536
  EXPECT_NE(ErrorOf(job).find("spec.metricsPort 65535 leaves no room for 2 ranks' ports"), std::string::npos);
  job = MinimalJob();
  job["spec"]["masterPort"] = 9401;
  EXPECT_EQ(ErrorOf(job), "spec.masterPort 9401 clashes with the metrics ports 9400-9401");
  job["spec"]["metricsPort"] = 0;  // no metrics: no clash
  EXPECT_EQ(MustParse(job).metrics_port, 0);
}

TEST(ParseJobTest, TemplatePieces) {
  Json job = MinimalJob();
  job["spec"]["template"] = {{"spec", {{"volumes", {{{"name", "dshm"}, {"emptyDir", Json::object()}}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.spec.volumes[0] name 'dshm' is used by the operator");
  job["spec"]["template"] = {{"container", {{"volumeMounts", {{{"name", "x"}, {"mountPath", "/dev/shm/"}}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.container.volumeMounts[0].mountPath /dev/shm is mounted by the operator");
  job["spec"]["template"] = {{"spec", {{"tolerations", {"all"}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.spec.tolerations[0] must be an object, got a string");
  job["spec"]["template"] = {{"metadata", {{"labels", {{"team", 5}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.metadata.labels.team must be a string, got a number");
  job["spec"]["template"] = {{"metadata", {{"labels", {{"team", "a b"}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.metadata.labels.team 'a b' is not a valid label value");
  job["spec"]["template"] = {{"spec", {{"securityContext", {{{"fsGroup", 1000}}}}}}};
  EXPECT_EQ(ErrorOf(job), "spec.template.spec.securityContext must be an object, got an array");
  job["spec"]["template"] = {{"spec", {{"securityContext", {{"fsGroup", 1000}, {"runAsNonRoot", true}}}}}};
  EXPECT_EQ(MustParse(job).overrides.pod_security_context["fsGroup"], 1000);
  job["spec"]["template"] = "x";
  EXPECT_EQ(ErrorOf(job), "spec.template must be an object, got a string");
  // GPUs are one per rank on cuda jobs.
  job = MinimalJob();
  job["spec"]["device"] = "cuda";
  job["spec"]["template"] = {{"container", {{"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}}};
  EXPECT_NE(ErrorOf(job).find("spec.template.container.resources.limits.nvidia.com/gpu is 1"), std::string::npos);
  job["spec"]["template"]["container"]["resources"]["limits"]["nvidia.com/gpu"] = "2";
  EXPECT_TRUE(ParseJob(job).ok());
}

TEST(ParseJobTest, NotAnObject) {
  EXPECT_EQ(ErrorOf(Json::array()), "the job must be an object, got an array");
  Json job = MinimalJob();
  job.erase("spec");
  EXPECT_EQ(ErrorOf(job), "spec is required");
  job = MinimalJob();
  job["spec"]["nccl"] = 1;
  EXPECT_EQ(ErrorOf(job), "spec.nccl must be an object, got a number");
}

TEST(ParseJobTest, FieldPathsAreAllAccepted) {
  // Every listed path is read (FullJob sets each); none is listed twice.
  const auto& paths = JobSpecFieldPaths();
  std::set<std::string> unique(paths.begin(), paths.end());
  EXPECT_EQ(unique.size(), paths.size());
  const Json full = FullJob();
  for (const std::string& p : paths) {
    if (p == "template.spec.containers") continue;  // the newer form of template.container (FullJob has that)
    std::string pointer = "/spec/" + p;
    for (char& c : pointer) c = c == '.' ? '/' : c;
    EXPECT_TRUE(full.contains(Json::json_pointer(pointer))) << "FullJob lacks spec." << p;
  }
}

// spec.template as a PodTemplateSpec: what the operator owns is refused with
// the field's path, everything else passes.
TEST(ParseJobTest, PodTemplateSpecFieldsAreCheckedAndOwnedOnesRefused) {
  auto with_template = [](const Json& spec_patch) {
    Json job = MinimalJob();
    job["spec"]["template"] = spec_patch;
    return job;
  };
  struct Case {
    const char* template_;
    std::string error;
  };
  const std::vector<Case> cases = {
      {R"({"spec": {"containers": [{"name": "worker", "command": ["sh"]}]}})",
       "spec.template.spec.containers[0].command is set by the operator"},
      {R"({"spec": {"containers": [{"name": "worker", "args": ["x"]}]}})",
       "spec.template.spec.containers[0].args is set by the operator"},
      {R"({"spec": {"containers": [{"name": "worker"}]}, "container": {"env": []}})",
       "spec.template.container and spec.template.spec.containers[0] (the worker container) are two forms"},
      {R"({"spec": {"containers": [{"name": "worker"}, {"name": "log-shipper"}]}})",
       "spec.template.spec.containers[1].image is required"},
      {R"({"spec": {"containers": [{"name": "worker"}, {"name": "worker"}]}})",
       "spec.template.spec.containers[1].name 'worker' is used twice"},
      {R"({"spec": {"containers": [{"image": "x"}]}})", "spec.template.spec.containers[0].name is required"},
      {R"({"spec": {"hostname": "h"}})", "spec.template.spec.hostname is set by the operator"},
      {R"({"spec": {"restartPolicy": "Always"}})", "spec.template.spec.restartPolicy is set by the operator"},
      {R"({"spec": {"hostNetwork": "yes"}})", "spec.template.spec.hostNetwork must be true or false, got a string"},
      {R"({"spec": {"initContainers": [1]}})", "spec.template.spec.initContainers[0] must be an object"},
      {R"({"spec": {"hostNetwrk": true}})", "spec.template.spec: unknown field hostNetwrk"},
      {R"({"spec": {"containers": [{"name": "worker", "ports": [{"name": "rdzv", "containerPort": 1}]}]}})",
       "spec.template.spec.containers[0].ports[0].name 'rdzv' is the operator's"},
      {R"({"spec": {"containers": [{"name": "worker", "livenesProbe": {}}]}})",
       "spec.template.spec.containers[0] has unknown field livenesProbe"},
      {R"({"container": {"envFrom": []}})", "spec.template.container: unknown field envFrom"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(with_template(Json::parse(c.template_)));
    EXPECT_EQ(error.rfind(c.error, 0), 0u) << c.template_ << "\n got: " << error;
  }
  Json image = with_template(Json::parse(R"({"spec": {"containers": [{"name": "worker", "image": "mine:1"}]}})"));
  image["spec"]["image"] = "other:2";
  EXPECT_EQ(ErrorOf(image).rfind("spec.template.spec.containers[0].image 'mine:1' conflicts with spec.image", 0), 0u)
      << ErrorOf(image);
}

}  // namespace
// spec.exportDir: on a volume the worker mounts writable, the config not
// setting the key itself; the export's buffers count in the pods' memory.
TEST(ParseJobTest, ExportDirLiesOnAWritableVolume) {
  auto with_export = [](const std::string& dir, bool read_only) {
    Json job = MinimalJob();
    job["spec"]["exportDir"] = dir;
    job["spec"]["config"]["checkpoint"] = {{"dir", "/out/ckpt"}};
    job["spec"]["template"] = {
        {"spec", {{"volumes", Json::parse(R"([{"name": "out", "persistentVolumeClaim": {"claimName": "out"}}])")}}},
        {"container", {{"volumeMounts", {{{"name", "out"}, {"mountPath", "/out/"}, {"readOnly", read_only}}}}}}};
    return job;
  };
  EXPECT_EQ(MustParse(with_export("/out/llama-ft", false)).export_dir, "/out/llama-ft");
  EXPECT_EQ(MustParse(with_export("/out", false)).export_dir, "/out");
  EXPECT_EQ(ErrorOf(with_export("/tmp/llama-ft", false)),
            "spec.exportDir /tmp/llama-ft is on no volume the worker container mounts (give the volume and its "
            "volumeMount in spec.template): it would be lost with the pod");
  EXPECT_EQ(ErrorOf(with_export("/outside", false)).rfind("spec.exportDir /outside is on no volume", 0), 0u);
  EXPECT_EQ(ErrorOf(with_export("/out/ft", true)), "spec.exportDir /out/ft is on 'out', which the worker mounts readOnly");
  EXPECT_EQ(ErrorOf(with_export("out/ft", false)),
            "spec.exportDir must be an absolute path below / without '..', got 'out/ft'");
  EXPECT_EQ(ErrorOf(with_export("/out/../etc", false)),
            "spec.exportDir must be an absolute path below / without '..', got '/out/../etc'");
  Json both = with_export("/out/ft", false);
  both["spec"]["config"]["checkpoint"]["export_dir"] = "/out/other";
  EXPECT_EQ(ErrorOf(both),
            "spec.config.checkpoint.export_dir is set but spec.exportDir sets it: remove it from the config");
  // The worker's own check: the export is of the final checkpoint.
  Json no_checkpoint = with_export("/out/ft", false);
  no_checkpoint["spec"]["config"].erase("checkpoint");
  const JobSpec spec = MustParse(no_checkpoint);
  auto sizing = SizePods(spec);
  ASSERT_FALSE(sizing.ok());
  EXPECT_NE(sizing.status().message().find("checkpoint.export_dir: needs checkpoint.dir"), std::string::npos)
      << sizing.status().message();
}

}  // namespace pstar::op
