// KubeClient against the loopback fake API server: CRUD and conflicts, the
// status subresource, TLS verification, bearer tokens, paging, retries and
// watch streams.
#include "operator/kube/kube_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/operator/fake_api_server.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

using pstar::test::FakeApiServer;
using pstar::test::FakeApiServerOptions;
using pstar::test::TempDir;
using pstar::test::WriteText;
using Clock = std::chrono::steady_clock;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Json ConfigMap(const std::string& name, const Json& data = Json::object(), const Json& labels = Json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
          {"data", data}};
}

std::unique_ptr<FakeApiServer> StartServer(FakeApiServerOptions options = {}) {
  auto server = FakeApiServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status().message();
  return server.ok() ? std::move(*server) : nullptr;
}

std::unique_ptr<KubeClient> MakeClient(const KubeConfig& config, ClientOptions options = {}) {
  auto client = KubeClient::Create(config, options);
  EXPECT_TRUE(client.ok()) << client.status().message();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(KubeClientCreate, RejectsBadPems) {
  KubeConfig config;
  config.server = "https://127.0.0.1:1";
  config.ca_pem = "not a certificate";
  auto c = KubeClient::Create(config);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("certificate authority"), std::string::npos) << c.status().message();
  config.ca_pem = "";
  config.server = "ftp://x";
  EXPECT_FALSE(KubeClient::Create(config).ok());
}

TEST(KubeClientCreate, TransportErrorIsCodeZero) {
  KubeConfig config;
  config.server = "http://127.0.0.1:" + std::to_string(pstar::test::FreePort());
  ClientOptions options;
  options.max_retries = 1;
  options.retry_base_delay = std::chrono::milliseconds(10);
  auto client = MakeClient(config, options);
  ASSERT_NE(client, nullptr);
  ApiResponse r = client->Get(ConfigMaps(), "default", "x");
  EXPECT_EQ(r.code, 0);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(r.error.find('\n'), std::string::npos);
}

