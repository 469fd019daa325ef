// End-to-end: the real pstar-operator process against the loopback fake API
// server, whose kubelet mode runs each pod's `pstar launch` as local
// processes, driven with the real kubectl where the machine has it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "operator/kube/kube_config.h"
#include "operator/kube/resource.h"
#include "tests/operator/fake_api_server.h"
#include "tests/test_util.h"

namespace pstar::test {
namespace {

using op::ApiResponse;
using op::Json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kKubectl = "/usr/bin/kubectl";
constexpr const char* kNs = "default";

std::string BinDir() { return std::filesystem::path(PstarBinary()).parent_path().string(); }

// Polls `done` every 100 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return done();
}

// A running pstar-operator; its metrics port is read from its first line.
class OperatorProcess {
 public:
  OperatorProcess(const FakeApiServer& server, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {PSTAR_OPERATOR_BINARY, "--kubeconfig", server.kubeconfig_path(),
                                     "--metrics-address", "127.0.0.1", "--metrics-port", "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    WaitFor([&] { return MetricsPort() > 0 || !process_->Running(); }, seconds(30));
  }
  int MetricsPort() const {
    std::smatch m;
    const std::string out = process_->Stdout();
    static const std::regex kLine(R"(on 127\.0\.0\.1:(\d+))");
    return std::regex_search(out, m, kLine) ? std::stoi(m[1]) : 0;
  }
  std::string Metrics() const { return HttpGet(MetricsPort(), "/metrics").body; }
  ChildProcess& process() { return *process_; }

 private:
  std::unique_ptr<ChildProcess> process_;
};

// The value of one series in exposition text (-1 when absent).
double Series(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

class OperatorE2e : public ::testing::Test {
 protected:
  void StartServer(bool kubelet, std::vector<std::string> nodes = {"node-1:16Gi:8"},
                   std::vector<std::string> extra_args = {}) {
    FakeApiServerOptions o;
    o.kubelet = kubelet;
    o.extra_args = std::move(extra_args);
    o.bin_dir = BinDir();
    o.nodes = std::move(nodes);
    auto s = FakeApiServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    std::ifstream crd(SourceDir() + "/crds/patrickstarjob.yaml");
    ASSERT_TRUE(crd.good());
    // The CRD through kubectl where it exists, else through the API.
    if (HaveKubectl()) {
      ProcessResult r = Kubectl({"apply", "-f", SourceDir() + "/crds/patrickstarjob.yaml"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    } else {
      ProcessResult r = RunProcess({"/usr/bin/python3", "-c",
                                    "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
                                    SourceDir() + "/crds/patrickstarjob.yaml"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      op::ResourceRef crds{"apiextensions.k8s.io", "v1", "customresourcedefinitions",
                           "CustomResourceDefinition", false};
      ApiResponse c = server_->client().Create(crds, "", Json::parse(r.out));
      ASSERT_TRUE(c.ok()) << c.error;
    }
  }

  static bool HaveKubectl() { return std::filesystem::exists(kKubectl); }

  ProcessResult Kubectl(std::vector<std::string> args) {
    std::vector<std::string> argv = {kKubectl, "--kubeconfig", server_->kubeconfig_path(), "--cache-dir",
                                     cache_.path()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv);
  }

  // A tiny CPU job: 2 layers, steps and checkpoints as asked.
  Json TinyJob(const std::string& name, int steps, int nodes = 2) {
    Json job = {
        {"apiVersion", "patrickstar.io/v1alpha1"},
        {"kind", "PatrickStarJob"},
        {"metadata", {{"name", name}, {"namespace", kNs}}},
        {"spec",
         {{"numNodes", nodes},
          {"nprocPerNode", 1},
          {"device", "cpu"},
          {"masterPort", FreePort()},
          {"metricsPort", 0},
          {"config",
           {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"vocab_size", 40}, {"max_seq_len", 12}}},
            {"data", {{"source", "generated"}, {"generated_tokens", 20000}}},
            {"train", {{"batch_size", 4}, {"seq_len", 8}, {"steps", steps}, {"log_every", 10}, {"threads", 1}}},
            {"checkpoint", {{"dir", ckpt_.path() + "/" + name}, {"every_steps", 5}}}}}}}};
    return job;
  }

  void Create(const Json& job) {
    ApiResponse r = server_->client().Create(op::PatrickStarJobs(), kNs, job);
    ASSERT_TRUE(r.ok()) << r.error;
  }

  Json Job(const std::string& name) {
    ApiResponse r = server_->client().Get(op::PatrickStarJobs(), kNs, name);
    return r.ok() ? r.body : Json::object();
  }
  std::string Phase(const std::string& name) {
    Json j = Job(name);
    return j.contains("status") ? j["status"].value("phase", "") : "";
  }
  Json Condition(const std::string& name, const std::string& type) {
    Json j = Job(name);
    if (!j.contains("status") || !j["status"].contains("conditions")) return Json::object();
    for (const Json& c : j["status"]["conditions"]) {
      if (c["type"] == type) return c;
    }
    return Json::object();
  }
  // Waits for a phase. Only for a phase the job stays in until the test acts
  // (a terminal one, or Running of a job far from its last step): a 100 ms
  // poll can miss a phase a job passes through.
  bool WaitForPhase(const std::string& name, const std::string& phase, seconds timeout) {
    return WaitFor([&] { return Phase(name) == phase; }, timeout);
  }
  // Waits until the job's pods were created: the Created condition stays
  // True once set, whatever phases follow (a tiny job can go from Created to
  // Succeeded between two polls).
  bool WaitForCreated(const std::string& name, seconds timeout) {
    return WaitFor([&] { return Condition(name, "Created").value("status", "") == "True"; }, timeout);
  }
  std::vector<Json> Pods(const std::string& selector = "") {
    op::ListOptions o;
    o.label_selector = selector;
    ApiResponse r = server_->client().List(op::Pods(), kNs, o);
    std::vector<Json> pods;
    if (r.ok()) {
      for (const Json& p : r.body["items"]) pods.push_back(p);
    }
    return pods;
  }
  // Every object of these resources on the server (the operator wrote them,
  // the server added its metadata) goes through the official Kubernetes
  // Python models unchanged: no field is misspelt or misplaced.
  void ExpectModelsRoundTrip(const std::vector<op::ResourceRef>& refs, const std::string& ns) {
    TempDir dir("e2e-models");
    std::vector<std::string> argv = {"/usr/bin/python3", SourceDir() + "/tests/fixtures/k8s_model_roundtrip.py"};
    size_t objects = 0;
    for (const op::ResourceRef& ref : refs) {
      ApiResponse r = server_->client().List(ref, ref.namespaced ? ns : "", {});
      ASSERT_TRUE(r.ok()) << r.error;
      Json items = Json::array();
      for (Json item : r.body["items"]) {
        item["apiVersion"] = ref.api_version();
        item["kind"] = ref.kind;
        // The status of pods and services is the kubelet's, not the operator's.
        item.erase("status");
        items.push_back(std::move(item));
      }
      ASSERT_FALSE(items.empty()) << "no " << ref.plural;
      objects += items.size();
      const std::string path = dir.path() + "/" + ref.plural + ".json";
      std::ofstream(path) << items.dump();
      argv.push_back(path);
    }
    ProcessResult r = RunProcess(argv);
    if (r.exit_code == 77) GTEST_SKIP() << r.err;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::to_string(objects) + " objects checked: all round-trip"), std::string::npos)
        << r.out << r.err;
  }

  std::string Describe(const std::string& name) { return Job(name).dump(1) + "\n" + server_->Output(); }

  TempDir cache_{"kubectl-cache"};
  TempDir ckpt_{"e2e-ckpt"};
  std::unique_ptr<FakeApiServer> server_;
};

TEST_F(OperatorE2e, KubectlApplyTrainsAGangToSucceeded) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl is not installed at " << kKubectl;
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_, {"--network-policy", "--operator-namespace", "pstar-system",
                                "--operator-pod-labels", "app.kubernetes.io/component=operator"});
  ASSERT_GT(op.MetricsPort(), 0) << op.process().Stdout();

