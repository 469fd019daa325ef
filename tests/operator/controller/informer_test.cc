// Informer against the fake API server: initial paged sync, event delivery,
// the label index, and convergence after dropped watches, compaction (410
// relist with deletes that happened while the watch was down) and faults.
#include "operator/controller/informer.h"

#include <thread>

#include <gtest/gtest.h>

#include "tests/operator/fake_api_server.h"

namespace pstar::op {
namespace {

using pstar::test::FakeApiServer;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kJobLabel[] = "patrickstar.io/job-name";

Json ConfigMap(const std::string& name, const std::string& job, const std::string& ns = "default") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{kJobLabel, job}, {"app", "pstar"}}}}},
          {"data", Json::object()}};
}

// Records what the handlers saw.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> events;  // "add:ns/name", "update:ns/name", "delete:ns/name"
  InformerHandlers Handlers() {
    return {[this](const ObjectPtr& o) { Record("add", *o); },
            [this](const ObjectPtr& old_obj, const ObjectPtr& o) {
              EXPECT_NE((*old_obj)["metadata"]["resourceVersion"], (*o)["metadata"]["resourceVersion"]);
              Record("update", *o);
            },
            [this](const ObjectPtr& o) { Record("delete", *o); }};
  }
  void Record(const std::string& what, const Json& obj) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(what + ":" + ObjectKey(obj));
  }
  int Count(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(std::count(events.begin(), events.end(), event));
  }
  int CountPrefix(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(std::count_if(events.begin(), events.end(),
                                          [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }));
  }
};

template <typename F>
bool Eventually(F condition, milliseconds timeout = milliseconds(15000)) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return condition();
}

InformerOptions TestOptions() {
  InformerOptions o;
  o.label_selector = "app=pstar";
  o.index_label = kJobLabel;
  o.page_size = 3;
  o.min_watch_timeout_seconds = 20;
  o.max_watch_timeout_seconds = 30;
  o.initial_backoff = milliseconds(50);
  o.max_backoff = milliseconds(400);
  return o;
}

class InformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = FakeApiServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().message();
    server_ = std::move(*server);
    auto client = KubeClient::Create(server_->config());
    ASSERT_TRUE(client.ok()) << client.status().message();
    client_ = std::move(*client);
  }
  KubeClient& c() { return *client_; }
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(InformerTest, SyncsAndDeliversEvents) {
  for (int i = 0; i < 7; ++i)
    ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("cm" + std::to_string(i), i < 4 ? "j1" : "j2")).ok());
  ASSERT_TRUE(c().Create(ConfigMaps(), "pstar", ConfigMap("other-ns", "j1", "pstar")).ok());
  Json unlabeled = ConfigMap("unlabeled", "j1");
  unlabeled["metadata"]["labels"].erase("app");
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", unlabeled).ok());

  Informer informer(c(), ConfigMaps(), "", TestOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  EXPECT_FALSE(informer.HasSynced());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(milliseconds(10000)));
  EXPECT_EQ(informer.Size(), 8u);  // the selector leaves out "unlabeled"
  EXPECT_EQ(rec.CountPrefix("add:"), 8);
  EXPECT_EQ(informer.Get("default", "unlabeled"), nullptr);
  ASSERT_NE(informer.Get("default", "cm0"), nullptr);
  EXPECT_EQ(informer.ListNamespace("default").size(), 7u);
  EXPECT_EQ(informer.ListNamespace("pstar").size(), 1u);
  EXPECT_EQ(informer.ListByLabel("default", kJobLabel, "j1").size(), 4u);
  EXPECT_EQ(informer.ListByLabel("", kJobLabel, "j1").size(), 5u);
  EXPECT_EQ(informer.ListByLabel("default", "app", "pstar").size(), 7u);  // unindexed key: a scan

  ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("new", "j1")).ok());
  ASSERT_TRUE(c().Patch(ConfigMaps(), "default", "cm0", {{"data", {{"k", "v"}}}}, PatchType::kMerge).ok());
  // Moving cm1 to job j3 updates the index.
  ASSERT_TRUE(c().Patch(ConfigMaps(), "default", "cm1", {{"metadata", {{"labels", {{kJobLabel, "j3"}}}}}},
                        PatchType::kMerge).ok());
  ASSERT_TRUE(c().Delete(ConfigMaps(), "default", "cm6").ok());
  ASSERT_TRUE(Eventually([&] { return rec.Count("delete:default/cm6") == 1; }));
  EXPECT_EQ(rec.Count("add:default/new"), 1);
  EXPECT_EQ(rec.Count("update:default/cm0"), 1);
  EXPECT_EQ(rec.Count("update:default/cm1"), 1);
  EXPECT_EQ((*informer.Get("default", "cm0"))["data"]["k"], "v");
  EXPECT_EQ(informer.Get("default", "cm6"), nullptr);
  EXPECT_EQ(informer.ListByLabel("default", kJobLabel, "j1").size(), 4u);  // cm0, cm2, cm3, new
  EXPECT_EQ(informer.ListByLabel("default", kJobLabel, "j3").size(), 1u);
  EXPECT_GE(informer.events_received.load(), 4);
  // Bookmarks move the resourceVersion without delivering anything.
  std::string rv = informer.LastResourceVersion();
  ASSERT_TRUE(c().Create(ConfigMaps(), "kube-system", {{"metadata", {{"name", "unrelated"}}}}).ok());
  EXPECT_TRUE(Eventually([&] { return informer.LastResourceVersion() != rv; }, milliseconds(5000)));
  EXPECT_EQ(informer.Size(), 8u);
  auto stop_at = Clock::now();
  informer.Stop();
  EXPECT_LT(Clock::now() - stop_at, milliseconds(1500));
}

