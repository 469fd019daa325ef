// JobReconciler against the fake API server, in process: sizing runs off the
// reconcile workers (JobPlanner), so one job's slow sizing never holds back
// another job's pods.
#include "operator/reconciler/job_reconciler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/operator/fake_api_server.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kNs = "default";

Json TinyJob(const std::string& name) {
  return Json::parse(R"({"apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
    "metadata": {"name": ")" + name + R"(", "namespace": "default"},
    "spec": {"numNodes": 1, "nprocPerNode": 1, "device": "cpu", "metricsPort": 0,
             "config": {"model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 40, "max_seq_len": 12},
                        "train": {"batch_size": 4, "seq_len": 8, "steps": 4}}}})");
}

bool WaitFor(const std::function<bool()>& done, milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return done();
}

// A gate the test opens: sizing the job named "slow" waits at it.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    waiting_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false, waiting_ = false;
};

class JobReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = test::FakeApiServer::Start();
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    test::ProcessResult r = test::RunProcess(
        {"/usr/bin/python3", "-c", "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
         test::SourceDir() + "/crds/patrickstarjob.yaml"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const ResourceRef crds{"apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                           false};
    ApiResponse c = server_->client().Create(crds, "", Json::parse(r.out));
    ASSERT_TRUE(c.ok()) << c.error;
  }
  size_t PodsOf(const std::string& job) {
    ListOptions o;
    o.label_selector = std::string(kJobNameLabel) + "=" + job;
    ApiResponse r = server_->client().List(Pods(), kNs, o);
    return r.ok() ? r.body["items"].size() : 0;
  }
  // A reconciler with one worker, its planner waiting at `gate` while it
  // sizes the job named "slow".
  std::unique_ptr<JobReconciler> StartReconciler(Gate& gate, int planner_threads) {
    ReconcilerOptions options;
    options.workers = 1;  // inline sizing would hold the only worker
    options.planner_threads = planner_threads;
    options.watch_nodes = false;
    options.planner = [&gate](const Json& job) {
      if (job["metadata"].value("name", "") == "slow") gate.Wait();
      return PlanJob(job);
    };
    auto client = KubeClient::Create(server_->config());
    EXPECT_TRUE(client.ok()) << client.status().message();
    if (!client.ok()) return nullptr;
    client_ = std::move(client).value();
    auto reconciler = std::make_unique<JobReconciler>(*client_, options, nullptr);
    if (!reconciler->Start(seconds(30)).ok()) return nullptr;
    return reconciler;
  }
  std::unique_ptr<test::FakeApiServer> server_;
  std::unique_ptr<KubeClient> client_;  // the reconciler's: a member, so it outlives the test's reconciler
};

// With the only worker free while the planner sizes: the job being sized is
// reported Pending at once (inline sizing would hold the worker, and nothing
// would be written), and gets its pods when its plan is made.
TEST_F(JobReconcilerTest, TheWorkersAreNotHeldBySizing) {
  Gate gate;
  std::unique_ptr<JobReconciler> reconciler = StartReconciler(gate, /*planner_threads=*/1);
  ASSERT_NE(reconciler, nullptr);

  ASSERT_TRUE(server_->client().Create(PatrickStarJobs(), kNs, TinyJob("slow")).ok());
  ASSERT_TRUE(WaitFor([&] { return gate.Waiting(); }, seconds(30))) << "the slow job's sizing never started";
  EXPECT_TRUE(WaitFor(
      [&] {
        ApiResponse r = server_->client().Get(PatrickStarJobs(), kNs, "slow");
        return r.ok() && r.body.contains("status") && r.body["status"].value("phase", "") == "Pending";
      },
      seconds(30)))
      << "the worker was held by the sizing";
  EXPECT_EQ(PodsOf("slow"), 0u);
  gate.Open();
  EXPECT_TRUE(WaitFor([&] { return PodsOf("slow") == 1; }, seconds(30)));
  reconciler->Stop();
}

TEST_F(JobReconcilerTest, PodsOfAQuickJobAppearWhileAnotherIsStillBeingSized) {
  Gate gate;
  std::unique_ptr<JobReconciler> reconciler = StartReconciler(gate, /*planner_threads=*/2);
  ASSERT_NE(reconciler, nullptr);
  ASSERT_TRUE(server_->client().Create(PatrickStarJobs(), kNs, TinyJob("slow")).ok());
  ASSERT_TRUE(WaitFor([&] { return gate.Waiting(); }, seconds(30)));
  ASSERT_TRUE(server_->client().Create(PatrickStarJobs(), kNs, TinyJob("fast")).ok());
  EXPECT_TRUE(WaitFor([&] { return PodsOf("fast") == 1; }, seconds(30)))
      << "a job waited on another's sizing";
  EXPECT_EQ(PodsOf("slow"), 0u);
  gate.Open();
  EXPECT_TRUE(WaitFor([&] { return PodsOf("slow") == 1; }, seconds(30)));
  reconciler->Stop();
}

TEST(JobPlannerTest, PlansEachGenerationOnceAndForgets) {
  std::atomic<int> made{0};
  std::mutex mu;
  std::vector<std::string> ready;
  // Plans wait at the gate until the test has asked twice, so the second ask
  // finds the first one's plan still on its way (a tiny job plans in well
  // under a millisecond).
  Gate gate;
  JobPlanner planner(
      2,
      [&](const Json& job) {
        ++made;
        gate.Wait();
        return PlanJob(job);
      },
      [&](const std::string& key) {
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back(key);
      });
  Json job = TinyJob("a");
  job["metadata"]["uid"] = "u1";
  job["metadata"]["generation"] = 1;
  EXPECT_EQ(planner.Find("default/a", job), nullptr);
  EXPECT_EQ(planner.Find("default/a", job), nullptr) << "queued once";
  gate.Open();
  ASSERT_TRUE(WaitFor([&] { return planner.Find("default/a", job) != nullptr; }, seconds(10)));
  EXPECT_TRUE(planner.Find("default/a", job)->spec.ok());
  EXPECT_EQ(made.load(), 1);
  // on_ready runs after the plan is stored, so Find can see the plan first.
  auto ready_keys = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return ready;
  };
  ASSERT_TRUE(WaitFor([&] { return !ready_keys().empty(); }, seconds(10)));
  EXPECT_EQ(ready_keys(), std::vector<std::string>{"default/a"});
  job["metadata"]["generation"] = 2;  // an edit: planned afresh
  EXPECT_EQ(planner.Find("default/a", job), nullptr);
  ASSERT_TRUE(WaitFor([&] { return planner.Find("default/a", job) != nullptr; }, seconds(10)));
  EXPECT_EQ(made.load(), 2);
  planner.Forget("u1");
  EXPECT_EQ(planner.Find("default/a", job), nullptr) << "forgotten: made again";
}

}  // namespace
}  // namespace pstar::op
