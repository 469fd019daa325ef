#include "operator/job/desired_objects.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include <gtest/gtest.h>

#include "operator/job/yaml_emit.h"
#include "operator/kube/kube_config.h"
#include "operator/kube/quantity.h"
#include "tests/operator/job/job_fixtures.h"
#include "worker/config/config.h"

namespace pstar::op {
namespace {

using test::FullJob;
using test::MinimalJob;
using test::MustParse;

PodSizing MustSize(const JobSpec& spec) {
  auto s = SizePods(spec);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : PodSizing{};
}

// The value of env var `name` in the pod's worker container ("" if absent).
Json EnvVar(const Json& pod, const std::string& name) {
  for (const Json& e : pod["spec"]["containers"][0]["env"]) {
    if (e["name"] == name) return e;
  }
  return Json();
}

std::vector<std::string> EnvNames(const Json& pod) {
  std::vector<std::string> names;
  for (const Json& e : pod["spec"]["containers"][0]["env"]) names.push_back(e["name"].get<std::string>());
  return names;
}

TEST(NamesTest, DeterministicNames) {
  const JobSpec spec = MustParse(MinimalJob("bert"));
  EXPECT_EQ(ServiceName(spec), "bert");
  EXPECT_EQ(ConfigMapName(spec), "bert-config");
  EXPECT_EQ(PodName(spec, 0), "bert-node-0");
  EXPECT_EQ(PodName(spec, 12), "bert-node-12");
  EXPECT_EQ(MasterAddr(spec, "cluster.local"), "bert-node-0.bert.ml.svc.cluster.local");
  EXPECT_EQ(MasterAddr(spec, "k8s.example"), "bert-node-0.bert.ml.svc.k8s.example");
  EXPECT_EQ(RdzvId(spec, 0), "0f1e2d3c-aaaa-bbbb-cccc-000000000001-0");
  EXPECT_EQ(RdzvId(spec, 4), "0f1e2d3c-aaaa-bbbb-cccc-000000000001-4");
}

TEST(OwnerReferenceTest, ControllerOwner) {
  const JobSpec spec = MustParse(MinimalJob());
  const Json ref = OwnerReference(spec);
  EXPECT_EQ(ref, Json::parse(R"({"apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob", "name": "demo",
                                "uid": "0f1e2d3c-aaaa-bbbb-cccc-000000000001", "controller": true,
                                "blockOwnerDeletion": true})"));
}

TEST(DesiredServiceTest, HeadlessWithPorts) {
  const JobSpec spec = MustParse(MinimalJob());
  const Json svc = DesiredService(spec);
  EXPECT_EQ(svc["apiVersion"], "v1");
  EXPECT_EQ(svc["kind"], "Service");
  EXPECT_EQ(svc["metadata"]["name"], "demo");
  EXPECT_EQ(svc["metadata"]["namespace"], "ml");
  EXPECT_EQ(svc["metadata"]["labels"][kJobNameLabel], "demo");
  EXPECT_EQ(svc["metadata"]["labels"][kManagedByLabel], "pstar-operator");
  EXPECT_EQ(svc["metadata"]["ownerReferences"], Json::array({OwnerReference(spec)}));
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(svc["spec"]["selector"], Json({{"patrickstar.io/job-name", "demo"}}));
  ASSERT_EQ(svc["spec"]["ports"].size(), 2u);
  EXPECT_EQ(svc["spec"]["ports"][0]["name"], "rdzv");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 29500);
  EXPECT_EQ(svc["spec"]["ports"][1]["name"], "metrics");
  EXPECT_EQ(svc["spec"]["ports"][1]["port"], 9400);
  Json job = MinimalJob();
  job["spec"]["metricsPort"] = 0;
  EXPECT_EQ(DesiredService(MustParse(job))["spec"]["ports"].size(), 1u);
}

TEST(DesiredConfigMapTest, HoldsTheConfigAsYaml) {
  const JobSpec spec = MustParse(FullJob());
  const Json cm = DesiredConfigMap(spec);
  EXPECT_EQ(cm["kind"], "ConfigMap");
  EXPECT_EQ(cm["metadata"]["name"], "full-config");
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["uid"], "11111111-2222-3333-4444-555555555555");
  const std::string yaml = cm["data"]["job.yaml"];
  // The worker parses it to the same config as the spec's JSON.
  auto from_yaml = ParseConfig(yaml, "job.yaml");
  auto from_json = ParseConfig(spec.config.dump(), "spec.config");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().message() << "\n" << yaml;
  ASSERT_TRUE(from_json.ok());
  EXPECT_EQ(ConfigToYaml(*from_yaml), ConfigToYaml(*from_json));
  EXPECT_EQ(from_yaml->checkpoint.dir, "/ckpt/full");
  EXPECT_NE(yaml.find("preset: \"gpt2-124m\""), std::string::npos) << yaml;
}