// The transform shapes what is cached and delivered, from the list and the watch alike.
TEST_F(InformerTest, TheTransformShapesEveryCachedObject) {
  Json listed = ConfigMap("listed", "j");
  listed["data"] = {{"big", std::string(4096, 'x')}};
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", listed).ok());
  InformerOptions o = TestOptions();
  o.transform = [](Json* object) {
    object->erase("data");
    (*object)["metadata"]["annotations"]["transformed"] = "yes";
  };
  Informer informer(c(), ConfigMaps(), "default", o);
  std::mutex mu;
  std::vector<Json> delivered;
  informer.AddHandlers({[&](const ObjectPtr& obj) {
                          std::lock_guard<std::mutex> lock(mu);
                          delivered.push_back(*obj);
                        },
                        nullptr, nullptr});
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(milliseconds(10000)));
  Json watched = ConfigMap("watched", "j");
  watched["data"] = {{"big", std::string(4096, 'y')}};
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", watched).ok());
  ASSERT_TRUE(Eventually([&] { return informer.Size() == 2; }));
  for (const char* name : {"listed", "watched"}) {
    ObjectPtr cached = informer.Get("default", name);
    ASSERT_NE(cached, nullptr) << name;
    EXPECT_FALSE(cached->contains("data")) << name;
    EXPECT_EQ((*cached)["metadata"]["annotations"]["transformed"], "yes") << name;
  }
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return delivered.size() == 2;
  }));
  std::lock_guard<std::mutex> lock(mu);
  for (const Json& obj : delivered) EXPECT_FALSE(obj.contains("data")) << obj.dump();
}

TEST_F(InformerTest, ConvergesAfterDroppedWatches) {
  Informer informer(c(), ConfigMaps(), "default", TestOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(milliseconds(10000)));
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Eventually([&] { return server_->Stats().value("open_watches", 0) >= 1; }));
    ASSERT_TRUE(server_->DropWatches().ok());
    ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("r" + std::to_string(round), "j")).ok());
  }
  ASSERT_TRUE(Eventually([&] { return informer.Size() == 3; }));
  EXPECT_GE(informer.watch_restarts.load(), 2);
  EXPECT_EQ(informer.relists.load(), 0);  // resumed from the last resourceVersion, no relist
  EXPECT_EQ(rec.CountPrefix("add:"), 3);
}

TEST_F(InformerTest, RelistsAfterCompactionAndSeesDeletesMissedWhileDown) {
  for (const char* name : {"keep", "change", "remove"})
    ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap(name, "j")).ok());
  Informer informer(c(), ConfigMaps(), "default", TestOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(milliseconds(10000)));
  ASSERT_TRUE(Eventually([&] { return server_->Stats().value("open_watches", 0) >= 1; }));

  // Take the watch down and keep it down while things change.
  ASSERT_TRUE(server_->InjectFault("GET", "watch=true", 503, -1).ok());
  ASSERT_TRUE(server_->DropWatches().ok());
  ASSERT_TRUE(c().Delete(ConfigMaps(), "default", "remove").ok());
  ASSERT_TRUE(c().Patch(ConfigMaps(), "default", "change", {{"data", {{"x", "1"}}}}, PatchType::kMerge).ok());
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("added", "j")).ok());
  ASSERT_TRUE(server_->Compact().ok());
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(informer.Size(), 3u);  // still the old view
  ASSERT_TRUE(server_->client().Raw("DELETE", "/fake/faults").ok());

  ASSERT_TRUE(Eventually([&] { return rec.Count("delete:default/remove") == 1; }));
  ASSERT_TRUE(Eventually([&] { return informer.Size() == 3 && informer.Get("default", "added") != nullptr; }));
  EXPECT_EQ(rec.Count("update:default/change"), 1);
  EXPECT_EQ(rec.Count("add:default/added"), 1);
  EXPECT_EQ(rec.Count("update:default/keep"), 0);  // unchanged objects are not re-delivered
  EXPECT_GE(informer.relists.load(), 1);
  EXPECT_EQ((*informer.Get("default", "change"))["data"]["x"], "1");

  // And it keeps watching afterwards.
  ASSERT_TRUE(c().Delete(ConfigMaps(), "default", "keep").ok());
  EXPECT_TRUE(Eventually([&] { return rec.Count("delete:default/keep") == 1; }));
}

TEST_F(InformerTest, KeepsGoingThroughInjectedErrors) {
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("a", "j")).ok());
  // The first LISTs and WATCHes fail.
  ASSERT_TRUE(server_->InjectFault("GET", "^/api/v1/namespaces/default/configmaps\\?(?!watch)", 500, 3).ok());
  ASSERT_TRUE(server_->InjectFault("GET", "watch=true", 500, 3).ok());
  ClientOptions no_retry;
  no_retry.max_retries = 0;  // let the informer's own backoff handle it
  auto client = KubeClient::Create(server_->config(), no_retry);
  ASSERT_TRUE(client.ok());
  Informer informer(**client, ConfigMaps(), "default", TestOptions());
  Recorder rec;
  informer.AddHandlers(rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(milliseconds(15000)));
  EXPECT_GE(informer.relists.load(), 3);  // failed attempts count as relists
  ASSERT_TRUE(c().Create(ConfigMaps(), "default", ConfigMap("b", "j")).ok());
  EXPECT_TRUE(Eventually([&] { return informer.Size() == 2; }));
  EXPECT_GE(informer.watch_restarts.load(), 3);
  EXPECT_EQ(rec.CountPrefix("add:"), 2);
}

}  // namespace
}  // namespace pstar::op
