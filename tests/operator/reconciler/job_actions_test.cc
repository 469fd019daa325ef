#include "operator/reconciler/job_actions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>

namespace pstar::op {
namespace {

using std::chrono::seconds;

const WallTime kT0 = std::chrono::system_clock::from_time_t(1800000000);

Json TinyJob(const std::string& name = "tiny") {
  return Json::parse(R"({
    "apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
    "metadata": {"name": ")" + name + R"(", "namespace": "team", "uid": "uid-1", "generation": 1,
                 "resourceVersion": "10"},
    "spec": {"numNodes": 2, "nprocPerNode": 1, "device": "cpu",
             "config": {"model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 40, "max_seq_len": 12},
                        "train": {"batch_size": 4, "seq_len": 8, "steps": 4}},
             "runPolicy": {"backoffLimit": 2}}
  })");
}

// Applies the actions to a pretend cluster so the next observation sees them.
struct World {
  JobObservation o;
  OperatorDefaults defaults;

  explicit World(Json job) {
    o.job = std::move(job);
    o.now = kT0;
    o.fresh_store_token = "0123456789abcdef";
  }
  JobActions Step() {
    JobActions a = DecideJobActions(o, defaults);
    if (a.status) o.job["status"] = *a.status;
    for (const std::string& name : a.delete_pods) {
      o.pods.erase(std::remove_if(o.pods.begin(), o.pods.end(),
                                  [&](const Json& p) { return p["metadata"]["name"] == name; }),
                   o.pods.end());
    }
    for (const Json& c : a.create) {
      if (c["kind"] == "Service") o.service_exists = true;
      if (c["kind"] == "ConfigMap") o.config_map = c;
      if (c["kind"] == "Secret") o.store_token_exists = true;
      if (c["kind"] == "NetworkPolicy") o.network_policy_exists = true;
      if (c["kind"] == "Pod") {
        Json pod = c;
        pod["metadata"]["namespace"] = "team";
        pod["status"] = {{"phase", "Pending"}};
        o.pods.push_back(pod);
      }
    }
    return a;
  }
  void SetPhase(int index, const std::string& phase, int exit_code = -1) {
    for (Json& p : o.pods) {
      if (p["metadata"]["labels"][kNodeIndexLabel] != std::to_string(index)) continue;
      p["status"]["phase"] = phase;
      if (phase == "Running") {
        p["status"]["conditions"] = Json::array({{{"type", "Ready"}, {"status", "True"}}});
      }
      if (exit_code >= 0) {
        p["status"]["containerStatuses"] =
            Json::array({{{"name", "worker"}, {"state", {{"terminated", {{"exitCode", exit_code}}}}}}});
      }
    }
  }
  const Json& status() const { return o.job["status"]; }
  std::string Condition(const std::string& type, const char* field = "status") const {
    for (const Json& c : status()["conditions"]) {
      if (c["type"] == type) return c[field].get<std::string>();
    }
    return "";
  }
};

std::set<std::string> Kinds(const JobActions& a) {
  std::set<std::string> kinds;
  for (const Json& c : a.create) kinds.insert(c["kind"].get<std::string>());
  return kinds;
}

bool HasEvent(const JobActions& a, const std::string& reason) {
  return std::any_of(a.events.begin(), a.events.end(), [&](const JobEvent& e) { return e.reason == reason; });
}

TEST(JobActions, ANewJobGetsItsServiceConfigMapAndOnePodPerNode) {
  World w(TinyJob());
  JobActions a = w.Step();
  ASSERT_TRUE(a.status);
  EXPECT_EQ(a.create.size(), 5u);
  EXPECT_EQ(a.create[0]["kind"], "Service");
  EXPECT_EQ(a.create[1]["kind"], "ConfigMap");
  EXPECT_EQ(a.create[2]["kind"], "Secret") << "before the pods that read it";
  EXPECT_EQ(a.create[2]["data"][kStoreTokenKey], "MDEyMzQ1Njc4OWFiY2RlZg==");
  EXPECT_EQ(a.create[3]["metadata"]["name"], "tiny-node-0");
  EXPECT_EQ(a.create[4]["metadata"]["name"], "tiny-node-1");
  EXPECT_EQ(a.create[4]["metadata"]["labels"][kAttemptLabel], "0");
  // Asked for, not yet seen: not Created yet.
  EXPECT_EQ(w.status()["phase"], kPhasePending);
  EXPECT_EQ(w.Condition("Created"), "False");
  EXPECT_EQ(w.Condition("Created", "reason"), "CreatingPods");
  EXPECT_EQ(w.Condition("Created", "message"), "creating 2 pods of 2");
  EXPECT_FALSE(HasEvent(a, "PodsCreated"));
  // The cache shows the pods: Created.
  a = w.Step();
  EXPECT_TRUE(a.create.empty());
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
  EXPECT_EQ(w.Condition("Created"), "True");
  EXPECT_EQ(w.status()["worldSize"], 2);
  EXPECT_EQ(w.status()["restarts"], 0);
  EXPECT_EQ(w.status()["startTime"], FormatTime(kT0));
  EXPECT_TRUE(w.status()["memory"].is_object());
  EXPECT_TRUE(HasEvent(a, "PodsCreated"));
  // Level-triggered and idempotent: nothing changed, nothing to do.
  JobActions again = w.Step();
  EXPECT_FALSE(again.status);
  EXPECT_TRUE(again.create.empty());
  EXPECT_TRUE(again.delete_pods.empty());
  EXPECT_TRUE(again.events.empty());
}

TEST(JobActions, TheStoreTokenSecretIsMadeOnceAndTheNetworkPolicyWhenEnabled) {
  World w(TinyJob());
  w.defaults.network_policy.enabled = true;
  JobActions a = w.Step();
  EXPECT_EQ(Kinds(a), (std::set<std::string>{"Service", "ConfigMap", "Secret", "NetworkPolicy", "Pod"}));
  for (const Json& c : a.create) {
    if (c["kind"] != "Pod") continue;
    bool reads_token = false;
    for (const Json& e : c["spec"]["containers"][0]["env"]) {
      reads_token = reads_token || (e["name"] == "PSTAR_STORE_TOKEN" &&
                                    e["valueFrom"]["secretKeyRef"]["name"] == "tiny-store-token");
    }
    EXPECT_TRUE(reads_token) << c["metadata"]["name"];
  }
  EXPECT_TRUE(w.Step().create.empty());
  // Deleted from outside: made again (a new token: the next gang reads it),
  // and the running pods are left alone.
  w.o.store_token_exists = false;
  w.o.network_policy_exists = false;
  w.o.fresh_store_token = "another";
  a = w.Step();
  EXPECT_EQ(Kinds(a), (std::set<std::string>{"Secret", "NetworkPolicy"}));
  EXPECT_TRUE(a.delete_pods.empty());
}

TEST(JobActions, MissingChildrenAreRecreatedWithoutTouchingTheRest) {
  World w(TinyJob());
  w.Step();
  w.o.service_exists = false;
  w.o.pods.pop_back();
  JobActions a = w.Step();
  EXPECT_EQ(Kinds(a), (std::set<std::string>{"Service", "Pod"}));
  ASSERT_EQ(a.create.size(), 2u);
  EXPECT_EQ(a.create[1]["metadata"]["name"], "tiny-node-1");
}

TEST(JobActions, RunningWhenEveryPodRuns) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
  EXPECT_EQ(w.status()["ready"], "1/2");
  w.SetPhase(1, "Running");
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseRunning);
  EXPECT_EQ(w.Condition("Running"), "True");
  EXPECT_EQ(w.status()["readyRanks"], 2);
  EXPECT_TRUE(HasEvent(a, "AllRanksRunning"));
}