TEST(JsonToYamlTest, BlockStyleAndQuoting) {
  const Json value = Json::parse(R"({"b": {"x": [1, 2.5, {"k": "v", "j": true}], "e": {}, "n": null},
                                     "a": "true", "yes": "1e3", "z w": [], "list": [[1], "s"]})");
  const std::string yaml = JsonToYaml(value);
  EXPECT_EQ(yaml,
            "a: \"true\"\n"
            "b:\n"
            "  e: {}\n"
            "  \"n\": null\n"  // n is a boolean in YAML 1.1
            "  x:\n"
            "    - 1\n"
            "    - 2.5\n"
            "    - j: true\n"
            "      k: \"v\"\n"
            "list:\n"
            "  -\n"
            "    - 1\n"
            "  - \"s\"\n"
            "\"yes\": \"1e3\"\n"
            "\"z w\": []\n");
  // yaml-cpp reads back the same structure and the strings stay strings.
  YAML::Node node = YAML::Load(yaml);
  EXPECT_EQ(node["a"].Tag(), "!");
  EXPECT_EQ(node["a"].as<std::string>(), "true");
  EXPECT_EQ(node["b"]["x"][2]["k"].as<std::string>(), "v");
  EXPECT_EQ(node["b"]["x"][1].as<double>(), 2.5);
  EXPECT_EQ(node["yes"].as<std::string>(), "1e3");
  EXPECT_EQ(node["list"][0][0].as<int>(), 1);
  EXPECT_EQ(node["z w"].size(), 0u);
}

TEST(DesiredPodTest, CommandAndArgs) {
  const JobSpec spec = MustParse(MinimalJob());
  const PodSizing sizing = MustSize(spec);
  const Json pod = DesiredPod(spec, sizing, 1, 0);
  const Json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["name"], "worker");
  EXPECT_EQ(c["image"], "ghcr.io/patrickstar-k8s/pstar-worker:0.1.0");
  EXPECT_FALSE(c.contains("imagePullPolicy"));
  EXPECT_EQ(c["command"], Json::array({"pstar"}));
  const std::vector<std::string> expected = {
      "launch",        "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "$(NODE_RANK)",
      "--master-addr", "$(MASTER_ADDR)",   "--master-port", "$(MASTER_PORT)", "--rdzv-id", "$(PSTAR_RDZV_ID)",
      "--",            "train",            "--config", "/etc/pstar/job.yaml",
      "--set",         "runtime.device=cpu",
      "--set",         "runtime.host_memory=" + std::to_string(sizing.worker_host_budget_bytes),
      "--set",         "metrics.port=9400",
      "--set",         "metrics.bind_address=$(POD_IP)"};
  EXPECT_EQ(c["args"].get<std::vector<std::string>>(), expected);

  Json job = MinimalJob();
  job["spec"]["metricsPort"] = 0;
  const JobSpec quiet = MustParse(job);
  OperatorDefaults defaults;
  defaults.pstar_command = "/opt/pstar/bin/pstar";
  defaults.worker_image = "local/pstar:test";
  const Json pod2 = DesiredPod(quiet, MustSize(quiet), 0, 0, defaults);
  const Json& c2 = pod2["spec"]["containers"][0];
  EXPECT_EQ(c2["command"], Json::array({"/opt/pstar/bin/pstar"}));
  EXPECT_EQ(c2["image"], "local/pstar:test");
  EXPECT_EQ(c2["args"].size(), expected.size() - 4);
  EXPECT_EQ(c2["args"].back(), "runtime.host_memory=" + std::to_string(MustSize(quiet).worker_host_budget_bytes));
  EXPECT_EQ(c2["ports"].size(), 1u);  // rdzv only
}

