#include "worker/dist/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace pstar {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

StoreOptions Options(int port, int rank, int world, milliseconds timeout = milliseconds(10000),
                     const std::string& id = "test") {
  StoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rdzv_id = id;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

std::unique_ptr<Store> MustConnect(const StoreOptions& o) {
  auto s = Store::Connect(o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(Store, SetGetAddWaitAcrossRanksWithRankZeroStartingLast) {
  const int port = test::FreePort();
  constexpr int kWorld = 3, kAdds = 50;
  std::vector<std::unique_ptr<Store>> stores(kWorld);
  // Ranks 1 and 2 start first and retry until rank 0 hosts the server.
  std::vector<std::thread> clients;
  for (int r = 1; r < kWorld; ++r) {
    clients.emplace_back([&, r] { stores[size_t(r)] = MustConnect(Options(port, r, kWorld)); });
  }
  std::this_thread::sleep_for(milliseconds(200));
  stores[0] = MustConnect(Options(port, 0, kWorld));
  for (auto& t : clients) t.join();
  for (const auto& s : stores) ASSERT_NE(s, nullptr);
  EXPECT_EQ(stores[1]->local_address(), "127.0.0.1");

  // Wait and Get block until another rank sets the key.
  std::thread late_setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(stores[2]->Set("late", "value of late").ok());
  });
  EXPECT_TRUE(stores[1]->Wait({"late"}).ok());
  auto v = stores[0]->Get("late");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(*v, "value of late");
  late_setter.join();

  // Binary values survive the round trip; Set overwrites.
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(stores[1]->Set("bin", "first").ok());
  ASSERT_TRUE(stores[1]->Set("bin", binary).ok());
  EXPECT_EQ(*stores[2]->Get("bin"), binary);

  // Add is atomic across ranks adding concurrently.
  std::vector<std::thread> adders;
  for (int r = 0; r < kWorld; ++r) {
    adders.emplace_back([&, r] {
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(stores[size_t(r)]->Add("counter", 2).ok());
    });
  }
  for (auto& t : adders) t.join();
  auto total = stores[0]->Add("counter", 0);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, 2 * kWorld * kAdds);
  EXPECT_EQ(*stores[1]->Get("counter"), std::to_string(2 * kWorld * kAdds));
  auto not_a_number = stores[0]->Add("bin", 1);
  EXPECT_FALSE(not_a_number.ok());

  // Rank 0 stops serving once the others have disconnected.
  const auto start = Clock::now();
  std::thread leave([&] {
    std::this_thread::sleep_for(milliseconds(100));
    for (int r = 1; r < kWorld; ++r) stores[size_t(r)].reset();
  });
  stores[0].reset();
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  leave.join();
}

TEST(Store, GetOfAMissingKeyTimesOutNamingTheKeyAndServer) {
  const int port = test::FreePort();
  auto store = MustConnect(Options(port, 0, 1));
  ASSERT_NE(store, nullptr);
  const auto start = Clock::now();
  auto v = store->Get("missing", milliseconds(300));
  const auto took = Clock::now() - start;
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message(), "rendezvous store at 127.0.0.1:" + std::to_string(port) +
                                      ": key 'missing' was not set within 300 ms");
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, milliseconds(2000));
  Status w = store->Wait({"missing", "also"}, milliseconds(100));
  EXPECT_NE(w.message().find("key 'missing' was not set within 100 ms"), std::string::npos) << w.message();
  // The connection is still usable after a timeout.
  EXPECT_TRUE(store->Set("missing", "now").ok());
  EXPECT_EQ(*store->Get("missing"), "now");
}

TEST(Store, NobodyListeningFailsAfterTheTimeoutNamingHostAndPort) {
  const int port = test::FreePort();
  const auto start = Clock::now();
  auto s = Store::Connect(Options(port, 1, 2, milliseconds(1500)));
  const auto took = Clock::now() - start;
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "rendezvous with 127.0.0.1:" + std::to_string(port) + " failed after 1.5 s: connection refused");
  EXPECT_GE(took, milliseconds(1000));
  EXPECT_LT(took, milliseconds(3000));
}

TEST(Store, RendezvousIdsKeepJobsApart) {
  const int port = test::FreePort();
  auto a = MustConnect(Options(port, 0, 2, milliseconds(10000), "job-a"));
  auto b = MustConnect(Options(port, 1, 2, milliseconds(10000), "job-b"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Set("k", "from a").ok());
  EXPECT_FALSE(b->Get("k", milliseconds(100)).ok());
  ASSERT_TRUE(b->Set("k", "from b").ok());
  EXPECT_EQ(*a->Get("k"), "from a");
  EXPECT_EQ(*b->Get("k"), "from b");
  EXPECT_EQ(*a->Add("n", 1), 1);
  EXPECT_EQ(*b->Add("n", 1), 1);
}

TEST(Store, BadOptionsAndOversizedValuesAreRefused) {
  const int port = test::FreePort();
  EXPECT_EQ(Store::Connect(Options(port, 2, 2)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Store::Connect(Options(0, 0, 1)).status().code(), StatusCode::kInvalidArgument);
  auto store = MustConnect(Options(port, 0, 1));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Set("big", std::string(kStoreMaxValueBytes + 1, 'x')).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set(std::string(kStoreMaxKeyBytes, 'k'), "v").code(), StatusCode::kInvalidArgument);
  // A second server on the same port cannot start.
  auto again = Store::Connect(Options(port, 0, 1, milliseconds(500)));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("port " + std::to_string(port)), std::string::npos)
      << again.status().message();
}

