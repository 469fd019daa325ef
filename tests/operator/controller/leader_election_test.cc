// Leader election against the fake API server.
#include "operator/controller/leader_election.h"

#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "operator/kube/kube_time.h"
#include "tests/operator/fake_api_server.h"

namespace pstar::op {
namespace {

using pstar::test::FakeApiServer;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

template <typename F>
bool Eventually(F condition, milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return condition();
}

LeaderElectionConfig FastConfig(const std::string& identity) {
  LeaderElectionConfig c;
  c.lease_namespace = "default";
  c.lease_name = "pstar-operator";
  c.identity = identity;
  c.lease_duration = milliseconds(2000);
  c.renew_deadline = milliseconds(1500);
  c.retry_period = milliseconds(200);
  return c;
}

struct Events {
  std::atomic<int> started{0}, stopped{0};
  std::mutex mu;
  std::vector<std::string> leaders;
  LeaderCallbacks Callbacks() {
    return {[this] { ++started; }, [this] { ++stopped; },
            [this](const std::string& id) {
              std::lock_guard<std::mutex> lock(mu);
              leaders.push_back(id);
            }};
  }
};

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = FakeApiServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    for (auto* c : {&a_, &b_}) {
      ClientOptions options;
      options.max_retries = 0;
      auto client = KubeClient::Create(server_->config(), options);
      ASSERT_TRUE(client.ok());
      *c = std::move(*client);
    }
  }
  Json Lease() { return server_->client().Get(Leases(), "default", "pstar-operator").body; }

  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<KubeClient> a_, b_;
};

TEST_F(LeaderElectionTest, OneLeadsAndTheOtherTakesOverOnRelease) {
  Events ea, eb;
  LeaderElector a(*a_, FastConfig("a"), ea.Callbacks());
  LeaderElector b(*b_, FastConfig("b"), eb.Callbacks());
  a.Start();
  ASSERT_TRUE(Eventually([&] { return a.IsLeader(); }, milliseconds(5000)));
  b.Start();
  std::this_thread::sleep_for(milliseconds(1000));  // b tries several times and fails
  EXPECT_TRUE(a.IsLeader());
  EXPECT_FALSE(b.IsLeader());
  EXPECT_EQ(eb.started.load(), 0);
  EXPECT_EQ(b.ObservedLeader(), "a");
  {
    std::lock_guard<std::mutex> lock(eb.mu);
    ASSERT_FALSE(eb.leaders.empty());
    EXPECT_EQ(eb.leaders.front(), "a");
  }

  Json lease = Lease();
  EXPECT_EQ(lease["spec"]["holderIdentity"], "a");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 2);
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 0);
  const std::regex micro_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match(lease["spec"]["renewTime"].get<std::string>(), micro_time)) << lease.dump();
  EXPECT_TRUE(std::regex_match(lease["spec"]["acquireTime"].get<std::string>(), micro_time));
  // Renewals move renewTime forward.
  std::string renew1 = lease["spec"]["renewTime"];
  ASSERT_TRUE(Eventually([&] { return Lease()["spec"]["renewTime"] != renew1; }, milliseconds(3000)));

  auto stopped_at = Clock::now();
  a.Stop();  // releases the Lease
  EXPECT_FALSE(a.IsLeader());
  EXPECT_EQ(ea.started.load(), 1);
  EXPECT_EQ(ea.stopped.load(), 1);
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }, milliseconds(3000)));
  EXPECT_LT(Clock::now() - stopped_at, milliseconds(1500));  // no wait for expiry
  // The elector calls on_started_leading just after it starts leading.
  EXPECT_TRUE(Eventually([&] { return eb.started.load() == 1; }, milliseconds(3000)));
  lease = Lease();
  EXPECT_EQ(lease["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
  b.Stop();
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "");
}

TEST_F(LeaderElectionTest, TakesOverAnExpiredLeaseOnlyAfterItsDuration) {
  // A holder that died without releasing.
  const std::string old_time = FormatMicroTime(std::chrono::system_clock::now());
  Json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", "pstar-operator"}, {"namespace", "default"}}},
                {"spec",
                 {{"holderIdentity", "dead"},
                  {"leaseDurationSeconds", 2},
                  {"acquireTime", old_time},
                  {"renewTime", old_time},
                  {"leaseTransitions", 4}}}};
  ASSERT_TRUE(server_->client().Create(Leases(), "default", lease).ok());
  Events eb;
  LeaderElector b(*b_, FastConfig("b"), eb.Callbacks());
  auto start = Clock::now();
  b.Start();
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }, milliseconds(6000)));
  EXPECT_GE(Clock::now() - start, milliseconds(1900));  // waited out the lease duration
  Json now = Lease();
  EXPECT_EQ(now["spec"]["holderIdentity"], "b");
  EXPECT_EQ(now["spec"]["leaseTransitions"], 5);
}

TEST_F(LeaderElectionTest, StepsDownWhenRenewalFails) {
  Events ea;
  LeaderElector a(*a_, FastConfig("a"), ea.Callbacks());
  a.Start();
  ASSERT_TRUE(Eventually([&] { return a.IsLeader(); }, milliseconds(5000)));
  ASSERT_TRUE(server_->InjectFault("*", "/leases", 500, -1).ok());
  auto start = Clock::now();
  ASSERT_TRUE(Eventually([&] { return ea.stopped.load() == 1; }, milliseconds(5000)));
  EXPECT_FALSE(a.IsLeader());
  EXPECT_GE(Clock::now() - start, milliseconds(1000));  // tried until the renew deadline
  a.Stop();
  EXPECT_EQ(ea.stopped.load(), 1);
}

}  // namespace
}  // namespace pstar::op