TEST(JobActions, ARetryableFailureRestartsTheWholeGangUpToTheBackoffLimit) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.SetPhase(1, "Failed", 137);
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["restarts"], 1);
  EXPECT_EQ(w.status()["phase"], kPhaseRestarting);
  EXPECT_EQ(w.Condition("Restarting"), "True");
  EXPECT_NE(w.Condition("Restarting", "message").find("exited with code 137"), std::string::npos);
  EXPECT_EQ(w.Condition("Running"), "False");
  EXPECT_EQ(std::set<std::string>(a.delete_pods.begin(), a.delete_pods.end()),
            (std::set<std::string>{"tiny-node-0", "tiny-node-1"}));
  EXPECT_TRUE(a.create.empty());
  ASSERT_TRUE(HasEvent(a, "RankFailed"));
  EXPECT_EQ(a.events[0].type, "Warning");

  // The new attempt's pods carry the restart count.
  JobActions next = w.Step();
  ASSERT_EQ(next.create.size(), 2u);
  EXPECT_EQ(next.create[0]["metadata"]["labels"][kAttemptLabel], "1");
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseRunning);
  EXPECT_EQ(w.Condition("Restarting"), "False");

  // Second failure: restart 2 of 2; third: the limit.
  w.SetPhase(0, "Failed", 1);
  w.Step();
  EXPECT_EQ(w.status()["restarts"], 2);
  w.Step();
  w.SetPhase(0, "Failed", 143);
  JobActions last = w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseFailed);
  EXPECT_EQ(w.Condition("Failed"), "True");
  EXPECT_EQ(w.Condition("Failed", "reason"), "BackoffLimitExceeded");
  EXPECT_NE(w.Condition("Failed", "message").find("backoffLimit 2"), std::string::npos);
  EXPECT_TRUE(w.status().contains("completionTime"));
  // cleanPodPolicy Running: the rank still pending goes, the failed one stays.
  EXPECT_EQ(last.delete_pods, std::vector<std::string>{"tiny-node-1"});
}