TEST(Store, ServerDropsGarbageAndKeepsServing) {
  const int port = test::FreePort();
  auto store = MustConnect(Options(port, 0, 1));
  ASSERT_NE(store, nullptr);
  // A client announcing a 4 GiB frame is disconnected; nothing is allocated.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(::send(fd, huge, 4, MSG_NOSIGNAL), 4);
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);  // closed by the server
  ::close(fd);
  EXPECT_TRUE(store->Set("still", "works").ok());
  EXPECT_EQ(*store->Get("still"), "works");
}

int ConnectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// A field of /proc/self/status ("Threads", "VmRSS" in kB).
int64_t ProcStatus(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// What a peer that is not a rank can make the server hold is bounded:
// connections that come and go leave no threads behind, connections that
// announce 16 MiB frames and send nothing reserve nothing, and keys and
// values together stay within kMaxStoreBytes.
TEST(Store, APeerOnTheNetworkCannotExhaustTheServer) {
  const int port = test::FreePort();
  auto store = MustConnect(Options(port, 0, 1));
  ASSERT_NE(store, nullptr);
  const int64_t threads_before = ProcStatus("Threads"), vm_before = ProcStatus("VmSize");
  for (int i = 0; i < 500; ++i) ::close(ConnectTo(port));
  EXPECT_TRUE(store->Set("after", "churn").ok());  // the server is still there...
  // ...and the connections' threads end with them, their 8 MiB stacks
  // unmapped (kept, 500 of them would be 4 GiB of address space; malloc's
  // per-thread arenas may reserve up to about 1 GiB on their own).
  bool settled = false;
  for (int i = 0; i < 100 && !settled; ++i) {
    settled = ProcStatus("Threads") <= threads_before + 2 && ProcStatus("VmSize") - vm_before < 2 * 1024 * 1024;
    if (!settled) std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(settled) << ProcStatus("Threads") << " threads (" << threads_before << " before), VmSize grew "
                       << ProcStatus("VmSize") - vm_before << " kB";

  const int64_t rss_before = ProcStatus("VmRSS");
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    idle.push_back(ConnectTo(port));
    const uint32_t n = uint32_t(kStoreMaxValueBytes);  // within the frame limit, then nothing
    unsigned char prefix[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
    ASSERT_EQ(::send(idle.back(), prefix, 4, MSG_NOSIGNAL), 4);
  }
  EXPECT_TRUE(store->Set("while", "idle").ok());
  EXPECT_LT(ProcStatus("VmRSS") - rss_before, 64 * 1024) << "kB grown for 40 announced 16 MiB frames";
  for (int fd : idle) ::close(fd);

  const std::string value(kStoreMaxValueBytes - 64, 'v');
  Status full = Status::Ok();
  for (size_t i = 0; i <= kMaxStoreBytes / value.size() && full.ok(); ++i) full = store->Set("big" + std::to_string(i), value);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("the store is full (256 MiB of keys and values)"), std::string::npos) << full.message();
  EXPECT_TRUE(store->Set("big0", "small again").ok());  // replacing frees room
  EXPECT_TRUE(store->Set("one-more", "fits").ok());
}

TEST(Store, APeerThatHangsUpWhileWaitingFreesItsThread) {
  const int port = test::FreePort();
  auto store = MustConnect(Options(port, 0, 1));
  ASSERT_NE(store, nullptr);
  const int64_t threads_before = ProcStatus("Threads");
  // Hello (no token), then Gets and Waits of keys nobody sets, each for an
  // hour, from peers that then go away.
  const auto str = [](const std::string& v) {
    std::string out(4, '\0');
    for (int i = 0; i < 4; ++i) out[size_t(i)] = char((v.size() >> (8 * i)) & 0xff);
    return out + v;
  };
  const auto frame = [&](const std::string& payload) { return str(payload); };
  const std::string hour = [] {
    std::string b(8, '\0');
    const int64_t ms = 3600 * 1000;
    for (int i = 0; i < 8; ++i) b[size_t(i)] = char((uint64_t(ms) >> (8 * i)) & 0xff);
    return b;
  }();
  std::vector<int> peers;
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectTo(port);
    std::string bytes = frame(std::string(1, char(1)) + str("pstar-store/1"));
    bytes += i % 2 == 0 ? frame(std::string(1, char(3)) + str("never") + hour)
                        : frame(std::string(1, char(5)) + std::string("\x01\0\0\0", 4) + str("never") + hour);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    peers.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_GE(ProcStatus("Threads"), threads_before + 20) << "each waiting peer has its thread";
  for (int fd : peers) ::close(fd);
  bool settled = false;
  for (int i = 0; i < 100 && !settled; ++i) {
    settled = ProcStatus("Threads") <= threads_before + 2;
    if (!settled) std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(settled) << ProcStatus("Threads") << " threads (" << threads_before << " before): "
                       << "the waits outlived their peers";
  EXPECT_TRUE(store->Set("never", "now").ok());
}

StoreOptions WithToken(StoreOptions o, const std::string& token) {
  o.token = token;
  return o;
}

// Reads one reply frame; empty when the connection closed first.
std::string ReadFrame(int fd) {
  unsigned char header[4];
  size_t got = 0;
  while (got < 4) {
    const ssize_t n = ::recv(fd, header + got, 4 - got, 0);
    if (n <= 0) return "";
    got += size_t(n);
  }
  const uint32_t len = uint32_t(header[0]) | uint32_t(header[1]) << 8 | uint32_t(header[2]) << 16 |
                       uint32_t(header[3]) << 24;
  std::string body(len, '\0');
  for (got = 0; got < len;) {
    const ssize_t n = ::recv(fd, body.data() + got, len - got, 0);
    if (n <= 0) return "";
    got += size_t(n);
  }
  return body;
}

std::string Frame(const std::string& body) {
  const uint32_t n = uint32_t(body.size());
  return std::string{char(n), char(n >> 8), char(n >> 16), char(n >> 24)} + body;
}

std::string Field(const std::string& s) { return Frame(s).substr(0, 4) + s; }

TEST(Store, OnlyRanksWithTheTokenAreServed) {
  const int port = test::FreePort();
  auto server = MustConnect(WithToken(Options(port, 0, 2), "s3cret"));
  ASSERT_NE(server, nullptr);
  auto peer = MustConnect(WithToken(Options(port, 1, 2), "s3cret"));
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(peer->Set("k", "v").ok());
  EXPECT_EQ(*server->Get("k"), "v");

  auto wrong = Store::Connect(WithToken(Options(port, 1, 2, milliseconds(2000)), "guess"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("wrong store token: PSTAR_STORE_TOKEN differs from rank 0's"),
            std::string::npos)
      << wrong.status().message();
  auto none = Store::Connect(Options(port, 1, 2, milliseconds(2000)));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs a token (PSTAR_STORE_TOKEN) and this rank has none"),
            std::string::npos)
      << none.status().message();

  // A raw peer that skips the hello gets an error and the door: its Set
  // never lands.
  const int fd = ConnectTo(port);
  const std::string set = Frame(std::string(1, char(2)) + Field("test/stolen") + Field("x"));
  ASSERT_EQ(::send(fd, set.data(), set.size(), MSG_NOSIGNAL), ssize_t(set.size()));
  const std::string reply = ReadFrame(fd);
  ASSERT_FALSE(reply.empty());
  EXPECT_EQ(reply[0], char(2)) << "an error reply";
  EXPECT_EQ(ReadFrame(fd), "") << "then closed";
  ::close(fd);
  EXPECT_FALSE(server->Get("stolen", milliseconds(100)).ok());
  EXPECT_TRUE(server->Set("still", "serving").ok());
}

TEST(Store, ATokenOnlyOneSideHasIsRefusedNamingTheMismatch) {
  const int port = test::FreePort();
  auto server = MustConnect(Options(port, 0, 2));
  ASSERT_NE(server, nullptr);
  auto s = Store::Connect(WithToken(Options(port, 1, 2, milliseconds(2000)), "t"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("this rank has a store token (PSTAR_STORE_TOKEN) and rank 0 has none"),
            std::string::npos)
      << s.status().message();
  auto big = Store::Connect(WithToken(Options(port, 1, 2), std::string(kStoreMaxTokenBytes + 1, 'x')));
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
}

TEST(Store, APeerThatNeverSaysHelloIsDropped) {
  const int port = test::FreePort();
  auto server = MustConnect(WithToken(Options(port, 0, 1), "s3cret"));
  ASSERT_NE(server, nullptr);
  const int fd = ConnectTo(port);
  const auto start = Clock::now();
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "closed by the server";
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, kStoreHelloWithin - milliseconds(500));
  EXPECT_LT(waited, kStoreHelloWithin + milliseconds(5000));
  ::close(fd);
}

TEST(Store, SomethingElseListeningIsNotTakenForAStore) {
  // A listener that accepts and hangs up at once.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  std::thread hang_up([&] {
    const int c = ::accept(listener, nullptr, nullptr);
    if (c >= 0) ::close(c);
  });
  auto s = Store::Connect(Options(port, 1, 2, milliseconds(2000)));
  hang_up.join();
  ::close(listener);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no pstar store answered"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
}

TEST(Store, FormatDuration) {
  EXPECT_EQ(FormatDuration(milliseconds(250)), "250 ms");
  EXPECT_EQ(FormatDuration(milliseconds(30000)), "30 s");
  EXPECT_EQ(FormatDuration(milliseconds(1500)), "1.5 s");
  EXPECT_EQ(FormatDuration(milliseconds(2250)), "2.25 s");
}

}  // namespace
}  // namespace pstar