// A listener that accepts and never answers: a stalled API server.
class StalledServer {
 public:
  StalledServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ::listen(fd_, 64);  // connections wait in the backlog, unanswered
  }
  ~StalledServer() { ::close(fd_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1, port_ = 0;
};

// Shutdown cancels what is in flight (a list with retries, a watch) against
// a server that never answers, and fails what comes after at once.
TEST(KubeClientCreate, ShutdownEndsRequestsToAStalledServerAtOnce) {
  StalledServer stalled;
  KubeConfig config;
  config.server = stalled.url();
  ClientOptions options;
  options.request_timeout = std::chrono::seconds(30);
  options.max_retries = 3;  // 4 x 30 s if nothing cut them short
  auto client = MakeClient(config, options);
  ASSERT_NE(client, nullptr);
  ApiResponse listed, watched;
  std::thread list([&] { listed = client->List(ConfigMaps(), "default", {}); });
  std::thread watch([&] {
    std::atomic<bool> never{false};
    watched = client->Watch(ConfigMaps(), "default", {}, [](const WatchEvent&) { return true; }, &never);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto start = Clock::now();
  client->Shutdown();
  list.join();
  watch.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(listed.ok());
  EXPECT_FALSE(watched.ok() && watched.error.empty());
  const auto after = Clock::now();
  ApiResponse late = client->Get(ConfigMaps(), "default", "x");
  EXPECT_LT(Clock::now() - after, std::chrono::seconds(1));
  EXPECT_NE(late.error.find("shut down"), std::string::npos) << late.error;
}

// A server that answers every request with a header declaring 10^14 bytes
// of body, sends one byte of it and then stalls: the client refuses the
// response at once, naming the size, instead of waiting for the body.
TEST(KubeClientCreate, AnAbsurdContentLengthIsRefusedBeforeTheBody) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    std::vector<int> held;
    while (!stop) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) continue;
      char buf[4096];
      (void)!::recv(fd, buf, sizeof buf, 0);
      const std::string reply =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000000000\r\n\r\n{";
      (void)!::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
      held.push_back(fd);  // and never more
    }
    for (int fd : held) ::close(fd);
  });
  KubeConfig config;
  config.server = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  ClientOptions options;
  options.max_retries = 0;
  options.request_timeout = std::chrono::milliseconds(20000);
  auto client = MakeClient(config, options);
  ASSERT_NE(client, nullptr);
  const auto start = std::chrono::steady_clock::now();
  ApiResponse r = client->Get(ConfigMaps(), "default", "x");
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("declares 100000000000000 bytes, more than the 512 MiB"), std::string::npos) << r.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));  // not the 20 s timeout
  client.reset();
  stop = true;
  server.join();
  ::close(listener);
}

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    ASSERT_NE(server_, nullptr);
    client_ = MakeClient(server_->config());
    ASSERT_NE(client_, nullptr);
  }
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(KubeClientTest, CrudAndConflicts) {
  ApiResponse created = client_->Create(ConfigMaps(), "default", ConfigMap("cm1", {{"a", "1"}}));
  ASSERT_TRUE(created.ok()) << created.code << " " << created.error;
  EXPECT_EQ(created.code, 201);
  const std::string rv1 = created.body["metadata"]["resourceVersion"];

  ApiResponse again = client_->Create(ConfigMaps(), "default", ConfigMap("cm1"));
  EXPECT_TRUE(again.conflict());
  EXPECT_TRUE(again.already_exists()) << again.reason();
  EXPECT_FALSE(again.ToStatus("create").ok());

  ApiResponse got = client_->Get(ConfigMaps(), "default", "cm1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.body["data"]["a"], "1");

  Json updated = got.body;
  updated["data"]["a"] = "2";
  ApiResponse replaced = client_->Replace(ConfigMaps(), "default", updated);
  ASSERT_TRUE(replaced.ok()) << replaced.error;
  EXPECT_NE(replaced.body["metadata"]["resourceVersion"], rv1);

  // The same write with the old resourceVersion conflicts.
  updated["data"]["a"] = "3";
  ApiResponse stale = client_->Replace(ConfigMaps(), "default", updated);
  EXPECT_TRUE(stale.conflict());
  EXPECT_FALSE(stale.already_exists());
  EXPECT_EQ(stale.reason(), "Conflict");

  ApiResponse patched = client_->Patch(ConfigMaps(), "default", "cm1", {{"data", {{"b", "x"}}}}, PatchType::kMerge);
  ASSERT_TRUE(patched.ok()) << patched.error;
  EXPECT_EQ(patched.body["data"]["a"], "2");
  EXPECT_EQ(patched.body["data"]["b"], "x");

  ApiResponse json_patched = client_->Patch(ConfigMaps(), "default", "cm1",
                                            Json::array({{{"op", "replace"}, {"path", "/data/b"}, {"value", "y"}}}),
                                            PatchType::kJsonPatch);
  ASSERT_TRUE(json_patched.ok()) << json_patched.error;
  EXPECT_EQ(json_patched.body["data"]["b"], "y");

  DeleteOptions wrong_uid;
  wrong_uid.precondition_uid = "not-the-uid";
  EXPECT_TRUE(client_->Delete(ConfigMaps(), "default", "cm1", wrong_uid).conflict());
  ApiResponse deleted = client_->Delete(ConfigMaps(), "default", "cm1");
  EXPECT_TRUE(deleted.ok()) << deleted.error;
  ApiResponse missing = client_->Get(ConfigMaps(), "default", "cm1");
  EXPECT_TRUE(missing.not_found());
  EXPECT_EQ(missing.ToStatus("get").code(), StatusCode::kNotFound);
  EXPECT_TRUE(client_->Delete(ConfigMaps(), "default", "cm1").not_found());
}

TEST_F(KubeClientTest, StatusSubresource) {
  Json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "p1"}, {"namespace", "default"}}},
              {"spec", {{"containers", Json::array({{{"name", "c"}, {"image", "busybox"}}})}}}};
  ApiResponse created = client_->Create(Pods(), "default", pod);
  ASSERT_TRUE(created.ok()) << created.error;
  Json obj = created.body;
  obj["status"]["phase"] = "Running";
  obj["spec"]["containers"][0]["image"] = "changed";  // ignored by /status
  ApiResponse st = client_->ReplaceStatus(Pods(), "default", obj);
  ASSERT_TRUE(st.ok()) << st.error;
  ApiResponse got = client_->Get(Pods(), "default", "p1");
  EXPECT_EQ(got.body["status"]["phase"], "Running");
  EXPECT_EQ(got.body["spec"]["containers"][0]["image"], "busybox");
  // Stale resourceVersion on /status conflicts too.
  obj["status"]["phase"] = "Failed";
  EXPECT_TRUE(client_->ReplaceStatus(Pods(), "default", obj).conflict());
  ApiResponse merge = client_->Patch(Pods(), "default", "p1", {{"status", {{"phase", "Succeeded"}}}},
                                     PatchType::kMerge, "status");
  ASSERT_TRUE(merge.ok()) << merge.error;
  EXPECT_EQ(merge.body["status"]["phase"], "Succeeded");
}