  TempDir dir("e2e-job");
  const std::string manifest = dir.path() + "/job.yaml";
  std::ofstream(manifest) << TinyJob("tiny", 12).dump();  // JSON is YAML
  ProcessResult apply = Kubectl({"apply", "-f", manifest});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_NE(apply.out.find("patrickstarjob.patrickstar.io/tiny created"), std::string::npos) << apply.out;

  ASSERT_TRUE(WaitForPhase("tiny", "Succeeded", seconds(180))) << Describe("tiny");
  const Json status = Job("tiny")["status"];
  EXPECT_EQ(status["worldSize"], 2);
  EXPECT_EQ(status["restarts"], 0);
  EXPECT_EQ(status["observedGeneration"], 1);
  EXPECT_TRUE(status.contains("startTime"));
  EXPECT_TRUE(status.contains("completionTime"));
  EXPECT_EQ(Condition("tiny", "Created")["status"], "True");
  EXPECT_EQ(Condition("tiny", "Succeeded")["status"], "True");
  EXPECT_TRUE(status["memory"]["hostMemoryPerPod"].is_string());

  // The pods: owned by the job, sized as the status says, and they trained.
  std::vector<Json> pods = Pods("patrickstar.io/job-name=tiny");
  ASSERT_EQ(pods.size(), 2u);
  for (const Json& pod : pods) {
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], Job("tiny")["metadata"]["uid"]);
    EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["requests"]["memory"], status["memory"]["hostMemoryPerPod"]);
    EXPECT_EQ(pod["status"]["phase"], "Succeeded");
  }
  ProcessResult logs = Kubectl({"logs", "tiny-node-0"});
  EXPECT_NE(logs.out.find("summary: steps=12"), std::string::npos) << logs.out << logs.err;
  EXPECT_NE(logs.out.find("2 ranks"), std::string::npos) << logs.out;

  ProcessResult get = Kubectl({"get", "psj"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_NE(get.out.find("PHASE"), std::string::npos) << get.out;
  EXPECT_TRUE(std::regex_search(get.out, std::regex(R"(tiny\s+Succeeded)"))) << get.out;

  ProcessResult describe = Kubectl({"describe", "psj", "tiny"});
  EXPECT_NE(describe.out.find("PodsCreated"), std::string::npos) << describe.out;
  EXPECT_NE(describe.out.find("JobSucceeded"), std::string::npos) << describe.out;

  // The ranks met through a store that wanted the job's token (the fake
  // kubelet resolves the pods' secretKeyRef as a kubelet does).
  ProcessResult secret = Kubectl({"get", "secret", "tiny-store-token", "-o", "json"});
  ASSERT_EQ(secret.exit_code, 0) << secret.err;
  const Json secret_json = Json::parse(secret.out);
  EXPECT_EQ(secret_json["metadata"]["ownerReferences"][0]["uid"], Job("tiny")["metadata"]["uid"]);
  EXPECT_EQ(op::DecodeBase64(secret_json["data"]["token"].get<std::string>())->size(), 32u);
  ProcessResult policy = Kubectl({"get", "networkpolicy", "tiny", "-o", "json"});
  ASSERT_EQ(policy.exit_code, 0) << policy.err;
  EXPECT_EQ(Json::parse(policy.out)["spec"]["podSelector"]["matchLabels"]["patrickstar.io/job-name"], "tiny");
  ExpectModelsRoundTrip({op::Pods(), op::Services(), op::ConfigMaps(), op::Secrets(), op::NetworkPolicies(),
                         op::Events()},
                        kNs);

  const std::string metrics = op.Metrics();
  EXPECT_EQ(Series(metrics, "patrickstar_operator_jobs{phase=\"Succeeded\"}"), 1) << metrics;
  EXPECT_GT(Series(metrics, "patrickstar_operator_reconciles_total{result=\"success\"}"), 0) << metrics;
  // Per job: one phase series, the current one, and the restarts.
  EXPECT_EQ(Series(metrics, "patrickstar_operator_job_phase{name=\"tiny\",namespace=\"default\",phase=\"Succeeded\"}"), 1)
      << metrics;
  EXPECT_EQ(Series(metrics, "patrickstar_operator_job_phase{name=\"tiny\",namespace=\"default\",phase=\"Running\"}"), -1)
      << metrics;
  EXPECT_EQ(Series(metrics, "patrickstar_operator_job_restarts{name=\"tiny\",namespace=\"default\"}"), 0) << metrics;
  EXPECT_EQ(HttpGet(op.MetricsPort(), "/readyz").status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(HttpGet(op.MetricsPort(), "/healthz").status_line, "HTTP/1.1 200 OK");
}

// A job with a disk tier: the operator mounts the named emptyDir, tells each
// rank its path and share, requests the ephemeral storage, shows the bytes in
// status; the ranks home their optimizer moments there and train to the end.
TEST_F(OperatorE2e, ADiskTierJobHomesItsMomentsOnTheVolume) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl is not installed at " << kKubectl;
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_);
  Json job = TinyJob("disk", 6);
  job["spec"]["config"]["optimizer"] = {{"params", {{"use_hybrid_adam", false}}}};  // every update on the host
  job["spec"]["diskTier"] = {{"volume", "scratch"}, {"size", "64Mi"}};
  job["spec"]["template"]["spec"]["volumes"] = Json::parse(R"([{"name": "scratch", "emptyDir": {}}])");
  Create(job);
  ASSERT_TRUE(WaitForPhase("disk", "Succeeded", seconds(180))) << Describe("disk");

  const Json memory = Job("disk")["status"]["memory"];
  ASSERT_TRUE(memory["diskPerPod"].is_string()) << memory.dump();
  EXPECT_NE(memory["diskPerPod"], "0") << memory.dump();
  EXPECT_EQ(memory["diskPerPod"], memory["diskPerRank"]) << "one rank per pod";
  const std::vector<Json> pods = Pods("patrickstar.io/job-name=disk");
  ASSERT_EQ(pods.size(), 2u) << Describe("disk");
  for (const Json& pod : pods) {
    const Json& worker = pod["spec"]["containers"][0];
    EXPECT_EQ(worker["resources"]["requests"]["ephemeral-storage"], "64Mi") << pod.dump();
    bool mounted = false;
    for (const Json& m : worker["volumeMounts"]) {
      mounted |= m["name"] == "scratch" && m["mountPath"] == "/var/lib/pstar/disk-tier";
    }
    EXPECT_TRUE(mounted) << worker.dump();
  }
  // Rank 0's start line names the tier, all its chunks' moments on it (the
  // budget the operator passed is the plan the pod was sized by), and its
  // summary counts the traffic.
  ProcessResult logs = Kubectl({"logs", "disk-node-0"});
  ASSERT_NE(logs.out.find("summary: steps=6"), std::string::npos) << logs.out << logs.err;
  EXPECT_TRUE(std::regex_search(logs.out, std::regex(R"(disk tier: Adam moments of (\d+)/\1 chunks)"))) << logs.out;
  std::smatch read;
  ASSERT_TRUE(std::regex_search(logs.out, read, std::regex(R"(disk: read_bytes=(\d+))"))) << logs.out;
  EXPECT_GT(std::stoll(read[1]), 0) << logs.out;
  // kubectl get -o wide shows the disk column.
  ProcessResult wide = Kubectl({"get", "psj", "disk", "-o", "wide"});
  ASSERT_EQ(wide.exit_code, 0) << wide.err;
  EXPECT_NE(wide.out.find("DISK"), std::string::npos) << wide.out;
  EXPECT_NE(wide.out.find(memory["diskPerPod"].get<std::string>()), std::string::npos) << wide.out;
  ProcessResult narrow = Kubectl({"get", "psj", "disk"});
  EXPECT_EQ(narrow.out.find("DISK"), std::string::npos) << narrow.out;
}

