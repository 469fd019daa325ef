// The rendezvous store's server on arbitrary bytes from a peer (rank 0's
// port is reachable by anyone on the network): one connection per input,
// which the server must answer and close once the peer is done, without
// crashing or reading out of bounds. The server answers on its own threads,
// so libFuzzer's per-input leak check is off for this target (fuzz.sh); a
// leak still shows in LeakSanitizer's check at exit. The first byte picks the case: odd, the input follows a
// valid hello with the server's token, so the fuzzer reaches the commands;
// even, the bytes are all the peer sends (the hello itself is fuzzed).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "worker/dist/store.h"

namespace {

constexpr char kToken[] = "fuzz-token";

std::string Frame(const std::string& payload) {
  std::string f(4, '\0');
  const uint32_t n = uint32_t(payload.size());
  for (int i = 0; i < 4; ++i) f[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return f + payload;
}

std::string Str(const std::string& s) {
  std::string out(4, '\0');
  const uint32_t n = uint32_t(s.size());
  for (int i = 0; i < 4; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + s;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::abort();
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Rank 0 of a one-rank group: its Store runs the server for the whole run.
int ServerPort() {
  static std::unique_ptr<pstar::Store> store;
  static const int port = [] {
    pstar::StoreOptions o;
    o.port = FreePort();
    o.token = kToken;
    o.timeout = std::chrono::milliseconds(5000);
    auto s = pstar::Store::Connect(o);
    if (!s.ok()) std::abort();
    store = std::move(*s);
    return o.port;
  }();
  return port;
}

// A connection to the server, or -1 when this host has no ephemeral port
// left: the server closes first, so every input leaves a TIME_WAIT socket for
// a minute, and a test that floods the store just before can use up the
// range. That is the host, not the server: the input is skipped.
int ConnectToServer(int port) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (err == ECONNREFUSED) {
      std::fprintf(stderr, "store_fuzz: the server stopped listening\n");
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int port = ServerPort();
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 1) bytes = Frame(std::string(1, char(1)) + Str("pstar-store/1") + Str(kToken)) + bytes;
  const int fd = ConnectToServer(port);
  if (fd < 0) return 0;
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed on us: allowed
    sent += size_t(n);
  }
  ::shutdown(fd, SHUT_WR);
  // Read the replies until the server closes the connection: it must, since
  // this end sends nothing more (a Get or Wait that waits notices the hang-up).
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    closed = ::recv(fd, buf, sizeof buf, 0) <= 0;
  }
  ::close(fd);
  if (!closed) {
    std::fprintf(stderr, "store_fuzz: the server held a connection 5 s after the peer was done\n");
    std::abort();
  }
  return 0;
}