// The default image follows the device: a CPU job gets the CPU image when
// one is configured; a job's own image always wins.
TEST(DesiredPodTest, TheDefaultImageFollowsTheDevice) {
  OperatorDefaults defaults;
  defaults.worker_image = "reg/pstar-worker:1";
  defaults.cpu_worker_image = "reg/pstar-worker-cpu:1";
  Json cpu_job = MinimalJob("cpu");
  cpu_job["spec"]["device"] = "cpu";
  Json cuda_job = MinimalJob("gpu");
  cuda_job["spec"]["device"] = "cuda";
  auto image = [&](const Json& job, const OperatorDefaults& d) {
    const JobSpec spec = MustParse(job);
    return DesiredPod(spec, MustSize(spec), 0, 0, d)["spec"]["containers"][0]["image"].get<std::string>();
  };
  EXPECT_EQ(image(cpu_job, defaults), "reg/pstar-worker-cpu:1");
  EXPECT_EQ(image(cuda_job, defaults), "reg/pstar-worker:1");
  OperatorDefaults one_image;
  one_image.worker_image = "reg/pstar-worker:1";
  EXPECT_EQ(image(cpu_job, one_image), "reg/pstar-worker:1") << "no CPU image: the one image";
  cpu_job["spec"]["image"] = "mine/pstar:dev";
  EXPECT_EQ(image(cpu_job, defaults), "mine/pstar:dev");
}

TEST(DesiredPodTest, Env) {
  const JobSpec spec = MustParse(FullJob());
  const Json pod = DesiredPod(spec, MustSize(spec), 2, 3);
  const std::vector<std::string> names = EnvNames(pod);
  const std::vector<std::string> expected = {
      "NODE_RANK",       "NNODES",          "NPROC_PER_NODE",  "WORLD_SIZE",  "MASTER_ADDR",       "MASTER_PORT",
      "PSTAR_RDZV_ID",   "PSTAR_JOB_NAME",  "PSTAR_NAMESPACE", "PET_NNODES",  "PET_NPROC_PER_NODE", "PET_NODE_RANK",
      "PET_MASTER_ADDR", "PET_MASTER_PORT", "PSTAR_STORE_TOKEN", "POD_IP", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE",
      "NCCL_DEBUG",      "NCCL_ALGO",       "NCCL_P2P_DISABLE", "HF_HOME",    "RUN_ID",            "OMP_NUM_THREADS"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(EnvVar(pod, "NODE_RANK")["value"], "2");
  EXPECT_EQ(EnvVar(pod, "NNODES")["value"], "3");
  EXPECT_EQ(EnvVar(pod, "NPROC_PER_NODE")["value"], "4");
  EXPECT_EQ(EnvVar(pod, "WORLD_SIZE")["value"], "12");
  EXPECT_EQ(EnvVar(pod, "MASTER_ADDR")["value"], "full-node-0.full.research.svc.cluster.local");
  EXPECT_EQ(EnvVar(pod, "MASTER_PORT")["value"], "23456");
  EXPECT_EQ(EnvVar(pod, "PSTAR_RDZV_ID")["value"], "11111111-2222-3333-4444-555555555555-3");
  EXPECT_EQ(EnvVar(pod, "PSTAR_JOB_NAME")["value"], "full");
  EXPECT_EQ(EnvVar(pod, "PSTAR_NAMESPACE")["value"], "research");
  EXPECT_EQ(EnvVar(pod, "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  EXPECT_EQ(EnvVar(pod, "PSTAR_STORE_TOKEN")["valueFrom"]["secretKeyRef"],
            Json::parse(R"({"name": "full-store-token", "key": "token", "optional": true})"));
  // torchrun's names as Kubeflow sets them.
  EXPECT_EQ(EnvVar(pod, "PET_NNODES")["value"], "3");
  EXPECT_EQ(EnvVar(pod, "PET_NPROC_PER_NODE")["value"], "4");
  EXPECT_EQ(EnvVar(pod, "PET_NODE_RANK")["value"], "2");
  EXPECT_EQ(EnvVar(pod, "PET_MASTER_ADDR")["value"], "full-node-0.full.research.svc.cluster.local");
  EXPECT_EQ(EnvVar(pod, "PET_MASTER_PORT")["value"], "23456");
  EXPECT_EQ(EnvVar(pod, "NCCL_IB_DISABLE")["value"], "1");
  EXPECT_EQ(EnvVar(pod, "NCCL_SOCKET_IFNAME")["value"], "eth0");
  EXPECT_EQ(EnvVar(pod, "RUN_ID")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
  // A cpu job without spec.nccl gets no NCCL variables.
  const JobSpec cpu = MustParse(MinimalJob());
  EXPECT_EQ(EnvNames(DesiredPod(cpu, MustSize(cpu), 0, 0)).size(), 16u);
}

TEST(DesiredStoreTokenSecretTest, HoldsTheTokenInBase64) {
  const JobSpec spec = MustParse(MinimalJob());
  const Json secret = DesiredStoreTokenSecret(spec, "0123456789abcdef");
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["metadata"]["name"], "demo-store-token");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], spec.uid);
  EXPECT_EQ(secret["type"], "Opaque");
  EXPECT_EQ(secret["data"], Json::parse(R"({"token": "MDEyMzQ1Njc4OWFiY2RlZg=="})"));
  for (const auto& [raw, encoded] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {std::string("\xff\x00\x10", 3), "/wAQ"}}) {
    EXPECT_EQ(EncodeBase64(raw), encoded);
    EXPECT_EQ(*DecodeBase64(encoded), raw);
  }
}