// Gang scheduling with a PodGroup: the operator makes the group before the
// pods, the pods name it and go to its scheduler, which (the fake server plays
// it) places them only once minMember of them wait; the gang trains.
TEST_F(OperatorE2e, PodGroupSchedulersPlaceTheGangTogether) {
  struct Case {
    std::string scheduler, group_path, scheduler_name;
  };
  for (const Case& c : {Case{"volcano", "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups/", "volcano"},
                        Case{"scheduler-plugins", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups/",
                             "scheduler-plugins-scheduler"}}) {
    SCOPED_TRACE(c.scheduler);
    StartServer(/*kubelet=*/true, {"node-1:16Gi:8"}, {"--gang-scheduler", c.scheduler});
    OperatorProcess op(*server_, {"--gang-scheduler", c.scheduler});
    const std::string name = "gang-" + c.scheduler;
    Json job = TinyJob(name, 6);
    job["spec"]["runPolicy"]["schedulingPolicy"] = {{"queue", "research"}};
    Create(job);
    ASSERT_TRUE(WaitForPhase(name, "Succeeded", seconds(180))) << Describe(name);
    ApiResponse group = server_->Get(c.group_path + name);
    ASSERT_TRUE(group.ok()) << group.error;
    EXPECT_EQ(group.body["spec"]["minMember"], 2);
    EXPECT_TRUE(group.body["spec"]["minResources"]["memory"].is_string()) << group.body.dump();
    EXPECT_EQ(group.body["metadata"]["ownerReferences"][0]["uid"], Job(name)["metadata"]["uid"]);
    if (c.scheduler == "volcano") { EXPECT_EQ(group.body["spec"]["queue"], "research"); }
    const std::vector<Json> pods = Pods("patrickstar.io/job-name=" + name);
    ASSERT_EQ(pods.size(), 2u);
    for (const Json& pod : pods) EXPECT_EQ(pod["spec"]["schedulerName"], c.scheduler_name) << pod.dump();
  }
}

