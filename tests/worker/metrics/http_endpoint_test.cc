#include "worker/metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "tests/test_util.h"

namespace pstar {
namespace {

std::unique_ptr<HttpEndpoint> StartOnLoopback() {
  auto e = HttpEndpoint::Start("127.0.0.1", 0, {{"/metrics", [] { return HttpEndpoint::Reply{200, "up 1\n"}; }},
                                               {"/healthz", [] { return HttpEndpoint::Reply{503, "not yet\n"}; }}});
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// A client that connects and then says nothing.
int ConnectSilently(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

TEST(HttpEndpoint, ServesThePathAndRefusesTheRest) {
  auto e = StartOnLoopback();
  auto ok = test::HttpGet(e->port(), "/metrics?x=1");
  ASSERT_TRUE(ok.ok) << ok.error;
  EXPECT_EQ(ok.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(ok.body, "up 1\n");
  auto missing = test::HttpGet(e->port(), "/other");
  ASSERT_TRUE(missing.ok) << missing.error;
  EXPECT_EQ(missing.status_line, "HTTP/1.1 404 Not Found");
  EXPECT_NE(missing.body.find("/healthz"), std::string::npos) << missing.body;
  auto unhealthy = test::HttpGet(e->port(), "/healthz");
  ASSERT_TRUE(unhealthy.ok) << unhealthy.error;
  EXPECT_EQ(unhealthy.status_line, "HTTP/1.1 503 Error");
  EXPECT_EQ(unhealthy.body, "not yet\n");
}

TEST(HttpEndpoint, StalledClientsDelayNeitherScrapesNorShutdown) {
  auto e = StartOnLoopback();
  // Stalled clients, one with half a request: each holds only its own slot,
  // so scrapes are answered before any stalled request's 5 s deadline.
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) stalled.push_back(ConnectSilently(e->port()));
  ASSERT_EQ(::send(stalled[0], "GET /metr", 9, MSG_NOSIGNAL), 9);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    auto r = test::HttpGet(e->port(), "/metrics");
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.body, "up 1\n");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  // Stopping closes the connections in progress at once.
  start = std::chrono::steady_clock::now();
  e.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  for (int fd : stalled) ::close(fd);
}

TEST(HttpEndpoint, ABusyPortFailsNamingAddressAndPort) {
  auto first = StartOnLoopback();
  auto second = HttpEndpoint::Start("127.0.0.1", first->port(), {{"/metrics", [] { return HttpEndpoint::Reply{}; }}});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(first->port())), std::string::npos)
      << second.status().message();
}

}  // namespace
}  // namespace pstar
