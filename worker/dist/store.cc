#include "worker/dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "worker/core/accept_loop.h"

namespace pstar {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Request opcodes and reply codes of the wire protocol.
enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kWait = 5 };
enum Reply : uint8_t { kOk = 0, kTimedOut = 1, kError = 2 };

constexpr std::string_view kMagic = "pstar-store/1";
constexpr size_t kMaxFrameBytes = kStoreMaxValueBytes + kStoreMaxKeyBytes + 64;
constexpr size_t kMaxHelloBytes = kStoreMaxTokenBytes + 128;
constexpr size_t kMaxWaitKeys = 1 << 16;
// A Get or Wait reply may arrive this long after its timeout before the client
// stops waiting for it (the server answers at the timeout itself).
constexpr milliseconds kReplySlack{2000};
constexpr milliseconds kFirstBackoff{50}, kMaxBackoff{1000}, kMinAttempt{250};
// Rank 0 waits at most this long at exit for the other ranks to disconnect.
constexpr milliseconds kDrainGrace{5000};

std::string ErrnoText(int err) {
  std::string s = std::error_code(err, std::generic_category()).message();
  if (!s.empty()) s[0] = char(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string HostPort(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Little-endian encoding of the frame fields.
class Writer {
 public:
  Writer& U8(uint8_t v) { buf_.push_back(char(v)); return *this; }
  Writer& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(char((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& I64(int64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& Str(std::string_view s) {
    U32(uint32_t(s.size()));
    buf_.append(s);
    return *this;
  }
  // The frame: length prefix, then the fields.
  std::string Frame() const {
    Writer w;
    w.U32(uint32_t(buf_.size()));
    return w.buf_ + buf_;
  }

 private:
  std::string buf_;
};

// Reads fields back; any overrun or oversized string sets !ok().
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && in_.empty(); }
  uint8_t U8() { return uint8_t(Take(1)[0]); }
  uint32_t U32() {
    std::string_view b = Take(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(b[size_t(i)])) << (8 * i);
    return v;
  }
  int64_t I64() {
    std::string_view b = Take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(b[size_t(i)])) << (8 * i);
    return int64_t(v);
  }
  std::string Str(size_t max_bytes) {
    const uint32_t n = U32();
    if (n > max_bytes) ok_ = false;
    return ok_ ? std::string(Take(n)) : std::string();
  }

 private:
  std::string_view Take(size_t n) {
    static constexpr char kZeros[8] = {};
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return std::string_view(kZeros, std::min<size_t>(n, sizeof kZeros));
    }
    std::string_view out = in_.substr(0, n);
    in_.remove_prefix(n);
    return out;
  }

  std::string_view in_;
  bool ok_ = true;
};

// Whether the peer on `fd` has closed its end (or the connection failed).
// Our clients never half-close while a request is pending.
bool PeerHungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

uint32_t FrameLength(const char header[4]) {
  Reader r(std::string_view(header, 4));
  return r.U32();
}

// Waits for `events` on fd until the deadline; false on timeout.
bool PollUntil(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, int(std::min<int64_t>(left, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// Client-side I/O on a non-blocking socket, bounded by a deadline. The error
// names what went wrong in a few words ("timed out", "connection closed").
Status SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!PollUntil(fd, POLLOUT, deadline)) return Status::Internal("timed out sending");
      continue;
    }
    return Status::Internal(ErrnoText(errno));
  }
  return Status();
}

Status RecvExact(int fd, char* out, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, out, n, 0);
    if (got > 0) {
      out += got;
      n -= size_t(got);
      continue;
    }
    if (got == 0) return Status::Internal("connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!PollUntil(fd, POLLIN, deadline)) return Status::Internal("timed out waiting for a reply");
      continue;
    }
    return Status::Internal(ErrnoText(errno));
  }
  return Status();
}

// Server-side I/O on a blocking socket: false when the peer went away (or the
// server shut the socket down to stop).
bool BlockingSendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(size_t(n));
  }
  return true;
}