// Kueue's pod groups: the gang's pods are created gated, wait while their
// LocalQueue does not exist, and are admitted and ungated all together once
// it does (the fake server plays Kueue).
TEST_F(OperatorE2e, KueueAdmitsTheWholeGangAndLiftsTheGates) {
  StartServer(/*kubelet=*/true, {"node-1:16Gi:8"}, {"--gang-scheduler", "kueue"});
  OperatorProcess op(*server_, {"--gang-scheduler", "kueue"});
  Json job = TinyJob("queued", 6);
  job["spec"]["runPolicy"]["schedulingPolicy"] = {{"queue", "team-a"}};
  Create(job);
  auto gated = [&] {
    const std::vector<Json> pods = Pods("patrickstar.io/job-name=queued");
    if (pods.size() != 2) return false;
    for (const Json& pod : pods) {
      bool waiting = false;
      for (const Json& c : pod["status"].value("conditions", Json::array())) {
        waiting = waiting || (c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated");
      }
      if (!waiting) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(gated, seconds(60))) << Describe("queued");
  for (const Json& pod : Pods("patrickstar.io/job-name=queued")) {
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "queued-0");
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");
    EXPECT_EQ(pod["spec"]["schedulingGates"][0]["name"], "kueue.x-k8s.io/admission");
  }
  EXPECT_NE(Phase("queued"), "Running");

  const Json queue = {{"apiVersion", "kueue.x-k8s.io/v1beta1"},
                      {"kind", "LocalQueue"},
                      {"metadata", {{"name", "team-a"}, {"namespace", kNs}}},
                      {"spec", {{"clusterQueue", "cluster-queue"}}}};
  ApiResponse made = server_->Post("/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues", queue);
  ASSERT_TRUE(made.ok()) << made.error;
  ASSERT_TRUE(WaitForPhase("queued", "Succeeded", seconds(180))) << Describe("queued");
  ApiResponse workload = server_->Get("/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads/queued-0");
  ASSERT_TRUE(workload.ok()) << workload.error;
  EXPECT_EQ(workload.body["spec"]["podSets"][0]["count"], 2);
  for (const Json& pod : Pods("patrickstar.io/job-name=queued")) {
    EXPECT_FALSE(pod["spec"].contains("schedulingGates")) << pod.dump();
  }
}

// A gang scheduler whose API the cluster does not serve: no PodGroup, pods
// for the default scheduler, and a warning saying so; the job still trains.
TEST_F(OperatorE2e, AGangSchedulerTheClusterDoesNotServeFallsBackWithAWarning) {
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_, {"--gang-scheduler", "volcano"});
  Create(TinyJob("plain", 4));
  ASSERT_TRUE(WaitForPhase("plain", "Succeeded", seconds(180))) << Describe("plain");
  for (const Json& pod : Pods("patrickstar.io/job-name=plain")) {
    EXPECT_EQ(pod["spec"].value("schedulerName", ""), "default-scheduler") << pod.dump();  // the API's default
    EXPECT_FALSE(pod["metadata"].value("annotations", Json::object()).contains("scheduling.k8s.io/group-name"));
  }
  ApiResponse events = server_->client().List(op::Events(), kNs, {});
  ASSERT_TRUE(events.ok()) << events.error;
  bool warned = false;
  for (const Json& e : events.body["items"]) {
    if (e.value("reason", "") == "GangSchedulingUnavailable") {
      warned = true;
      EXPECT_NE(e.value("message", "").find("scheduling.volcano.sh/v1beta1"), std::string::npos) << e.dump();
    }
  }
  EXPECT_TRUE(warned) << events.body.dump();
}

// A namespace enforcing Pod Security "restricted" (the fake server admits
// pods as the API server does): a job's pods pass with the operator's
// defaults; a job that asks to run as root is refused, and says so.
TEST_F(OperatorE2e, PodsPassPodSecurityRestrictedUnlessTheJobAsksForRoot) {
  StartServer(/*kubelet=*/true);
  const std::string ns = "secure";
  ApiResponse made = server_->Post("/api/v1/namespaces",
                                   {{"apiVersion", "v1"},
                                    {"kind", "Namespace"},
                                    {"metadata", {{"name", ns}, {"labels", {{"pod-security.kubernetes.io/enforce", "restricted"}}}}}});
  ASSERT_TRUE(made.ok()) << made.error;
  OperatorProcess op(*server_);
  auto job_in_ns = [&](const std::string& name) {
    Json job = TinyJob(name, 4);
    job["metadata"]["namespace"] = ns;
    return job;
  };
  auto get = [&](const std::string& name) {
    ApiResponse r = server_->client().Get(op::PatrickStarJobs(), ns, name);
    Json job = r.ok() ? r.body : Json::object();
    if (!job.contains("status") || !job["status"].is_object()) job["status"] = Json::object();
    return job;
  };
  Json root = job_in_ns("as-root");
  root["spec"]["template"]["spec"]["containers"] =
      Json::parse(R"([{"name": "worker", "securityContext": {"runAsNonRoot": false, "runAsUser": 0}}])");
  ASSERT_TRUE(server_->client().Create(op::PatrickStarJobs(), ns, job_in_ns("confined")).ok());
  ASSERT_TRUE(server_->client().Create(op::PatrickStarJobs(), ns, root).ok());

  ASSERT_TRUE(WaitFor([&] { return get("confined")["status"].value("phase", "") == "Succeeded"; }, seconds(180)))
      << get("confined").dump(1) << server_->Output();
  Json refused;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const Json& c : get("as-root")["status"].value("conditions", Json::array())) {
          if (c["type"] == "Created" && c.value("reason", "") == "CreateFailed") refused = c;
        }
        return !refused.is_null();
      },
      seconds(60)))
      << get("as-root").dump(1);
  EXPECT_NE(refused.value("message", "").find("violates PodSecurity \"restricted:latest\""), std::string::npos)
      << refused.dump();
  EXPECT_NE(refused.value("message", "").find("runAsNonRoot != true"), std::string::npos) << refused.dump();
}

// status.progress follows rank 0's metrics, and kubectl get shows it.
TEST_F(OperatorE2e, StatusShowsTrainingProgressReadFromRankZero) {
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_, {"--progress-interval", "1"});
  Json job = TinyJob("progress", 10000000, /*nodes=*/1);
  job["spec"]["metricsPort"] = FreePort();
  Create(job);
  Json progress;
  ASSERT_TRUE(WaitFor(
      [&] {
        const Json status = Job("progress").value("status", Json::object());
        progress = status.value("progress", Json::object());
        return progress.value("step", int64_t(0)) >= 20 && progress.contains("estimatedCompletionTime");
      },
      seconds(120)))
      << Describe("progress");
  EXPECT_EQ(progress["targetSteps"], 10000000);
  EXPECT_TRUE(progress["loss"].is_number()) << progress;
  EXPECT_GT(progress["tokensPerSecond"].get<double>(), 0) << progress;
  EXPECT_GE(progress["lastCheckpointStep"].get<int64_t>(), 5) << progress;  // every 5 steps
  if (HaveKubectl()) {
    ProcessResult get = Kubectl({"get", "psj", "progress"});
    ASSERT_EQ(get.exit_code, 0) << get.err;
    EXPECT_NE(get.out.find("STEP"), std::string::npos) << get.out;
    EXPECT_NE(get.out.find("ETA"), std::string::npos) << get.out;
  }
}