TEST(JobActions, PodsOfAnOlderAttemptAreGoneBeforeTheNewGangStarts) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Failed", 137);
  // The operator wrote restarts=1 but the pods linger, terminating.
  w.o.job["status"]["restarts"] = 1;
  for (Json& p : w.o.pods) p["metadata"]["deletionTimestamp"] = FormatTime(kT0);
  JobActions a = w.Step();
  EXPECT_TRUE(a.create.empty() || Kinds(a).count("Pod") == 0);
  EXPECT_EQ(w.status()["phase"], kPhaseRestarting);
  w.o.pods.clear();
  JobActions b = w.Step();
  EXPECT_EQ(Kinds(b).count("Pod"), 1u);
}

TEST(JobActions, APodFromALaterAttemptMeansTheCacheIsBehind) {
  World w(TinyJob());
  w.Step();
  w.o.pods[0]["metadata"]["labels"][kAttemptLabel] = "3";
  JobActions a = w.Step();
  EXPECT_FALSE(a.status);
  EXPECT_TRUE(a.create.empty());
  EXPECT_TRUE(a.delete_pods.empty());
  ASSERT_TRUE(a.requeue_after);
}

TEST(JobActions, APermanentExitCodeFailsAtOnce) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  ASSERT_EQ(w.status()["ready"], "2/2");
  w.SetPhase(1, "Failed", 2);
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseFailed);
  // READY no longer claims the ranks of a failed job.
  EXPECT_EQ(w.status()["ready"], "0/2");
  EXPECT_EQ(w.status()["readyRanks"], 0);
  EXPECT_EQ(w.Condition("Failed", "reason"), "PermanentFailure");
  EXPECT_EQ(w.status()["restarts"], 0);
  EXPECT_EQ(a.delete_pods, std::vector<std::string>{"tiny-node-0"});
  EXPECT_TRUE(HasEvent(a, "PermanentFailure"));
}

// A rank the kernel killed at its memory limit fails the job at once, with
// its own reason naming the rank, the limit and the plan: a restart with the
// same limit would end the same way, even where the restart policy and the
// backoff limit would allow one. An exit 137 without OOMKilled (a kill from
// outside) still restarts the gang.
TEST(JobActions, AnOomKilledRankFailsTheJobAsOutOfMemory) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.SetPhase(1, "Failed", 137);
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseRestarting) << w.status().dump(1);

  World oom(TinyJob());
  oom.Step();
  oom.SetPhase(0, "Running");
  oom.SetPhase(1, "Running");
  oom.Step();
  oom.SetPhase(0, "Failed", 1);  // a peer's exit that follows from the OOM kill
  oom.SetPhase(1, "Failed", 137);
  for (Json& p : oom.o.pods) {
    if (p["metadata"]["labels"][kNodeIndexLabel] != "1") continue;
    p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled";
  }
  JobActions a = oom.Step();
  EXPECT_EQ(oom.status()["phase"], kPhaseFailed);
  EXPECT_EQ(oom.Condition("Failed", "reason"), "OutOfMemory");
  const std::string message = oom.Condition("Failed", "message");
  EXPECT_TRUE(std::regex_search(
      message, std::regex(R"(^rank 1 \(pod tiny-node-1\) was killed at its memory limit of [0-9.]+ [MG]iB \(OOMKilled, exit 137\))")))
      << message;
  EXPECT_NE(message.find("the plan needs "), std::string::npos) << message;
  EXPECT_NE(message.find("spec.hostMemory.limit"), std::string::npos) << message;
  EXPECT_EQ(oom.status()["restarts"], 0);
  EXPECT_TRUE(HasEvent(a, "OutOfMemory"));
}