TEST_F(KubeClientTest, ListAllPagesAndSelects) {
  for (int i = 0; i < 23; ++i) {
    Json labels = {{"group", i % 2 == 0 ? "even" : "odd"}};
    ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("cm-" + std::to_string(i), {}, labels)).ok());
  }
  ListOptions one_page;
  one_page.limit = 5;
  ApiResponse page = client_->List(ConfigMaps(), "default", one_page);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page.body["items"].size(), 5u);
  EXPECT_FALSE(page.body["metadata"].value("continue", "").empty());

  auto all = client_->ListAll(ConfigMaps(), "default", {}, 5);
  ASSERT_TRUE(all.ok()) << all.status().message();
  std::set<std::string> names;
  for (const auto& item : all->first) names.insert(item["metadata"]["name"]);
  EXPECT_EQ(names.size(), 23u);
  EXPECT_FALSE(all->second.empty());

  ListOptions even;
  even.label_selector = "group=even";
  auto evens = client_->ListAll(ConfigMaps(), "", even, 4);  // all namespaces
  ASSERT_TRUE(evens.ok());
  EXPECT_EQ(evens->first.size(), 12u);
}

TEST_F(KubeClientTest, ListAllRestartsWhenTheContinueTokenExpires) {
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("c" + std::to_string(i))).ok());
  // The second page gets a 410 once: the list restarts and still completes.
  ASSERT_TRUE(server_->InjectFault("GET", "continue=", 410, 1).ok());
  auto all = client_->ListAll(ConfigMaps(), "default", {}, 3);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->first.size(), 10u);
}

TEST_F(KubeClientTest, ReadsRetryWritesDoNot) {
  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("r")).ok());
  ASSERT_TRUE(server_->InjectFault("GET", "/configmaps/r", 503, 2).ok());
  ClientOptions options;
  options.retry_base_delay = std::chrono::milliseconds(10);
  auto client = MakeClient(server_->config(), options);
  EXPECT_TRUE(client->Get(ConfigMaps(), "default", "r").ok());

  // 429 with Retry-After: 1 is honoured.
  ASSERT_TRUE(server_->Post("/fake/faults", {{"method", "GET"}, {"path", "/configmaps/r"}, {"status", 429},
                                             {"count", 1}, {"retryAfterSeconds", 1}}).ok());
  auto start = Clock::now();
  EXPECT_TRUE(client->Get(ConfigMaps(), "default", "r").ok());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(900));

  ASSERT_TRUE(server_->InjectFault("POST", "/configmaps", 500, 1).ok());
  ApiResponse failed = client->Create(ConfigMaps(), "default", ConfigMap("w"));
  EXPECT_EQ(failed.code, 500);
  EXPECT_EQ(failed.error, "injected fault");
  EXPECT_TRUE(client->Create(ConfigMaps(), "default", ConfigMap("w")).ok());
}

TEST_F(KubeClientTest, ConcurrentRequests) {
  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("shared")).ok());
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        if (client_->Get(ConfigMaps(), "default", "shared").ok()) ++ok;
        if (client_->Create(ConfigMaps(), "default", ConfigMap("t" + std::to_string(t) + "-" + std::to_string(i))).ok())
          ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 120);
}

TEST_F(KubeClientTest, ClientSideRateLimit) {
  ClientOptions options;
  options.qps = 20;
  options.burst = 2;
  auto client = MakeClient(server_->config(), options);
  auto start = Clock::now();
  for (int i = 0; i < 12; ++i) EXPECT_TRUE(client->Get(ConfigMaps(), "default", "x").not_found());
  // Two from the burst, then ten at 20/s.
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(450));
}