bool BlockingRecvExact(int fd, char* out, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, out, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= size_t(got);
  }
  return true;
}

std::string SockaddrIp(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

// One connect attempt to host:port, bounded by the deadline: a connected
// non-blocking socket, or the reason it failed.
Result<int> TryConnect(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found)) {
    return Status::Internal(std::string("cannot resolve host: ") + ::gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = ErrnoText(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!PollUntil(fd, POLLOUT, deadline)) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err == 0) {
      ::freeaddrinfo(found);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    why = ErrnoText(err);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return Status::Internal(why);
}

}  // namespace

std::string FormatDuration(milliseconds d) {
  const int64_t ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", double(ms) / 1000.0);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  return s + " s";
}

// The server rank 0 hosts: a thread accepting connections and one thread per
// connection serving its requests in order. A Get or Wait blocks only its own
// connection's thread. What a peer on the network can make it hold is
// bounded: at most kMaxStoreClients connections (more are closed at once), a
// connection's thread ends with it, a frame's buffer grows only with the
// bytes that actually arrive, and all keys and values together stay within
// kMaxStoreBytes.
class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> Start(int port, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Waits until no client is connected, or `grace` has passed.
  void Drain(milliseconds grace);

 private:
  StoreServer() = default;
  void Accept();
  void Serve(int fd);
  // The first frame of a connection: the reply, and whether the peer may go on.
  std::pair<std::string, bool> Hello(std::string_view request) const;
  // The reply to one request from the peer on `fd`; empty when the peer hung
  // up while its Get or Wait waited (the connection then ends).
  std::string Handle(std::string_view request, int fd);

  std::string token_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: written once to stop Accept
  std::thread accept_thread_;

  std::mutex mu_;
  std::condition_variable cv_;  // a key changed, a client left, or stopping
  bool stopping_ = false;
  std::unordered_map<std::string, std::string> data_;
  size_t data_bytes_ = 0;  // keys and values in data_
  // Open connection sockets; each has a detached thread that removes it when
  // it ends, so the server waits for this set to empty before it goes.
  std::set<int> clients_;
};

Result<std::unique_ptr<StoreServer>> StoreServer::Start(int port, std::string token) {
  auto server = std::unique_ptr<StoreServer>(new StoreServer());
  server->token_ = std::move(token);
  // Every interface, IPv6 and IPv4 where the host has IPv6, else IPv4 only.
  std::string why;
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = ErrnoText(errno);
      continue;
    }
    const int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(uint16_t(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(uint16_t(port));
      len = sizeof *a;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && ::listen(fd, 128) == 0) {
      server->listen_fd_ = fd;
      break;
    }
    why = ErrnoText(errno);
    ::close(fd);
    if (why.find("in use") != std::string::npos) break;  // IPv4 would fail the same way
  }
  if (server->listen_fd_ < 0) {
    return Status::FailedPrecondition("cannot host the rendezvous store on port " + std::to_string(port) +
                                      ": " + why);
  }
  if (::pipe2(server->wake_fds_, O_CLOEXEC) != 0) {
    return Status::Internal("cannot create the rendezvous store's wake pipe: " + ErrnoText(errno));
  }
  server->accept_thread_ = std::thread([raw = server.get()] { raw->Accept(); });
  return server;
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  if (accept_thread_.joinable()) {
    const char stop = 1;
    (void)!::write(wake_fds_[1], &stop, 1);
    accept_thread_.join();
  }
  // Accept has stopped, so no connection is added; wait for the threads.
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return clients_.empty(); });
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void StoreServer::Drain(milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, grace, [&] { return clients_.empty(); });
}