TEST(JobActions, ARunningGangThatLosesAPodRestarts) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.o.pods.pop_back();
  w.Step();
  EXPECT_EQ(w.status()["restarts"], 1);
  EXPECT_NE(w.Condition("Restarting", "message").find("tiny-node-1 disappeared"), std::string::npos);
}

TEST(JobActions, SuccessThenTtlDeletesTheJob) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 60;
  World w(job);
  w.Step();
  w.SetPhase(0, "Succeeded", 0);
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
  w.SetPhase(1, "Succeeded", 0);
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseSucceeded);
  EXPECT_EQ(w.Condition("Succeeded"), "True");
  EXPECT_EQ(w.status()["completionTime"], FormatTime(kT0));
  ASSERT_TRUE(a.requeue_after);
  EXPECT_FALSE(a.delete_job);
  w.o.now = kT0 + seconds(30);
  JobActions b = w.Step();
  EXPECT_FALSE(b.delete_job);
  ASSERT_TRUE(b.requeue_after);
  EXPECT_LE(*b.requeue_after, std::chrono::milliseconds(30000));
  w.o.now = kT0 + seconds(61);
  EXPECT_TRUE(w.Step().delete_job);
}

TEST(JobActions, CleanPodPolicyAllDeletesFinishedPods) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["cleanPodPolicy"] = "All";
  World w(job);
  w.Step();
  w.SetPhase(0, "Succeeded", 0);
  w.SetPhase(1, "Succeeded", 0);
  JobActions a = w.Step();
  EXPECT_EQ(a.delete_pods.size(), 2u);
}

TEST(JobActions, AnInvalidSpecFailsWithTheReasonAndIsLookedAtAgainWhenEdited) {
  Json job = TinyJob();
  job["spec"]["numNodes"] = 0;
  World w(job);
  JobActions a = w.Step();
  EXPECT_TRUE(a.create.empty());
  EXPECT_EQ(w.status()["phase"], kPhaseFailed);
  EXPECT_EQ(w.Condition("Failed", "reason"), "InvalidSpec");
  EXPECT_NE(w.Condition("Failed", "message").find("numNodes"), std::string::npos);
  EXPECT_FALSE(w.Step().status);  // stays failed, quietly
  w.o.job["spec"]["numNodes"] = 2;
  w.o.job["metadata"]["generation"] = 2;
  JobActions b = w.Step();
  EXPECT_EQ(Kinds(b).count("Pod"), 1u);
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
  EXPECT_EQ(w.Condition("Failed"), "");
  EXPECT_EQ(w.status()["observedGeneration"], 2);
}

TEST(JobActions, AnUnknownPresetIsInvalid) {
  Json job = TinyJob();
  job["spec"]["config"]["model"] = {{"preset", "gpt-7"}};
  World w(job);
  w.Step();
  EXPECT_EQ(w.Condition("Failed", "reason"), "InvalidSpec");
  EXPECT_NE(w.Condition("Failed", "message").find("gpt-7"), std::string::npos) << w.Condition("Failed", "message");
}