TEST_F(KubeClientTest, WatchSeesEventsAndBookmarks) {
  auto listed = client_->ListAll(ConfigMaps(), "default", {});
  ASSERT_TRUE(listed.ok());
  std::mutex mu;
  std::vector<std::string> types;
  std::atomic<bool> stop{false};
  ApiResponse end;
  std::thread watcher([&] {
    WatchOptions wo;
    wo.resource_version = listed->second;
    wo.timeout_seconds = 60;
    end = client_->Watch(ConfigMaps(), "default", wo,
                         [&](const WatchEvent& ev) {
                           std::lock_guard<std::mutex> lock(mu);
                           types.push_back(ev.type + ":" + ev.object["metadata"].value("name", ""));
                           return true;
                         },
                         &stop);
  });
  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("w1")).ok());
  ASSERT_TRUE(client_->Patch(ConfigMaps(), "default", "w1", {{"data", {{"k", "v"}}}}, PatchType::kMerge).ok());
  ASSERT_TRUE(client_->Delete(ConfigMaps(), "default", "w1").ok());
  auto deadline = Clock::now() + std::chrono::seconds(10);
  auto has = [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(types.begin(), types.end(), s) != types.end();
  };
  while (Clock::now() < deadline && !(has("DELETED:w1") && has("BOOKMARK:"))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto stop_at = Clock::now();
  stop = true;
  watcher.join();
  EXPECT_LT(Clock::now() - stop_at, std::chrono::milliseconds(1500));  // Stop is prompt
  EXPECT_EQ(end.code, 200);
  EXPECT_TRUE(has("ADDED:w1"));
  EXPECT_TRUE(has("MODIFIED:w1"));
  EXPECT_TRUE(has("DELETED:w1"));
  EXPECT_TRUE(has("BOOKMARK:"));
}

TEST_F(KubeClientTest, WatchEndsAtServerTimeoutAndOnCallbackFalse) {
  WatchOptions wo;
  wo.timeout_seconds = 1;
  wo.allow_bookmarks = false;
  auto start = Clock::now();
  ApiResponse end = client_->Watch(ConfigMaps(), "default", wo, [](const WatchEvent&) { return true; }, nullptr);
  EXPECT_EQ(end.code, 200) << end.error;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));

  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("x")).ok());
  wo.timeout_seconds = 60;
  int seen = 0;
  end = client_->Watch(ConfigMaps(), "default", wo, [&](const WatchEvent&) { return ++seen < 1; }, nullptr);
  EXPECT_EQ(end.code, 200);
  EXPECT_EQ(seen, 1);  // the initial ADDED, then the callback ended it
}

// A watch outlives the client's request timeout: it runs until the server's
// timeoutSeconds, even with no traffic at all on the stream.
TEST_F(KubeClientTest, WatchIsNotCutByTheRequestTimeout) {
  ClientOptions options;
  options.request_timeout = std::chrono::milliseconds(500);
  auto client = MakeClient(server_->config(), options);
  WatchOptions wo;
  wo.timeout_seconds = 3;
  wo.allow_bookmarks = false;
  wo.resource_version = client->List(ConfigMaps(), "default", {}).body["metadata"]["resourceVersion"];
  auto start = Clock::now();
  ApiResponse end = client->Watch(ConfigMaps(), "default", wo, [](const WatchEvent&) { return true; }, nullptr);
  EXPECT_EQ(end.code, 200) << end.error;
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(2800));
}

TEST_F(KubeClientTest, WatchFromACompactedVersionIsGone) {
  ApiResponse first = client_->Create(ConfigMaps(), "default", ConfigMap("old"));
  ASSERT_TRUE(first.ok());
  const std::string old_rv = first.body["metadata"]["resourceVersion"];
  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("newer")).ok());
  ASSERT_TRUE(server_->Compact().ok());
  ASSERT_TRUE(client_->Create(ConfigMaps(), "default", ConfigMap("newest")).ok());
  WatchOptions wo;
  wo.resource_version = old_rv;
  wo.timeout_seconds = 30;
  ApiResponse end = client_->Watch(ConfigMaps(), "default", wo, [](const WatchEvent&) { return true; }, nullptr);
  EXPECT_EQ(end.code, 410) << end.error;
  EXPECT_TRUE(end.gone());
}

TEST_F(KubeClientTest, WatchErrorStatusIsReturned) {
  ASSERT_TRUE(server_->InjectFault("GET", "watch=true", 500, 1).ok());
  WatchOptions wo;
  wo.timeout_seconds = 5;
  ApiResponse end = client_->Watch(ConfigMaps(), "default", wo, [](const WatchEvent&) { return true; }, nullptr);
  EXPECT_EQ(end.code, 500);
  EXPECT_EQ(end.error, "injected fault");
}