void StoreServer::Accept() {
  AcceptUntilWoken(listen_fd_, wake_fds_[0], [this](int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return false;
    }
    if (clients_.size() >= kMaxStoreClients) {
      ::close(fd);  // the connection limit: refuse, keep serving the others
      return true;
    }
    try {
      std::thread([this, fd] { Serve(fd); }).detach();
    } catch (const std::system_error&) {
      ::close(fd);  // no thread to spare: refuse this one
      return true;
    }
    clients_.insert(fd);
    return true;
  });
}

void StoreServer::Serve(int fd) {
  std::string request;
  // Until its hello is accepted a peer gets kStoreHelloWithin to send one
  // small frame, and nothing else is served.
  auto receive_timeout = [fd](milliseconds t) {
    timeval tv{};
    tv.tv_sec = time_t(t.count() / 1000);
    tv.tv_usec = suseconds_t((t.count() % 1000) * 1000);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  };
  receive_timeout(kStoreHelloWithin);
  bool greeted = false;
  while (true) {
    char header[4];
    if (!BlockingRecvExact(fd, header, sizeof header)) break;
    const uint32_t n = FrameLength(header);
    if (n > (greeted ? kMaxFrameBytes : kMaxHelloBytes)) break;  // not our protocol, or a broken client
    // The buffer grows with what arrives, not with what the prefix claims.
    request.clear();
    bool complete = true;
    while (request.size() < n) {
      const size_t piece = std::min<size_t>(n - request.size(), 64 * 1024);
      const size_t at = request.size();
      request.resize(at + piece);
      if (!BlockingRecvExact(fd, request.data() + at, piece)) {
        complete = false;
        break;
      }
    }
    if (!complete) break;
    if (!greeted) {
      auto [reply, accepted] = Hello(request);
      if (!BlockingSendAll(fd, reply) || !accepted) break;
      greeted = true;
      receive_timeout(milliseconds(0));  // a rank may sit idle between calls
      continue;
    }
    const std::string reply = Handle(request, fd);
    if (reply.empty() || !BlockingSendAll(fd, reply)) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  clients_.erase(fd);
  ::close(fd);
  cv_.notify_all();
}

std::pair<std::string, bool> StoreServer::Hello(std::string_view request) const {
  auto refuse = [](const std::string& message) {
    return std::make_pair(Writer().U8(kError).Str(message).Frame(), false);
  };
  Reader in(request);
  if (in.U8() != kHello || in.Str(64) != kMagic) return refuse("unknown protocol");
  // Clients before tokens existed send no token field.
  const std::string token = in.done() ? std::string() : in.Str(kStoreMaxTokenBytes);
  if (!in.done()) return refuse("malformed hello");
  if (token_.empty() && !token.empty()) {
    return refuse("this rank has a store token (PSTAR_STORE_TOKEN) and rank 0 has none");
  }
  if (!token_.empty() && token.empty()) {
    return refuse("the store needs a token (PSTAR_STORE_TOKEN) and this rank has none");
  }
  if (!token_.empty()) {
    // Compared in time independent of where they differ.
    unsigned char diff = token.size() == token_.size() ? 0 : 1;
    for (size_t i = 0; i < token.size(); ++i) diff |= uint8_t(token[i] ^ token_[i % token_.size()]);
    if (diff != 0) return refuse("wrong store token: PSTAR_STORE_TOKEN differs from rank 0's");
  }
  return {Writer().U8(kOk).Frame(), true};
}

std::string StoreServer::Handle(std::string_view request, int fd) {
  Reader in(request);
  const uint8_t op = in.U8();
  auto error = [](const std::string& message) { return Writer().U8(kError).Str(message).Frame(); };
  // Bounds a client's requested wait: a day is far beyond any rendezvous.
  auto deadline_after = [](int64_t ms) {
    return Clock::now() + milliseconds(std::clamp<int64_t>(ms, 0, int64_t(24) * 3600 * 1000));
  };
  std::unique_lock<std::mutex> lock(mu_);
  // Waits for `ready` until `deadline`, in slices, giving up when the peer has
  // hung up: a closed connection must not hold its thread and its slot among
  // kMaxStoreClients until a long timeout. False when the peer is gone.
  auto wait_for_peer = [&](Clock::time_point deadline, auto ready) {
    while (!ready() && Clock::now() < deadline) {
      cv_.wait_until(lock, std::min(deadline, Clock::now() + milliseconds(200)), ready);
      if (!ready() && PeerHungUp(fd)) return false;
    }
    return true;
  };
  switch (op) {
    case kHello:
      return error("hello twice");
    case kSet: {
      std::string key = in.Str(kStoreMaxKeyBytes);
      std::string value = in.Str(kStoreMaxValueBytes);
      if (!in.done()) return error("malformed set");
      auto old = data_.find(key);
      const size_t replaced = old == data_.end() ? 0 : old->first.size() + old->second.size();
      if (data_bytes_ - replaced + key.size() + value.size() > kMaxStoreBytes) {
        return error("the store is full (" + std::to_string(kMaxStoreBytes >> 20) + " MiB of keys and values)");
      }
      data_bytes_ += key.size() + value.size() - replaced;
      data_[std::move(key)] = std::move(value);
      cv_.notify_all();
      return Writer().U8(kOk).Frame();
    }
    case kGet: {
      const std::string key = in.Str(kStoreMaxKeyBytes);
      const int64_t timeout_ms = in.I64();
      if (!in.done()) return error("malformed get");
      if (!wait_for_peer(deadline_after(timeout_ms), [&] { return stopping_ || data_.count(key) > 0; })) return {};
      auto it = data_.find(key);
      if (it != data_.end()) return Writer().U8(kOk).Str(it->second).Frame();
      return stopping_ ? error("the store is shutting down") : Writer().U8(kTimedOut).Str(key).Frame();
    }
    case kAdd: {
      const std::string key = in.Str(kStoreMaxKeyBytes);
      const int64_t delta = in.I64();
      if (!in.done()) return error("malformed add");
      int64_t value = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const std::string& s = it->second;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec != std::errc() || end != s.data() + s.size()) return error("the value is not an integer");
      }
      if (__builtin_add_overflow(value, delta, &value)) return error("the counter would overflow");
      std::string text = std::to_string(value);
      const size_t replaced = it == data_.end() ? 0 : key.size() + it->second.size();
      if (data_bytes_ - replaced + key.size() + text.size() > kMaxStoreBytes) {
        return error("the store is full (" + std::to_string(kMaxStoreBytes >> 20) + " MiB of keys and values)");
      }
      data_bytes_ += key.size() + text.size() - replaced;
      data_[key] = std::move(text);
      cv_.notify_all();
      return Writer().U8(kOk).I64(value).Frame();
    }
    case kWait: {
      const uint32_t count = in.U32();
      if (count > kMaxWaitKeys) return error("too many keys");
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < count && in.ok(); ++i) keys.push_back(in.Str(kStoreMaxKeyBytes));
      const int64_t timeout_ms = in.I64();
      if (!in.done()) return error("malformed wait");
      auto missing = [&] {
        return std::find_if(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) == 0; });
      };
      if (!wait_for_peer(deadline_after(timeout_ms), [&] { return stopping_ || missing() == keys.end(); })) return {};
      auto first_missing = missing();
      if (first_missing == keys.end()) return Writer().U8(kOk).Frame();
      return stopping_ ? error("the store is shutting down") : Writer().U8(kTimedOut).Str(*first_missing).Frame();
    }
    default:
      return error("unknown request");
  }
}