// No node fits the gang today: the pods are still created (a cluster
// autoscaler adds nodes only for pods that wait), and a Schedulable
// condition names the cause: memory, GPUs or the selector.
TEST(JobActions, AJobThatFitsNoNodeCreatesItsPodsAndSaysWhy) {
  World w(TinyJob());
  const char* kNode = R"({"metadata": {"name": "small", "labels": {}},
      "status": {"allocatable": {"memory": "%s", "cpu": "4"},
                 "conditions": [{"type": "Ready", "status": "True"}]}})";
  char node[512];
  std::snprintf(node, sizeof node, kNode, "64Mi");
  w.o.nodes.push_back(Json::parse(node));
  JobActions a = w.Step();
  EXPECT_EQ(std::count_if(a.create.begin(), a.create.end(), [](const Json& c) { return c["kind"] == "Pod"; }), 2);
  EXPECT_EQ(w.Condition("Schedulable"), "False");
  EXPECT_EQ(w.Condition("Schedulable", "reason"), "InsufficientHostMemory");
  EXPECT_NE(w.Condition("Schedulable", "message").find("small"), std::string::npos)
      << w.Condition("Schedulable", "message");
  EXPECT_TRUE(HasEvent(a, "InsufficientHostMemory"));
  ASSERT_TRUE(a.requeue_after);
  // Not terminal, and quiet while nothing changes: one event, not one per look.
  JobActions again = w.Step();
  EXPECT_TRUE(again.events.empty() || !HasEvent(again, "InsufficientHostMemory"));
  EXPECT_EQ(w.Condition("Created"), "True") << "the pods exist, waiting for a node";
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
  // The autoscaler adds a bigger node: the condition turns, the pods run.
  std::snprintf(node, sizeof node, kNode, "64Gi");
  w.o.nodes[0] = Json::parse(node);
  w.Step();
  EXPECT_EQ(w.Condition("Schedulable"), "True");
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseRunning);
  // Once the gang runs, the nodes' fitness is not looked at.
  std::snprintf(node, sizeof node, kNode, "64Mi");
  w.o.nodes[0] = Json::parse(node);
  JobActions c = w.Step();
  EXPECT_TRUE(c.delete_pods.empty());
  EXPECT_EQ(w.Condition("Schedulable"), "True");
}

TEST(JobActions, TheNodeFitReasonNamesGpusOrTheSelector) {
  const char* kGpuNode = R"({"metadata": {"name": "cpu-only", "labels": {"pool": "cpu"}},
      "status": {"allocatable": {"memory": "64Gi", "cpu": "16"},
                 "conditions": [{"type": "Ready", "status": "True"}]}})";
  Json cuda = TinyJob();
  cuda["spec"]["device"] = "cuda";
  World gpus(cuda);
  gpus.o.nodes.push_back(Json::parse(kGpuNode));
  gpus.Step();
  EXPECT_EQ(gpus.Condition("Schedulable", "reason"), "InsufficientGPUs");
  Json selected = TinyJob();
  selected["spec"]["template"] = {{"spec", {{"nodeSelector", {{"pool", "big-memory"}}}}}};
  World selector(selected);
  selector.o.nodes.push_back(Json::parse(kGpuNode));
  selector.Step();
  EXPECT_EQ(selector.Condition("Schedulable", "reason"), "NoMatchingNode");
  EXPECT_NE(selector.Condition("Schedulable", "message").find("node selector"), std::string::npos)
      << selector.Condition("Schedulable", "message");
}

TEST(JobActions, APodDeletedByOthersRestartsTheGang) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.o.pods[1]["metadata"]["deletionTimestamp"] = FormatTime(kT0);  // kubectl drain
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["restarts"], 1);
  EXPECT_EQ(w.status()["failedRestarts"], 0);  // a drain is not the job's failure
  EXPECT_EQ(w.Condition("Restarting", "reason"), "PodDeleted");
  EXPECT_NE(w.Condition("Restarting", "message").find("tiny-node-1 is being deleted"), std::string::npos);
  EXPECT_EQ(a.delete_pods, std::vector<std::string>{"tiny-node-0"});
}

// Only restarts after a failed rank count against backoffLimit: with limit
// 1, a spec edit and a pod deleted by hand restart the gang, the first
// failure restarts it, and only the second failure ends the job.
// Status messages count in English: one pod, one rank.
TEST(JobActions, CreatedMessageCountsPodsAndRanks) {
  Json job = TinyJob();
  job["spec"]["numNodes"] = 1;
  World w(job);
  w.Step();
  w.Step();
  EXPECT_EQ(w.Condition("Created", "message"), "created 1 pod for 1 rank");
  World two(TinyJob());
  two.Step();
  two.Step();
  EXPECT_EQ(two.Condition("Created", "message"), "created 2 pods for 2 ranks");
}