TEST_F(OperatorE2e, AKilledRankRestartsTheGangWhichResumesFromItsCheckpoint) {
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_);
  // Enough steps (about 5 ms each) that the first attempt is still training
  // long after its first checkpoint, whatever the machine's load.
  Json resumer = TinyJob("resumer", 1000);
  resumer["spec"]["config"]["checkpoint"]["every_steps"] = 50;
  Create(resumer);
  // Wait for a checkpoint, any (older ones are pruned), then kill rank 1 (the
  // child of its pod's launcher).
  const std::string ckpt = ckpt_.path() + "/resumer";
  auto any_checkpoint = [&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ckpt, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step-", 0) == 0 && name.find(".tmp") == std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(any_checkpoint, seconds(120))) << Describe("resumer");
  ApiResponse kill = server_->Post("/fake/kubelet/signal",
                                   {{"namespace", kNs}, {"name", "resumer-node-1"}, {"signal", 9}, {"target", "child"}});
  ASSERT_TRUE(kill.ok()) << kill.error;

  ASSERT_TRUE(WaitForPhase("resumer", "Succeeded", seconds(240))) << Describe("resumer");
  const Json status = Job("resumer")["status"];
  EXPECT_EQ(status["restarts"], 1);
  EXPECT_TRUE(status.contains("lastRestartTime"));
  const Json restarting = Condition("resumer", "Restarting");
  EXPECT_EQ(restarting["status"], "False");  // it was true until the new gang ran
  // The new gang is attempt 1 and resumed from a checkpoint.
  std::vector<Json> pods = Pods("patrickstar.io/job-name=resumer");
  ASSERT_EQ(pods.size(), 2u);
  for (const Json& pod : pods) EXPECT_EQ(pod["metadata"]["labels"]["patrickstar.io/attempt"], "1");
  ApiResponse log = server_->Get("/api/v1/namespaces/default/pods/resumer-node-0/log");
  ASSERT_EQ(log.code, 200) << log.error;
  ASSERT_TRUE(log.body.is_string()) << log.body;
  const std::string text = log.body.get<std::string>();
  EXPECT_NE(text.find("resumed: from the checkpoint of step"), std::string::npos) << text;
  // Every pod exit is an event on the job: the killed gang's failure, and
  // the new gang's clean exits.
  // (Events are written as the operator sees the exits, which may be just
  // after the status: wait for them.)
  ApiResponse events;
  int failed_exits = 0, clean_exits = 0;
  auto count_exits = [&] {
    events = server_->Get("/api/v1/namespaces/default/events");
    failed_exits = clean_exits = 0;
    if (!events.ok()) return false;
    for (const Json& e : events.body["items"]) {
      if (e.value("reason", "") != "ExitedWithCode" || e["involvedObject"].value("name", "") != "resumer") continue;
      const std::string message = e.value("message", "");
      if (e.value("type", "") == "Warning" && message.find("pod resumer-node-1 exited with code") == 0) ++failed_exits;
      if (e.value("type", "") == "Normal" && message.find("exited with code 0") != std::string::npos) ++clean_exits;
    }
    return failed_exits >= 1 && clean_exits >= 2;
  };
  EXPECT_TRUE(WaitFor(count_exits, seconds(30))) << events.body.dump();
  EXPECT_EQ(failed_exits, 1) << events.body.dump();
  EXPECT_EQ(clean_exits, 2) << events.body.dump();
  EXPECT_NE(op.Metrics().find("patrickstar_operator_gang_restarts_total 1"), std::string::npos) << op.Metrics();
  EXPECT_TRUE(WaitFor(
      [&] { return Series(op.Metrics(), "patrickstar_operator_job_restarts{name=\"resumer\",namespace=\"default\"}") == 1; },
      seconds(10)))
      << op.Metrics();

  // With backoffLimit 0 the first failure ends the job. It would train for
  // hours, so it is Running until the kill.
  Json strict = TinyJob("strict", 10000000);
  strict["spec"]["runPolicy"] = {{"backoffLimit", 0}};
  Create(strict);
  ASSERT_TRUE(WaitForPhase("strict", "Running", seconds(120))) << Describe("strict");
  kill = server_->Post("/fake/kubelet/signal",
                       {{"namespace", kNs}, {"name", "strict-node-0"}, {"signal", 9}, {"target", "main"}});
  ASSERT_TRUE(kill.ok()) << kill.error;
  ASSERT_TRUE(WaitForPhase("strict", "Failed", seconds(60))) << Describe("strict");
  const Json failed = Condition("strict", "Failed");
  EXPECT_EQ(failed["reason"], "BackoffLimitExceeded");
  EXPECT_NE(failed["message"].get<std::string>().find("exited with code 137"), std::string::npos) << failed;
  // cleanPodPolicy Running: the surviving rank's pod is deleted.
  EXPECT_TRUE(WaitFor([&] { return Pods("patrickstar.io/job-name=strict").size() <= 1; }, seconds(60)));
}

TEST_F(OperatorE2e, AnOperatorKilledMidReconcileLeavesNoDuplicateOrOrphanedPods) {
  StartServer(/*kubelet=*/false);
  constexpr int kJobs = 40, kNodes = 3;
  for (int i = 0; i < kJobs; ++i) Create(TinyJob("crash-" + std::to_string(i), 10, kNodes));
  {
    OperatorProcess first(*server_);
    // Kill it while it is creating pods.
    ASSERT_TRUE(WaitFor([&] { return !Pods().empty(); }, seconds(60)));
    first.process().Signal(SIGKILL);
    first.process().Wait();
  }
  const size_t created_before = Pods().size();
  EXPECT_LT(created_before, size_t(kJobs * kNodes)) << "the operator finished before it was killed";
  // A job deleted while no operator runs leaves nothing behind either.
  ApiResponse del = server_->client().Delete(op::PatrickStarJobs(), kNs, "crash-0", {});
  ASSERT_TRUE(del.ok()) << del.error;

  OperatorProcess second(*server_);
  ASSERT_TRUE(WaitFor([&] { return Pods().size() == size_t((kJobs - 1) * kNodes); }, seconds(120)))
      << Pods().size() << " pods";
  for (int i = 1; i < kJobs; ++i) {
    const std::string name = "crash-" + std::to_string(i);
    ASSERT_TRUE(WaitForCreated(name, seconds(60))) << Describe(name);
  }
  std::this_thread::sleep_for(seconds(1));  // anything extra would show now
  std::map<std::string, std::set<std::string>> pods_by_job;
  std::set<std::string> job_uids;
  ApiResponse jobs = server_->client().List(op::PatrickStarJobs(), kNs, {});
  for (const Json& j : jobs.body["items"]) job_uids.insert(j["metadata"]["uid"].get<std::string>());
  for (const Json& pod : Pods()) {
    const std::string job = pod["metadata"]["labels"]["patrickstar.io/job-name"];
    pods_by_job[job].insert(pod["metadata"]["name"].get<std::string>());
    EXPECT_TRUE(job_uids.count(pod["metadata"]["ownerReferences"][0]["uid"].get<std::string>()))
        << "orphaned pod " << pod["metadata"]["name"];
    EXPECT_EQ(pod["metadata"]["labels"]["patrickstar.io/attempt"], "0");
  }
  EXPECT_EQ(pods_by_job.size(), size_t(kJobs - 1));
  EXPECT_FALSE(pods_by_job.count("crash-0"));
  for (const auto& [job, names] : pods_by_job) {
    EXPECT_EQ(names, (std::set<std::string>{job + "-node-0", job + "-node-1", job + "-node-2"}));
  }
}