TEST_F(KubeClientTest, TokenIsRequired) {
  KubeConfig no_token = server_->config();
  no_token.token.clear();
  EXPECT_EQ(MakeClient(no_token)->Get(ConfigMaps(), "default", "x").code, 401);
  KubeConfig wrong = server_->config();
  wrong.token = "wrong";
  EXPECT_EQ(MakeClient(wrong)->Get(ConfigMaps(), "default", "x").code, 401);

  // A token file is re-read when it changes (rotation).
  TempDir dir("token");
  KubeConfig from_file = server_->config();
  from_file.token.clear();
  from_file.token_file = dir.path() + "/token";
  WriteText(from_file.token_file, "stale\n");
  auto client = MakeClient(from_file);
  EXPECT_EQ(client->Get(ConfigMaps(), "default", "x").code, 401);
  WriteText(from_file.token_file, server_->token() + "\n");
  EXPECT_EQ(client->Get(ConfigMaps(), "default", "x").code, 404);  // authenticated now
}

TEST_F(KubeClientTest, TlsVerifiesTheServer) {
  // The right CA (from the kubeconfig) works; see SetUp and every test above.
  EXPECT_EQ(client_->Get(ConfigMaps(), "default", "x").code, 404);
  EXPECT_EQ(server_->config().ca_pem, ReadAll(server_->tls_dir() + "/ca.crt"));

  // Another CA: the handshake fails, no response.
  TempDir other("other-ca");
  auto r = pstar::test::RunProcess({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", other.path() + "/k",
                                    "-out", other.path() + "/c", "-days", "1", "-subj", "/CN=other"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  KubeConfig wrong_ca = server_->config();
  wrong_ca.ca_pem = ReadAll(other.path() + "/c");
  ClientOptions no_retry;
  no_retry.max_retries = 0;
  ApiResponse bad = MakeClient(wrong_ca, no_retry)->Get(ConfigMaps(), "default", "x");
  EXPECT_EQ(bad.code, 0);
  EXPECT_FALSE(bad.error.empty());

  // A client certificate is loaded (the fake server does not ask for one, so
  // requests still succeed); a key that is not PEM is rejected up front.
  KubeConfig with_cert = server_->config();
  with_cert.client_cert_pem = ReadAll(other.path() + "/c");
  with_cert.client_key_pem = ReadAll(other.path() + "/k");
  EXPECT_EQ(MakeClient(with_cert, no_retry)->Get(ConfigMaps(), "default", "x").code, 404);
  with_cert.client_key_pem = "garbage";
  auto bad_key = KubeClient::Create(with_cert);
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("client key"), std::string::npos);

  // No CA at all: the system roots do not know the fake CA either.
  KubeConfig system_roots = server_->config();
  system_roots.ca_pem.clear();
  EXPECT_EQ(MakeClient(system_roots, no_retry)->Get(ConfigMaps(), "default", "x").code, 0);

  // Unless the kubeconfig says to skip verification.
  wrong_ca.insecure_skip_tls_verify = true;
  EXPECT_EQ(MakeClient(wrong_ca, no_retry)->Get(ConfigMaps(), "default", "x").code, 404);

  // "localhost" is in the certificate too.
  KubeConfig by_name = server_->config();
  by_name.server = "https://localhost:" + std::to_string(server_->port());
  EXPECT_EQ(MakeClient(by_name, no_retry)->Get(ConfigMaps(), "default", "x").code, 404);
}

// The certificate names 127.0.0.1 and localhost; a server reached as
// 127.0.0.2 fails hostname verification even with the right CA.
TEST(KubeClientTls, VerifiesTheHostname) {
  FakeApiServerOptions options;
  options.extra_args = {"--address", "127.0.0.2"};
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  ClientOptions no_retry;
  no_retry.max_retries = 0;
  KubeConfig config = server->config();
  ASSERT_NE(config.server.find("127.0.0.2"), std::string::npos) << config.server;
  ApiResponse r = MakeClient(config, no_retry)->Get(ConfigMaps(), "default", "x");
  EXPECT_EQ(r.code, 0);
  config.insecure_skip_tls_verify = true;
  EXPECT_EQ(MakeClient(config, no_retry)->Get(ConfigMaps(), "default", "x").code, 404);
}

TEST(KubeClientPlain, HttpWithoutTlsOrToken) {
  FakeApiServerOptions options;
  options.tls = false;
  options.token = "";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto client = MakeClient(server->config());
  EXPECT_EQ(client->Get(ConfigMaps(), "default", "x").code, 404);
  EXPECT_TRUE(client->Create(ConfigMaps(), "default", ConfigMap("plain")).ok());
}

}  // namespace
}  // namespace pstar::op