Result<std::unique_ptr<Store>> Store::Connect(const StoreOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return Status::InvalidArgument("rendezvous: rank " + std::to_string(options.rank) +
                                   " is outside a world of " + std::to_string(options.world_size));
  }
  if (options.port < 1 || options.port > 65535) {
    return Status::InvalidArgument("rendezvous: port " + std::to_string(options.port) + " is not in 1..65535");
  }
  if (options.host.empty()) return Status::InvalidArgument("rendezvous: the host is empty");
  if (options.rdzv_id.empty() || options.rdzv_id.size() > 256) {
    return Status::InvalidArgument("rendezvous: the rendezvous id must have 1 to 256 characters");
  }
  if (options.timeout.count() <= 0) return Status::InvalidArgument("rendezvous: the timeout must be positive");
  if (options.token.size() > kStoreMaxTokenBytes) {
    return Status::InvalidArgument("rendezvous: the store token (PSTAR_STORE_TOKEN) must have at most " +
                                   std::to_string(kStoreMaxTokenBytes) + " bytes");
  }

  auto store = std::unique_ptr<Store>(new Store(options));
  if (options.rank == 0) {
    PSTAR_ASSIGN_OR_RETURN(store->server_, StoreServer::Start(options.port, options.token));
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options.timeout;
  const std::string where = store->server();
  auto failed = [&](const std::string& why) {
    return Status::Internal("rendezvous with " + where + " failed after " + FormatDuration(options.timeout) +
                            ": " + why);
  };
  // Retry with exponential backoff; the last attempt is made at the deadline.
  milliseconds backoff = kFirstBackoff;
  while (true) {
    // Even the attempt at the deadline gets a moment to hear back.
    Result<int> fd = TryConnect(options.host, options.port, std::max(deadline, Clock::now() + kMinAttempt));
    if (fd.ok()) {
      store->fd_ = *fd;
      break;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return failed(fd.status().message());
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  // The handshake: something listening that is not a store fails here.
  Writer hello_frame;
  hello_frame.U8(kHello).Str(kMagic);
  if (!options.token.empty()) hello_frame.Str(options.token);
  Result<std::string> hello = store->Call(hello_frame.Frame(), std::max(deadline, Clock::now() + kReplySlack));
  if (hello.ok()) {
    Reader reply(*hello);
    if (reply.U8() == kError) {
      const std::string why = reply.Str(4096);
      return Status::FailedPrecondition("rendezvous with " + where + " failed: the store refused this rank: " + why);
    }
  }
  if (!hello.ok() || Reader(*hello).U8() != kOk) {
    const std::string why = hello.ok() ? "unexpected reply" : hello.status().message().substr(where.size() + 22);
    return Status::Internal("rendezvous with " + where + " failed: no pstar store answered (" + why + ")");
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (::getsockname(store->fd_, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    store->local_address_ = SockaddrIp(local);
  }
  return store;
}

Store::Store(const StoreOptions& options) : options_(options) {}

Store::~Store() {
  if (fd_ >= 0) ::close(fd_);
  if (server_ != nullptr) server_->Drain(std::min(options_.timeout, kDrainGrace));
}

std::string Store::server() const { return HostPort(options_.host, options_.port); }

std::string Store::NextScope(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return name + "/" + std::to_string(scopes_++);
}

Result<std::string> Store::Call(const std::string& request, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  // A connection whose round trip failed midway is out of step: drop it, and
  // every later call fails at once.
  auto broken = [&](const Status& s) {
    ::close(fd_);
    fd_ = -1;
    return Status::Internal("rendezvous store at " + server() + ": " + s.message());
  };
  if (fd_ < 0) return Status::Internal("rendezvous store at " + server() + ": the connection was lost earlier");
  if (Status s = SendAll(fd_, request, deadline); !s.ok()) return broken(s);
  char header[4];
  if (Status s = RecvExact(fd_, header, sizeof header, deadline); !s.ok()) return broken(s);
  const uint32_t n = FrameLength(header);
  if (n == 0 || n > kMaxFrameBytes) return broken(Status::Internal("malformed reply"));
  std::string reply(n, '\0');
  if (Status s = RecvExact(fd_, reply.data(), n, deadline); !s.ok()) return broken(s);
  return reply;
}

Status Store::Set(const std::string& key, std::string value) {
  const std::string k = Namespaced(key);
  if (k.size() > kStoreMaxKeyBytes) return Status::InvalidArgument("rendezvous store: key too long: " + key);
  if (value.size() > kStoreMaxValueBytes) {
    return Status::InvalidArgument("rendezvous store: the value of '" + key + "' exceeds " +
                                   std::to_string(kStoreMaxValueBytes) + " bytes");
  }
  PSTAR_ASSIGN_OR_RETURN(std::string reply,
                         Call(Writer().U8(kSet).Str(k).Str(value).Frame(), Clock::now() + options_.timeout));
  Reader r(reply);
  const uint8_t code = r.U8();
  if (code == kOk) return Status();
  if (code == kError) {
    return Status::ResourceExhausted("rendezvous store at " + server() + ": set '" + key + "': " + r.Str(1024));
  }
  return Status::Internal("rendezvous store at " + server() + ": set '" + key + "' failed");
}

Result<std::string> Store::Get(const std::string& key, milliseconds timeout) {
  const std::string k = Namespaced(key);
  if (k.size() > kStoreMaxKeyBytes) return Status::InvalidArgument("rendezvous store: key too long: " + key);
  PSTAR_ASSIGN_OR_RETURN(std::string reply, Call(Writer().U8(kGet).Str(k).I64(timeout.count()).Frame(),
                                                 Clock::now() + timeout + kReplySlack));
  Reader r(reply);
  const uint8_t code = r.U8();
  if (code == kOk) {
    std::string value = r.Str(kStoreMaxValueBytes);
    if (r.done()) return value;
  } else if (code == kTimedOut) {
    return Status::Internal("rendezvous store at " + server() + ": key '" + key + "' was not set within " +
                            FormatDuration(timeout));
  }
  return Status::Internal("rendezvous store at " + server() + ": get '" + key + "' failed");
}

Result<int64_t> Store::Add(const std::string& key, int64_t delta) {
  const std::string k = Namespaced(key);
  if (k.size() > kStoreMaxKeyBytes) return Status::InvalidArgument("rendezvous store: key too long: " + key);
  PSTAR_ASSIGN_OR_RETURN(std::string reply,
                         Call(Writer().U8(kAdd).Str(k).I64(delta).Frame(), Clock::now() + options_.timeout));
  Reader r(reply);
  const uint8_t code = r.U8();
  if (code == kOk) {
    const int64_t value = r.I64();
    if (r.done()) return value;
  } else if (code == kError) {
    return Status::InvalidArgument("rendezvous store: add to '" + key + "': " + r.Str(1024));
  }
  return Status::Internal("rendezvous store at " + server() + ": add to '" + key + "' failed");
}

Status Store::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.size() > kMaxWaitKeys) return Status::InvalidArgument("rendezvous store: too many keys to wait for");
  Writer w;
  w.U8(kWait).U32(uint32_t(keys.size()));
  for (const std::string& key : keys) {
    const std::string k = Namespaced(key);
    if (k.size() > kStoreMaxKeyBytes) return Status::InvalidArgument("rendezvous store: key too long: " + key);
    w.Str(k);
  }
  w.I64(timeout.count());
  PSTAR_ASSIGN_OR_RETURN(std::string reply, Call(w.Frame(), Clock::now() + timeout + kReplySlack));
  Reader r(reply);
  const uint8_t code = r.U8();
  if (code == kOk && r.done()) return Status();
  if (code == kTimedOut) {
    std::string missing = r.Str(kStoreMaxKeyBytes);
    const std::string prefix = options_.rdzv_id + "/";
    if (missing.rfind(prefix, 0) == 0) missing.erase(0, prefix.size());
    return Status::Internal("rendezvous store at " + server() + ": key '" + missing + "' was not set within " +
                            FormatDuration(timeout));
  }
  return Status::Internal("rendezvous store at " + server() + ": wait failed");
}

}  // namespace pstar