TEST_F(OperatorE2e, ConvergesThroughConflictsServerErrorsDroppedWatchesAndExpiredVersions) {
  StartServer(/*kubelet=*/false);
  OperatorProcess op(*server_);
  ASSERT_TRUE(server_->InjectFault("POST", "/pods$", 500, 6).ok());
  ASSERT_TRUE(server_->InjectFault("PUT", "/status$", 409, 4).ok());
  ASSERT_TRUE(server_->InjectFault("POST", "/services$", 500, 2).ok());
  for (int i = 0; i < 10; ++i) Create(TinyJob("fault-" + std::to_string(i), 10));
  ASSERT_TRUE(WaitFor([&] { return Pods().size() >= 4; }, seconds(60)));
  ASSERT_TRUE(server_->DropWatches().ok());
  for (int i = 10; i < 15; ++i) Create(TinyJob("fault-" + std::to_string(i), 10));
  // Expire every resourceVersion the watches hold, then cut them: they must
  // relist. (A bookmark that lands between the two carries a fresh version;
  // then the next round does it.)
  auto relists = [&] { return Series(op.Metrics(), "patrickstar_operator_relists_total{resource=\"patrickstarjobs\"}"); };
  for (int round = 0; round < 10 && relists() <= 0; ++round) {
    ASSERT_TRUE(server_->Compact().ok());
    ASSERT_TRUE(server_->DropWatches().ok());
    std::this_thread::sleep_for(milliseconds(300));
  }
  // Changes while the watches are down: a new job and a deleted pod.
  Create(TinyJob("fault-15", 10));
  ASSERT_TRUE(WaitFor([&] { return !Pods("patrickstar.io/job-name=fault-1").empty(); }, seconds(60)));
  ASSERT_TRUE(server_->client().Delete(op::Pods(), kNs, "fault-1-node-0", {}).ok());

  for (int i = 0; i < 16; ++i) {
    const std::string name = "fault-" + std::to_string(i);
    ASSERT_TRUE(WaitFor([&] { return Pods("patrickstar.io/job-name=" + name).size() == 2; }, seconds(90)))
        << Describe(name);
    ASSERT_TRUE(WaitForCreated(name, seconds(60))) << Describe(name);
  }
  EXPECT_EQ(Pods().size(), 32u);
  const std::string metrics = op.Metrics();
  EXPECT_GT(Series(metrics, "patrickstar_operator_api_errors_total{resource=\"pods\",verb=\"create\"}"), 0) << metrics;
  EXPECT_GT(Series(metrics, "patrickstar_operator_watch_restarts_total{resource=\"pods\"}"), 0) << metrics;
  EXPECT_GT(relists(), 0) << metrics;
  EXPECT_EQ(Series(metrics, "patrickstar_operator_jobs{phase=\"Created\"}"), 16) << metrics;
}