// A refused pod create (a quota, an admission webhook) shows in the Created
// condition and as one event per distinct refusal, not one per retry; the
// status never claims pods that do not exist.
TEST(JobActions, ARefusedPodCreateIsShownOnceAndNeverClaimedCreated) {
  World w(TinyJob());
  w.o.create_failure = "create pods: 403 Forbidden: exceeded quota: pods=2, used: pods=10, limited: pods=10";
  // The pretend cluster refuses: nothing the Step creates appears.
  auto refuse = [&] {
    JobActions a = DecideJobActions(w.o, w.defaults);
    if (a.status) w.o.job["status"] = *a.status;
    for (const Json& c : a.create) {
      if (c["kind"] == "Service") w.o.service_exists = true;
      if (c["kind"] == "ConfigMap") w.o.config_map = c;
      if (c["kind"] == "Secret") w.o.store_token_exists = true;
    }
    return a;
  };
  JobActions a = refuse();
  EXPECT_EQ(w.Condition("Created"), "False");
  EXPECT_EQ(w.Condition("Created", "reason"), "CreateFailed");
  EXPECT_EQ(w.Condition("Created", "message"), "cannot create 2 pods: " + w.o.create_failure);
  EXPECT_EQ(w.status()["phase"], kPhasePending);
  EXPECT_TRUE(HasEvent(a, "CreateFailed"));
  for (int i = 0; i < 3; ++i) {
    JobActions again = refuse();
    EXPECT_FALSE(HasEvent(again, "CreateFailed")) << "retry " << i;
    EXPECT_EQ(std::count_if(again.create.begin(), again.create.end(), [](const Json& c) { return c["kind"] == "Pod"; }),
              2)
        << "it keeps trying";
  }
  w.o.create_failure = "create pods: 403 Forbidden: exceeded quota: pods=2, used: pods=9, limited: pods=10";
  EXPECT_TRUE(HasEvent(refuse(), "CreateFailed")) << "a different refusal is news";
  // The quota frees up: the pods appear and the condition turns.
  w.o.create_failure.clear();
  w.Step();
  w.Step();
  EXPECT_EQ(w.Condition("Created"), "True");
  EXPECT_EQ(w.status()["phase"], kPhaseCreated);
}

// The failure is pinned on the first pod to fail, and a permanent exit code
// anywhere in the gang decides, whichever pod failed first.
TEST(JobActions, TheFirstPodToFailIsBlamedAndAPermanentCodeAnywhereDecides) {
  Json job = TinyJob();
  job["spec"]["numNodes"] = 3;
  job["spec"]["runPolicy"] = {{"backoffLimit", 3}, {"restartPolicy", "ExitCode"}};
  World w(job);
  w.Step();
  w.Step();
  for (int i = 0; i < 3; ++i) w.SetPhase(i, "Running");
  w.Step();
  auto fail = [&](int index, int code, const std::string& at) {
    for (Json& p : w.o.pods) {
      if (p["metadata"]["labels"][kNodeIndexLabel] != std::to_string(index)) continue;
      p["status"]["phase"] = "Failed";
      p["status"]["containerStatuses"] = Json::array(
          {{{"name", "worker"}, {"state", {{"terminated", {{"exitCode", code}, {"finishedAt", at}}}}}}});
    }
  };
  // Node 2 failed first; node 0, a collateral exit, later.
  fail(0, 1, "2026-01-01T00:00:09Z");
  fail(2, 1, "2026-01-01T00:00:05Z");
  w.Step();
  EXPECT_EQ(w.Condition("Restarting", "reason"), "RankFailed");
  EXPECT_NE(w.Condition("Restarting", "message").find("pod tiny-node-2 exited with code 1"), std::string::npos)
      << w.Condition("Restarting", "message");
  // The next gang: a peer exits 1 first, then a rank's permanent exit 2.
  w.Step();
  w.Step();
  for (int i = 0; i < 3; ++i) w.SetPhase(i, "Running");
  w.Step();
  fail(0, 1, "2026-01-01T00:01:00Z");
  fail(1, 2, "2026-01-01T00:01:03Z");
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseFailed);
  EXPECT_EQ(w.Condition("Failed", "reason"), "PermanentFailure");
  EXPECT_NE(w.Condition("Failed", "message").find("pod tiny-node-1 exited with code 2"), std::string::npos)
      << w.Condition("Failed", "message");
}