TEST(DesiredNetworkPolicyTest, TheJobsPodsMeetAndOnlyMetricsAreOpenOutside) {
  const JobSpec spec = MustParse(FullJob());  // 4 ranks per pod, metrics on 23500..
  NetworkPolicyOptions o;
  o.enabled = true;
  o.monitoring_namespace = "obs";
  o.operator_namespace = "pstar-system";
  o.operator_pod_labels = {{"app.kubernetes.io/component", "operator"}};
  const Json policy = DesiredNetworkPolicy(spec, o);
  EXPECT_EQ(policy["apiVersion"], "networking.k8s.io/v1");
  EXPECT_EQ(policy["metadata"]["name"], "full");
  const Json job_pods = {{"matchLabels", {{kJobNameLabel, "full"}}}};
  EXPECT_EQ(policy["spec"]["podSelector"], job_pods);
  EXPECT_EQ(policy["spec"]["policyTypes"], Json::array({"Ingress"}));
  const Json& ingress = policy["spec"]["ingress"];
  ASSERT_EQ(ingress.size(), 2u);
  EXPECT_EQ(ingress[0], Json({{"from", Json::array({{{"podSelector", job_pods}}})}})) << "any port among the job";
  EXPECT_EQ(ingress[1]["ports"],
            Json::parse(R"([{"protocol": "TCP", "port": )" + std::to_string(spec.metrics_port) + R"(, "endPort": )" +
                        std::to_string(spec.metrics_port + 3) + "}]"));
  EXPECT_EQ(ingress[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "obs");
  EXPECT_EQ(ingress[1]["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "pstar-system");
  EXPECT_EQ(ingress[1]["from"][1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "operator");
  // Without a metrics endpoint nothing outside the job gets in.
  JobSpec quiet = spec;
  quiet.metrics_port = 0;
  EXPECT_EQ(DesiredNetworkPolicy(quiet, o)["spec"]["ingress"].size(), 1u);
}

TEST(DesiredPodTest, VolumesAndMounts) {
  const JobSpec spec = MustParse(FullJob());
  const PodSizing sizing = MustSize(spec);
  const Json pod = DesiredPod(spec, sizing, 0, 0);
  const Json& volumes = pod["spec"]["volumes"];
  ASSERT_EQ(volumes.size(), 5u);
  EXPECT_EQ(volumes[0], Json::parse(R"({"name": "pstar-config", "configMap": {"name": "full-config"}})"));
  EXPECT_EQ(volumes[1], Json::parse(R"({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})"));
  EXPECT_EQ(volumes[2]["persistentVolumeClaim"]["claimName"], "ckpt-pvc");
  EXPECT_EQ(volumes[3]["name"], "cache");
  const Json& mounts = pod["spec"]["containers"][0]["volumeMounts"];
  ASSERT_EQ(mounts.size(), 5u);
  EXPECT_EQ(mounts[0], Json::parse(R"({"name": "pstar-config", "mountPath": "/etc/pstar", "readOnly": true})"));
  EXPECT_EQ(mounts[1], Json::parse(R"({"name": "dshm", "mountPath": "/dev/shm"})"));
  EXPECT_EQ(mounts[2]["mountPath"], "/ckpt");
  // The disk tier's volume, mounted where the worker is told to put it.
  EXPECT_EQ(mounts[4], Json::parse(R"({"name": "nvme", "mountPath": "/nvme"})"));
  const Json& args = pod["spec"]["containers"][0]["args"];
  EXPECT_NE(std::find(args.begin(), args.end(), "runtime.nvme_path=/nvme"), args.end());
  EXPECT_NE(std::find(args.begin(), args.end(), "runtime.nvme_spill=all"), args.end());
  EXPECT_NE(std::find(args.begin(), args.end(), "runtime.nvme_memory=" + std::to_string((int64_t(2) << 40) / 4)),
            args.end());
  // The default shm size of a cpu job.
  const JobSpec cpu = MustParse(MinimalJob());
  EXPECT_EQ(DesiredPod(cpu, MustSize(cpu), 0, 0)["spec"]["volumes"][1]["emptyDir"]["sizeLimit"], "64Mi");
}

TEST(DesiredPodTest, Resources) {
  const JobSpec spec = MustParse(FullJob());
  const PodSizing sizing = MustSize(spec);
  const Json r = DesiredPod(spec, sizing, 0, 0)["spec"]["containers"][0]["resources"];
  EXPECT_EQ(r, Json::parse(R"({"requests": {"cpu": "8", "memory": "40Gi"},
                               "limits": {"cpu": "16", "memory": "48Gi", "nvidia.com/gpu": "4"}})"));
  const JobSpec cpu = MustParse(MinimalJob());
  const PodSizing cpu_sizing = MustSize(cpu);
  const Json r2 = DesiredPod(cpu, cpu_sizing, 0, 0)["spec"]["containers"][0]["resources"];
  EXPECT_EQ(r2["requests"]["memory"], FormatBytesQuantity(cpu_sizing.request_bytes));
  EXPECT_FALSE(r2["limits"].contains("nvidia.com/gpu"));
  EXPECT_EQ(r2["requests"].size(), 1u);
}

TEST(DesiredPodTest, MetadataAndPodSpec) {
  const JobSpec spec = MustParse(FullJob());
  const Json pod = DesiredPod(spec, MustSize(spec), 1, 2);
  EXPECT_EQ(pod["apiVersion"], "v1");
  EXPECT_EQ(pod["kind"], "Pod");
  const Json& meta = pod["metadata"];
  EXPECT_EQ(meta["name"], "full-node-1");
  EXPECT_EQ(meta["namespace"], "research");
  EXPECT_EQ(meta["labels"], Json::parse(R"({"app.kubernetes.io/managed-by": "pstar-operator",
      "app.kubernetes.io/name": "pstar-worker", "patrickstar.io/attempt": "2", "patrickstar.io/job-name": "full",
      "patrickstar.io/node-index": "1", "patrickstar.io/queue": "research-gpu", "team": "nlp"})"));
  EXPECT_EQ(meta["annotations"], Json({{"example.com/owner", "alice"}}));
  EXPECT_EQ(meta["ownerReferences"], Json::array({OwnerReference(spec)}));
  const Json& ps = pod["spec"];
  EXPECT_EQ(ps["restartPolicy"], "Never");
  EXPECT_EQ(ps["hostname"], "full-node-1");
  EXPECT_EQ(ps["subdomain"], "full");
  EXPECT_EQ(ps["terminationGracePeriodSeconds"], 600);
  EXPECT_EQ(ps["nodeSelector"], Json({{"gpu", "a100"}}));
  EXPECT_EQ(ps["tolerations"][0]["key"], "nvidia.com/gpu");
  EXPECT_TRUE(ps["affinity"].contains("nodeAffinity"));
  EXPECT_EQ(ps["imagePullSecrets"], Json::parse(R"([{"name": "regcred"}])"));
  EXPECT_EQ(ps["serviceAccountName"], "trainer");
  EXPECT_EQ(ps["priorityClassName"], "high");
  EXPECT_EQ(ps["schedulerName"], "volcano");
  EXPECT_EQ(ps["securityContext"], Json::parse(R"({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
      "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"})"));
  const Json& c = ps["containers"][0];
  EXPECT_EQ(c["image"], "registry.example.com/pstar-worker:dev");
  EXPECT_EQ(c["imagePullPolicy"], "IfNotPresent");
  EXPECT_EQ(c["securityContext"]["runAsUser"], 1000);
  ASSERT_EQ(c["ports"].size(), 5u);
  EXPECT_EQ(c["ports"][0], Json::parse(R"({"name": "rdzv", "containerPort": 23456, "protocol": "TCP"})"));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c["ports"][size_t(i) + 1]["name"], "metrics-" + std::to_string(i));
    EXPECT_EQ(c["ports"][size_t(i) + 1]["containerPort"], 9500 + i);
  }
  // A minimal job sets none of the optional pod fields.
  const JobSpec cpu = MustParse(MinimalJob());
  const Json plain = DesiredPod(cpu, MustSize(cpu), 0, 0);
  for (const char* key : {"nodeSelector", "tolerations", "affinity", "imagePullSecrets", "serviceAccountName",
                          "priorityClassName", "schedulerName", "securityContext"}) {
    EXPECT_FALSE(plain["spec"].contains(key)) << key;
  }
  EXPECT_FALSE(plain["metadata"].contains("annotations"));
  EXPECT_FALSE(plain["metadata"]["labels"].contains("patrickstar.io/queue"));
  EXPECT_EQ(plain["spec"]["terminationGracePeriodSeconds"], 30);  // the default
}

// A large model's checkpoint takes longer than 30 s: the grace period a rank
// gets after SIGTERM comes from the template; out-of-range values are refused.
TEST(DesiredPodTest, TerminationGracePeriodFromTheTemplate) {
  Json job = MinimalJob();
  job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 900;
  const JobSpec spec = MustParse(job);
  EXPECT_EQ(DesiredPod(spec, MustSize(spec), 0, 0)["spec"]["terminationGracePeriodSeconds"], 900);
  for (Json bad : {Json(-1), Json(10000000), Json("600")}) {
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = bad;
    auto parsed = ParseJob(job);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("spec.template.spec.terminationGracePeriodSeconds"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(DesiredPodTest, Deterministic) {
  const JobSpec a = MustParse(FullJob());
  const JobSpec b = MustParse(FullJob());
  EXPECT_EQ(DesiredPod(a, MustSize(a), 2, 1).dump(), DesiredPod(b, MustSize(b), 2, 1).dump());
  EXPECT_EQ(DesiredService(a).dump(), DesiredService(b).dump());
  EXPECT_EQ(DesiredConfigMap(a).dump(), DesiredConfigMap(b).dump());
  EXPECT_NE(DesiredPod(a, MustSize(a), 2, 1).dump(), DesiredPod(a, MustSize(a), 2, 2).dump());
}

}  // namespace
}  // namespace pstar::op

namespace pstar::op {
namespace {

// The PodGroup asks for what minMember pods request together.
TEST(GangSchedulingTest, PodGroupsCarryMinMemberAndTheGangsRequests) {
  Json job = test::FullJob();
  job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "research";
  job["spec"]["runPolicy"]["schedulingPolicy"].erase("minAvailable");  // default: every pod
  const JobSpec spec = MustParse(job);
  const PodSizing sizing = MustSize(spec);
  const int n = spec.num_nodes;
  ASSERT_GT(n, 1);
  const Json volcano = DesiredPodGroup(spec, sizing, {GangScheduler::kVolcano, ""});
  EXPECT_EQ(volcano["apiVersion"], "scheduling.volcano.sh/v1beta1");
  EXPECT_EQ(volcano["kind"], "PodGroup");
  EXPECT_EQ(volcano["metadata"]["name"], spec.name);
  EXPECT_EQ(volcano["metadata"]["ownerReferences"][0]["uid"], spec.uid);
  EXPECT_EQ(volcano["spec"]["minMember"], n);
  EXPECT_EQ(volcano["spec"]["queue"], "research");
  EXPECT_EQ(volcano["spec"]["minResources"]["memory"], FormatBytesQuantity(sizing.request_bytes * n));
  EXPECT_EQ(volcano["spec"]["minResources"]["cpu"], std::to_string(8000 * n) + "m");
  EXPECT_EQ(volcano["spec"]["minResources"]["nvidia.com/gpu"], std::to_string(4 * n));

  job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] = 1;
  const JobSpec one = MustParse(job);
  const Json plugins = DesiredPodGroup(one, sizing, {GangScheduler::kSchedulerPlugins, ""});
  EXPECT_EQ(plugins["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ(plugins["spec"]["minMember"], 1);
  EXPECT_FALSE(plugins["spec"].contains("queue")) << "a Volcano field";
  EXPECT_EQ(plugins["spec"]["minResources"]["nvidia.com/gpu"], "4");
}

TEST(GangSchedulingTest, PodsNameTheirGroupAndScheduler) {
  Json job = test::MinimalJob();
  job["spec"]["numNodes"] = 3;
  const JobSpec spec = MustParse(job);
  const PodSizing sizing = MustSize(spec);
  const Json plain = DesiredPod(spec, sizing, 1, 2);

  Json volcano = plain;
  ApplyGangScheduling(spec, {GangScheduler::kVolcano, ""}, 2, &volcano);
  EXPECT_EQ(volcano["spec"]["schedulerName"], "volcano");
  EXPECT_EQ(volcano["metadata"]["annotations"][kVolcanoGroupAnnotation], PodGroupName(spec));

  Json plugins = plain;
  ApplyGangScheduling(spec, {GangScheduler::kSchedulerPlugins, "my-coscheduler"}, 2, &plugins);
  EXPECT_EQ(plugins["spec"]["schedulerName"], "my-coscheduler");
  EXPECT_EQ(plugins["metadata"]["labels"][kCoschedulingGroupLabel], PodGroupName(spec));

  Json kueue = plain;
  ApplyGangScheduling(spec, {GangScheduler::kKueue, ""}, 2, &kueue);
  EXPECT_FALSE(kueue["spec"].contains("schedulerName"));
  EXPECT_EQ(kueue["metadata"]["labels"][kKueueQueueLabel], "default");
  EXPECT_EQ(kueue["metadata"]["labels"][kKueuePodGroupLabel], spec.name + "-2");
  EXPECT_EQ(kueue["metadata"]["annotations"][kKueueTotalCountAnnotation], "3");
  EXPECT_EQ(kueue["spec"]["schedulingGates"], Json::parse(R"([{"name": "kueue.x-k8s.io/admission"}])"));

  Json none = plain;
  ApplyGangScheduling(spec, {GangScheduler::kNone, "ignored"}, 2, &none);
  EXPECT_EQ(none, plain);

  // The job's own scheduler wins.
  job["spec"]["template"]["spec"]["schedulerName"] = "team-scheduler";
  const JobSpec own = MustParse(job);
  Json mine = DesiredPod(own, sizing, 0, 0);
  ApplyGangScheduling(own, {GangScheduler::kVolcano, ""}, 0, &mine);
  EXPECT_EQ(mine["spec"]["schedulerName"], "team-scheduler");
}

TEST(GangSchedulingTest, SchedulerNamesParse) {
  for (GangScheduler s : {GangScheduler::kNone, GangScheduler::kVolcano, GangScheduler::kSchedulerPlugins,
                          GangScheduler::kKueue}) {
    EXPECT_EQ(*ParseGangScheduler(GangSchedulerName(s)), s);
  }
  EXPECT_FALSE(ParseGangScheduler("slurm").ok());
  EXPECT_EQ(GangApiGroupVersion(GangScheduler::kKueue), "kueue.x-k8s.io/v1beta1");
}

}  // namespace
}  // namespace pstar::op

namespace pstar::op {
namespace {

// The older spec.template.container and the PodTemplateSpec form with the same
// fields give identical pods.
TEST(PodTemplateTest, TheOlderContainerFormGivesTheSamePods) {
  const Json old_form = test::FullJob();
  Json new_form = old_form;
  Json worker = new_form["spec"]["template"]["container"];
  worker["name"] = "worker";
  new_form["spec"]["template"].erase("container");
  new_form["spec"]["template"]["spec"]["containers"] = Json::array({worker});
  const JobSpec a = MustParse(old_form), b = MustParse(new_form);
  const PodSizing sa = MustSize(a), sb = MustSize(b);
  EXPECT_EQ(sa.request_bytes, sb.request_bytes);
  for (int i = 0; i < a.num_nodes; ++i) EXPECT_EQ(DesiredPod(a, sa, i, 1), DesiredPod(b, sb, i, 1)) << i;
}

// Every PodSpec field the operator does not own, the worker container's other
// fields, extra ports and sidecars reach the pods as given.
TEST(PodTemplateTest, EveryOtherFieldPassesThrough) {
  Json job = test::MinimalJob();
  Json pod_spec = Json::object();
  const Json sample_json = Json::parse(R"({
      "activeDeadlineSeconds": 3600,
      "automountServiceAccountToken": false,
      "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
      "dnsPolicy": "ClusterFirstWithHostNet",
      "enableServiceLinks": false,
      "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["store"]}],
      "hostIPC": false,
      "hostNetwork": true,
      "hostPID": false,
      "hostUsers": true,
      "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
      "nodeName": "node-7",
      "os": {"name": "linux"},
      "overhead": {"cpu": "250m"},
      "preemptionPolicy": "Never",
      "priority": 1000,
      "readinessGates": [{"conditionType": "example.com/ready"}],
      "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-claim"}],
      "resources": {"limits": {"cpu": "4"}},
      "runtimeClassName": "nvidia",
      "schedulingGates": [{"name": "example.com/wait"}],
      "setHostnameAsFQDN": false,
      "shareProcessNamespace": true,
      "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
  })");
  std::map<std::string, Json> samples;
  for (auto it = sample_json.begin(); it != sample_json.end(); ++it) samples[it.key()] = it.value();
  ASSERT_EQ(samples.size(), PodSpecPassThroughFields().size());
  for (const std::string& f : PodSpecPassThroughFields()) {
    ASSERT_TRUE(samples.count(f)) << "no sample for " << f;
    pod_spec[f] = samples.at(f);
  }
  const Json sidecar = Json::parse(R"({"name": "log-shipper", "image": "fluent-bit:3", "args": ["-c", "/etc/fb.conf"]})");
  pod_spec["containers"] = Json::array({Json::parse(R"({
      "name": "worker",
      "image": "registry.example.com/pstar-worker:custom",
      "envFrom": [{"secretRef": {"name": "hf-token"}}],
      "livenessProbe": {"tcpSocket": {"port": "rdzv"}},
      "workingDir": "/work",
      "ports": [{"name": "debug", "containerPort": 5678}]
  })"), sidecar});
  job["spec"]["template"] = Json::object();
  job["spec"]["template"]["spec"] = pod_spec;
  const JobSpec spec = MustParse(job);
  const Json pod = DesiredPod(spec, MustSize(spec), 0, 0);
  for (const std::string& f : PodSpecPassThroughFields()) EXPECT_EQ(pod["spec"][f], samples.at(f)) << f;
  ASSERT_EQ(pod["spec"]["containers"].size(), 2u);
  const Json& w = pod["spec"]["containers"][0];
  EXPECT_EQ(w["name"], "worker");
  EXPECT_EQ(w["image"], "registry.example.com/pstar-worker:custom") << "the template's image, as spec.image names none";
  EXPECT_EQ(w["command"], Json::array({"pstar"}));
  EXPECT_EQ(w["envFrom"][0]["secretRef"]["name"], "hf-token");
  EXPECT_EQ(w["livenessProbe"]["tcpSocket"]["port"], "rdzv");
  EXPECT_EQ(w["workingDir"], "/work");
  EXPECT_EQ(w["ports"][0]["name"], "rdzv");
  EXPECT_EQ(w["ports"].back()["name"], "debug");
  EXPECT_EQ(pod["spec"]["containers"][1], sidecar);
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["hostname"], PodName(spec, 0));
  // Kueue's gate goes after the job's own.
  Json gated = pod;
  ApplyGangScheduling(spec, {GangScheduler::kKueue, ""}, 0, &gated);
  EXPECT_EQ(gated["spec"]["schedulingGates"],
            Json::parse(R"([{"name": "example.com/wait"}, {"name": "kueue.x-k8s.io/admission"}])"));
}

// The worker container meets Pod Security "restricted" unless the job says
// otherwise, key by key.
TEST(PodTemplateTest, TheWorkerIsRestrictedByDefault) {
  const JobSpec plain = MustParse(test::MinimalJob());
  const Json restricted = Json::parse(R"({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                                          "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})");
  EXPECT_EQ(DesiredPod(plain, MustSize(plain), 0, 0)["spec"]["containers"][0]["securityContext"], restricted);
  Json job = test::MinimalJob();
  job["spec"]["template"]["spec"]["containers"] =
      Json::parse(R"([{"name": "worker", "securityContext": {"runAsNonRoot": false, "runAsUser": 0}}])");
  const JobSpec root = MustParse(job);
  Json want = restricted;
  want["runAsNonRoot"] = false;
  want["runAsUser"] = 0;
  EXPECT_EQ(DesiredPod(root, MustSize(root), 0, 0)["spec"]["containers"][0]["securityContext"], want);
}

}  // namespace
}  // namespace pstar::op