TEST_F(OperatorE2e, InvalidJobsFailWithAClearMessageAndOthersGoOn) {
  StartServer(/*kubelet=*/true, {"small-node:2Gi:4"});
  OperatorProcess op(*server_);
  Json preset = TinyJob("bad-preset", 10);
  preset["spec"]["config"]["model"] = {{"preset", "gpt-unknown"}};
  Create(preset);
  Json env = TinyJob("bad-env", 10);
  env["spec"]["env"] = Json::array({{{"name", "MASTER_ADDR"}, {"value", "10.0.0.1"}}});
  Create(env);
  Json huge = TinyJob("too-big", 10);
  huge["spec"]["config"]["model"] = {{"preset", "gpt2-1.5b"}};
  Create(huge);
  Create(TinyJob("good", 10));

  ASSERT_TRUE(WaitForCreated("good", seconds(60))) << Describe("good");
  struct Expect {
    const char* job;
    const char* reason;
    const char* text;
  };
  for (const Expect& e : {Expect{"bad-preset", "InvalidSpec", "gpt-unknown"},
                          Expect{"bad-env", "InvalidSpec", "MASTER_ADDR"},
                          Expect{"too-big", "InsufficientHostMemory", "small-node"}}) {
    // Invalid specs fail; a job no node can hold today has its pods created
    // (for a cluster autoscaler to act on) and says why they wait.
    const bool waits = std::string(e.reason) == "InsufficientHostMemory";
    const char* condition = waits ? "Schedulable" : "Failed";
    ASSERT_TRUE(WaitFor([&] { return Condition(e.job, condition).value("reason", "") == e.reason; }, seconds(60)))
        << Describe(e.job);
    const Json c = Condition(e.job, condition);
    EXPECT_EQ(c["status"], waits ? "False" : "True");
    EXPECT_EQ(c["reason"], e.reason) << c;
    EXPECT_NE(c["message"].get<std::string>().find(e.text), std::string::npos) << c;
    EXPECT_EQ(c["message"].get<std::string>().find('\n'), std::string::npos) << c;
    const std::vector<Json> pods = Pods(std::string("patrickstar.io/job-name=") + e.job);
    if (waits) {
      ASSERT_TRUE(WaitForCreated(e.job, seconds(60))) << Describe(e.job);
      EXPECT_EQ(Pods(std::string("patrickstar.io/job-name=") + e.job).size(), 2u);
      for (const Json& pod : Pods(std::string("patrickstar.io/job-name=") + e.job)) {
        EXPECT_EQ(pod["status"].value("phase", ""), "Pending") << pod["status"];
      }
    } else {
      EXPECT_EQ(Phase(e.job), "Failed");
      EXPECT_TRUE(pods.empty());
    }
  }
  // The schema refuses zero nodes before the operator sees it.
  if (HaveKubectl()) {
    TempDir dir("e2e-bad");
    Json zero = TinyJob("zero", 10);
    zero["spec"]["numNodes"] = 0;
    std::ofstream(dir.path() + "/zero.yaml") << zero.dump();
    ProcessResult r = Kubectl({"apply", "-f", dir.path() + "/zero.yaml"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("numNodes"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(op.process().Running());
}

// Bad flags end the operator at once with exit 2 and one line naming the flag,
// before it touches any cluster.
TEST(OperatorFlags, BadValuesAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--operator-pod-labels", "novalue"}, "--operator-pod-labels: 'novalue' is not KEY=VALUE"},
      {{"--operator-pod-labels", "a=1,=2"}, "--operator-pod-labels: '=2' is not KEY=VALUE"},
      {{"--operator-pod-labels", ""}, "--operator-pod-labels must not be empty"},
      {{"--progress-interval", "-1"}, "--progress-interval must be an integer in [0, 86400]"},
      {{"--progress-interval", "1e9"}, "--progress-interval must be an integer in [0, 86400]"},
      {{"--progress-interval"}, "--progress-interval needs a value"},
      {{"--cpu-worker-image", ""}, "--cpu-worker-image must not be empty"},
      {{"--monitoring-namespace", ""}, "--monitoring-namespace must not be empty"},
      {{"--network-policy", "--operator-namespace", "ops"}, "give --operator-pod-labels"},
  };
  for (const auto& [flags, needle] : cases) {
    std::vector<std::string> argv = {PSTAR_OPERATOR_BINARY};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ProcessResult r = RunProcess(argv);
    EXPECT_EQ(r.exit_code, 2) << needle << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// Against an API server that accepts and never answers, the operator gives
// up at its sync timeout and exits then, not after its requests' retries.
TEST_F(OperatorE2e, AStalledApiServerEndsTheOperatorAtItsSyncTimeout) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ASSERT_EQ(::listen(listener, 64), 0);
  TempDir dir("stalled");
  const std::string kubeconfig = dir.path() + "/kubeconfig";
  std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                               "clusters: [{name: s, cluster: {server: 'http://127.0.0.1:"
                            << ntohs(addr.sin_port)
                            << "'}}]\nusers: [{name: u, user: {token: t}}]\n"
                               "contexts: [{name: c, context: {cluster: s, user: u}}]\n";
  const auto start = std::chrono::steady_clock::now();
  ProcessResult r = RunProcess({PSTAR_OPERATOR_BINARY, "--kubeconfig", kubeconfig, "--metrics-address", "127.0.0.1",
                                "--metrics-port", "0", "--sync-timeout", "3"});
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(listener);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("did not sync within 3 s"), std::string::npos) << r.err;
  EXPECT_LT(took, seconds(20)) << "exited long after its sync timeout";
}

// Forty-odd invalid or hostile jobs applied while a valid one trains: each
// is refused by the API's schema or ends Failed with a one-line reason; the
// operator never goes down and the valid job succeeds.
TEST_F(OperatorE2e, AHostileCorpusIsRefusedWhileAValidJobTrains) {
  StartServer(/*kubelet=*/true);
  OperatorProcess op(*server_);
  Create(TinyJob("valid", 300, /*nodes=*/1));
  ASSERT_TRUE(WaitForCreated("valid", seconds(60))) << Describe("valid");

  auto with = [&](const std::string& name, const std::function<void(Json&)>& edit) {
    Json job = TinyJob(name, 10, /*nodes=*/1);
    edit(job);
    return job;
  };
  Json deep = 1;
  for (int i = 0; i < 400; ++i) deep = Json{{"x", deep}};
  const std::string huge(1 << 20, 'a');
  std::vector<Json> corpus = {
      with("h-nodes-zero", [](Json& j) { j["spec"]["numNodes"] = 0; }),
      with("h-nodes-negative", [](Json& j) { j["spec"]["numNodes"] = -3; }),
      with("h-nodes-string", [](Json& j) { j["spec"]["numNodes"] = "2"; }),
      with("h-nodes-huge", [](Json& j) { j["spec"]["numNodes"] = 1000000000; }),
      with("h-nodes-float", [](Json& j) { j["spec"]["numNodes"] = 1.5; }),
      with("h-nproc-zero", [](Json& j) { j["spec"]["nprocPerNode"] = 0; }),
      with("h-nproc-huge", [](Json& j) { j["spec"]["nprocPerNode"] = 100000; }),
      with("h-device", [](Json& j) { j["spec"]["device"] = "tpu"; }),
      with("h-port-high", [](Json& j) { j["spec"]["masterPort"] = 70000; }),
      with("h-metrics-port", [](Json& j) { j["spec"]["metricsPort"] = -1; }),
      // (An unknown spec field is pruned by the API server, as a structural
      // schema prunes; kubectl's strict field validation refuses it:
      // tests/chart/invalid/unknown-spec-field.yaml.)
      with("h-no-config", [](Json& j) { j["spec"].erase("config"); }),
      with("h-config-string", [](Json& j) { j["spec"]["config"] = "model: {}"; }),
      with("h-config-array", [](Json& j) { j["spec"]["config"] = Json::array({1, 2}); }),
      with("h-layers-huge", [](Json& j) { j["spec"]["config"]["model"]["n_layer"] = 1000000000000LL; }),
      with("h-layers-million", [](Json& j) { j["spec"]["config"]["model"]["n_layer"] = 1000000; }),
      with("h-embd-overflow", [](Json& j) {
        j["spec"]["config"]["model"]["n_embd"] = 2147483648LL;
        j["spec"]["config"]["model"]["n_head"] = 1;
      }),
      with("h-heads-zero", [](Json& j) { j["spec"]["config"]["model"]["n_head"] = 0; }),
      with("h-vocab-negative", [](Json& j) { j["spec"]["config"]["model"]["vocab_size"] = -5; }),
      with("h-layers-float", [](Json& j) { j["spec"]["config"]["model"]["n_layer"] = 2.5; }),
      with("h-layers-null", [](Json& j) { j["spec"]["config"]["model"]["n_layer"] = nullptr; }),
      with("h-model-array", [](Json& j) { j["spec"]["config"]["model"] = Json::array({1, 2}); }),
      with("h-preset", [](Json& j) { j["spec"]["config"]["model"] = {{"preset", "gpt-99"}}; }),
      with("h-steps-string", [](Json& j) { j["spec"]["config"]["train"]["steps"] = "many"; }),
      with("h-batch-huge", [](Json& j) { j["spec"]["config"]["train"]["batch_size"] = 1000000000000000000LL; }),
      with("h-seq-negative", [](Json& j) { j["spec"]["config"]["train"]["seq_len"] = -8; }),
      with("h-unknown-config-key", [](Json& j) { j["spec"]["config"]["trian"] = Json::object(); }),
      with("h-deep-nesting", [&](Json& j) { j["spec"]["config"]["model"]["extra"] = deep; }),
      with("h-huge-string", [&](Json& j) { j["spec"]["config"]["data"]["path"] = huge; }),
      with("h-bad-utf8-like", [](Json& j) { j["spec"]["config"]["data"]["path"] = "\xef\xbf\xbd\xe2\x80\xae../../etc"; }),
      with("h-reserved-env", [](Json& j) {
        j["spec"]["env"] = Json::array({{{"name", "MASTER_ADDR"}, {"value", "10.0.0.1"}}});
      }),
      with("h-token-env", [](Json& j) {
        j["spec"]["env"] = Json::array({{{"name", "PSTAR_STORE_TOKEN"}, {"value", "guess"}}});
      }),
      with("h-env-not-array", [](Json& j) { j["spec"]["env"] = "A=1"; }),
      with("h-backoff-negative", [](Json& j) { j["spec"]["runPolicy"] = {{"backoffLimit", -1}}; }),
      with("h-clean-policy", [](Json& j) { j["spec"]["runPolicy"] = {{"cleanPodPolicy", "Sometimes"}}; }),
      with("h-restart-policy", [](Json& j) { j["spec"]["runPolicy"] = {{"restartPolicy", "Always"}}; }),
      with("h-grace-huge", [](Json& j) {
        j["spec"]["template"] = {{"spec", {{"terminationGracePeriodSeconds", 100000000}}}};
      }),
      with("h-reserved-volume", [](Json& j) {
        j["spec"]["template"] = {{"spec", {{"volumes", Json::array({{{"name", "pstar-config"}, {"emptyDir", Json::object()}}})}}}};
      }),
      with("h-memory-garbage", [](Json& j) { j["spec"]["hostMemory"] = {{"request", "lots"}}; }),
      with("h-memory-limit-below", [](Json& j) { j["spec"]["hostMemory"] = {{"request", "8Gi"}, {"limit", "1Gi"}}; }),
      with("h-memory-tiny", [](Json& j) { j["spec"]["hostMemory"] = {{"request", "1Ki"}}; }),
      with("h-headroom", [](Json& j) { j["spec"]["hostMemory"] = {{"headroomPercent", 1000000}}; }),
      with("h-node-selector-number", [](Json& j) {
        j["spec"]["template"] = {{"spec", {{"nodeSelector", {{"pool", 3}}}}}};
      }),
  };
  ASSERT_GE(corpus.size(), 40u);
  std::vector<std::string> accepted;
  int refused_by_api = 0;
  for (const Json& job : corpus) {
    const std::string name = job["metadata"]["name"];
    ApiResponse r = server_->client().Create(op::PatrickStarJobs(), kNs, job);
    if (!r.ok()) {
      EXPECT_TRUE(r.code == 422 || r.code == 400) << name << ": " << r.code << " " << r.error;
      ++refused_by_api;
      continue;
    }
    accepted.push_back(name);
  }
  for (const std::string& name : accepted) {
    ASSERT_TRUE(WaitFor([&] { return Condition(name, "Failed").value("status", "") == "True"; }, seconds(60)))
        << name << " was accepted and did not fail: " << Describe(name);
    const Json c = Condition(name, "Failed");
    EXPECT_EQ(c["reason"], "InvalidSpec") << name << ": " << c;
    const std::string message = c.value("message", "");
    EXPECT_EQ(message.find('\n'), std::string::npos) << name;
    EXPECT_LT(message.size(), 2000u) << name << " has a message of " << message.size() << " bytes";
    EXPECT_TRUE(Pods("patrickstar.io/job-name=" + name).empty()) << name;
  }
  std::printf("hostile corpus: %zu jobs, %d refused by the schema, %zu failed by the operator\n", corpus.size(),
              refused_by_api, accepted.size());
  ASSERT_TRUE(WaitForPhase("valid", "Succeeded", seconds(240))) << Describe("valid");
  EXPECT_TRUE(op.process().Running()) << "the operator went down";
  EXPECT_EQ(HttpGet(op.MetricsPort(), "/healthz").status_line, "HTTP/1.1 200 OK");
}

TEST_F(OperatorE2e, AStandbyReplicaTakesOverWhenTheLeaderStops) {
  StartServer(/*kubelet=*/false);
  const std::vector<std::string> flags = {"--leader-elect", "--leader-election-namespace", "default"};
  OperatorProcess a(*server_, flags);
  ASSERT_TRUE(WaitFor([&] { return Series(a.Metrics(), "patrickstar_operator_leader") == 1; }, seconds(30)));
  OperatorProcess b(*server_, flags);
  std::this_thread::sleep_for(seconds(3));
  EXPECT_EQ(Series(b.Metrics(), "patrickstar_operator_leader"), 0);
  EXPECT_EQ(HttpGet(b.MetricsPort(), "/readyz").status_line, "HTTP/1.1 200 OK");  // standing by
  Create(TinyJob("led-1", 10));
  ASSERT_TRUE(WaitForCreated("led-1", seconds(60)));

  a.process().Signal(SIGTERM);  // releases the lease
  EXPECT_EQ(a.process().Wait().exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return Series(b.Metrics(), "patrickstar_operator_leader") == 1; }, seconds(20)));
  Create(TinyJob("led-2", 10));
  ASSERT_TRUE(WaitForCreated("led-2", seconds(60))) << Describe("led-2");
  ExpectModelsRoundTrip({op::Leases()}, "default");
}

}  // namespace
}  // namespace pstar::test