TEST(JobActions, OnlyFailuresUseUpTheBackoffLimit) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["backoffLimit"] = 1;
  World w(job);
  auto run_gang = [&] {
    w.Step();
    w.o.pods.clear();
    w.Step();  // the new gang
    w.SetPhase(0, "Running");
    w.SetPhase(1, "Running");
    w.Step();
  };
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.o.job["spec"]["config"]["train"]["log_every"] = 7;  // an edit
  w.o.job["metadata"]["generation"] = 2;
  w.Step();
  EXPECT_EQ(w.Condition("Restarting", "reason"), "SpecChanged");
  run_gang();
  w.o.pods[0]["metadata"]["deletionTimestamp"] = FormatTime(kT0);  // deleted by hand
  w.Step();
  EXPECT_EQ(w.Condition("Restarting", "reason"), "PodDeleted");
  run_gang();
  EXPECT_EQ(w.status()["restarts"], 2);
  EXPECT_EQ(w.status()["failedRestarts"], 0);
  w.SetPhase(1, "Failed", 137);
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseRestarting);
  EXPECT_EQ(w.status()["failedRestarts"], 1);
  EXPECT_NE(w.Condition("Restarting", "message").find("restart 1 of 1 after failures"), std::string::npos)
      << w.Condition("Restarting", "message");
  run_gang();
  w.SetPhase(0, "Failed", 1);
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseFailed);
  EXPECT_EQ(w.Condition("Failed", "reason"), "BackoffLimitExceeded");
}

TEST(JobActions, ASpecChangeRestartsTheGangWithTheNewConfig) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["backoffLimit"] = 0;
  World w(job);
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  EXPECT_FALSE(w.Step().status);  // unchanged spec: nothing to do
  w.o.job["spec"]["config"]["train"]["steps"] = 8;
  w.o.job["metadata"]["generation"] = 2;
  JobActions a = w.Step();
  EXPECT_EQ(w.status()["restarts"], 1);  // even past the backoff limit: not a failure
  EXPECT_EQ(w.Condition("Restarting", "reason"), "SpecChanged");
  EXPECT_EQ(a.delete_pods.size(), 2u);
  // With the old pods gone, the ConfigMap is updated before the new gang.
  JobActions b = w.Step();
  ASSERT_EQ(b.replace.size(), 1u);
  EXPECT_NE(b.replace[0]["data"]["job.yaml"].get<std::string>().find("steps: 8"), std::string::npos)
      << b.replace[0]["data"];
  EXPECT_EQ(Kinds(b).count("Pod"), 1u);
}

TEST(JobActions, SuccessWinsOverALateDeadline) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 60;
  World w(job);
  w.Step();
  w.SetPhase(0, "Succeeded", 0);
  w.SetPhase(1, "Succeeded", 0);
  w.o.now = kT0 + seconds(3600);  // the operator looks long after the end
  w.Step();
  EXPECT_EQ(w.status()["phase"], kPhaseSucceeded);
}

TEST(JobActions, SuspendDeletesThePodsAndResumeRecreatesThem) {
  World w(TinyJob());
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.Step();
  w.o.job["spec"]["runPolicy"]["suspend"] = true;
  JobActions a = w.Step();
  EXPECT_EQ(a.delete_pods.size(), 2u);
  EXPECT_EQ(w.status()["phase"], kPhaseSuspended);
  EXPECT_EQ(w.Condition("Suspended"), "True");
  EXPECT_TRUE(HasEvent(a, "JobSuspended"));
  w.o.job["spec"]["runPolicy"]["suspend"] = false;
  w.o.now = kT0 + seconds(100);
  JobActions b = w.Step();
  EXPECT_EQ(Kinds(b).count("Pod"), 1u);
  EXPECT_EQ(w.Condition("Suspended"), "False");
  EXPECT_EQ(w.status()["startTime"], FormatTime(kT0 + seconds(100)));
}

TEST(JobActions, TheActiveDeadlineEndsTheJob) {
  Json job = TinyJob();
  job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 600;
  World w(job);
  w.Step();
  w.SetPhase(0, "Running");
  w.SetPhase(1, "Running");
  w.o.now = kT0 + seconds(10);
  JobActions a = w.Step();
  ASSERT_TRUE(a.requeue_after);
  EXPECT_LE(*a.requeue_after, std::chrono::milliseconds(590000));
  w.o.now = kT0 + seconds(600);
  JobActions b = w.Step();
  EXPECT_EQ(w.Condition("Failed", "reason"), "DeadlineExceeded");
  EXPECT_EQ(b.delete_pods.size(), 2u);
}

TEST(JobActions, ADeletedJobIsLeftToTheGarbageCollector) {
  Json job = TinyJob();
  job["metadata"]["deletionTimestamp"] = FormatTime(kT0);
  World w(job);
  JobActions a = w.Step();
  EXPECT_FALSE(a.status);
  EXPECT_TRUE(a.create.empty());
}

}  // namespace
}  // namespace pstar::op
