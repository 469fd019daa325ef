#include "worker/metrics/http_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>
#include <vector>


namespace pstar {

namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;
// One request, read and answered, may take this long in total: a slow or
// stalled client holds its connection slot no longer.
constexpr auto kRequestDeadline = std::chrono::seconds(5);
// Connections served at once; more wait in the listen backlog.
constexpr size_t kMaxConnections = 64;

std::string ErrnoText() { return std::error_code(errno, std::generic_category()).message(); }

std::string Response(const char* status, const char* type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& address, int port,
                                                          Routes routes) {
  std::string host = address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string where =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found)) {
    return Status::FailedPrecondition("cannot serve metrics on " + where + ": " + ::gai_strerror(rc));
  }
  auto e = std::unique_ptr<HttpEndpoint>(new HttpEndpoint());
  e->listen_fd_ = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  std::string why;
  if (e->listen_fd_ < 0) {
    why = ErrnoText();
  } else {
    int one = 1;
    ::setsockopt(e->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(e->listen_fd_, found->ai_addr, found->ai_addrlen) != 0 || ::listen(e->listen_fd_, 128) != 0) {
      why = ErrnoText();
    }
  }
  ::freeaddrinfo(found);
  if (!why.empty()) return Status::FailedPrecondition("cannot serve metrics on " + where + ": " + why);

  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  e->port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(e->wake_fds_, O_CLOEXEC) != 0) {
    return Status::Internal("cannot create the metrics endpoint's wake pipe: " + ErrnoText());
  }
  e->routes_ = std::move(routes);
  e->thread_ = std::thread([raw = e.get()] { raw->Serve(); });
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  if (thread_.joinable()) {
    const char stop = 1;
    (void)!::write(wake_fds_[1], &stop, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpEndpoint::Serve() {
  // One poll over the listening socket, the wake pipe and every open
  // connection: a slow or stalled client holds its own slot until its
  // deadline, never the others.
  struct Connection {
    int fd;
    Clock::time_point deadline;
    std::string in, out;
    size_t sent = 0;
    bool responding = false;
  };
  std::vector<Connection> conns;
  auto close_all = [&] {
    for (const Connection& c : conns) ::close(c.fd);
  };
  std::vector<pollfd> fds;
  while (true) {
    const Clock::time_point now = Clock::now();
    // Expired connections go first: a deadline bounds each request's life.
    for (size_t i = 0; i < conns.size();) {
      if (conns[i].deadline <= now) {
        ::close(conns[i].fd);
        conns[i] = std::move(conns.back());
        conns.pop_back();
      } else {
        ++i;
      }
    }
    fds.assign({{wake_fds_[0], POLLIN, 0}, {listen_fd_, short(conns.size() < kMaxConnections ? POLLIN : 0), 0}});
    int timeout_ms = -1;
    for (const Connection& c : conns) {
      fds.push_back({c.fd, short(c.responding ? POLLOUT : POLLIN), 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count() + 1;
      if (timeout_ms < 0 || left < timeout_ms) timeout_ms = int(left);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;  // asked to stop
    // Connections (fds[2..]) before accepting, so that indices still match.
    for (size_t i = conns.size(); i-- > 0;) {
      Connection& c = conns[i];
      const short ev = fds[i + 2].revents;
      bool done = (ev & (POLLERR | POLLNVAL)) != 0;
      if (!done && !c.responding && (ev & (POLLIN | POLLHUP))) {
        char buf[2048];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) c.in.append(buf, size_t(n));
        const bool complete = c.in.find("\r\n\r\n") != std::string::npos || c.in.size() >= kMaxRequestBytes;
        if (n == 0 || complete) {
          c.out = ResponseFor(c.in);
          c.responding = true;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          done = true;
        }
      } else if (!done && c.responding && (ev & (POLLOUT | POLLHUP))) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.sent += size_t(n);
        done = c.sent == c.out.size() || (n < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (done) {
        ::close(c.fd);
        c = std::move(conns.back());
        conns.pop_back();
      }
    }
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) conns.push_back({fd, Clock::now() + kRequestDeadline, {}, {}});
    }
  }
  close_all();
}

std::string HttpEndpoint::ResponseFor(const std::string& request) const {
  const size_t line_end = request.find("\r\n");
  // "GET /metrics HTTP/1.1"; a query string is ignored.
  const std::string line = line_end == std::string::npos ? "" : request.substr(0, line_end);
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) return Response("400 Bad Request", "text/plain", "bad request\n");
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  const auto route = routes_.find(target);
  if (route == routes_.end()) {
    std::string paths;
    for (const auto& [path, handler] : routes_) paths += (paths.empty() ? "" : ", ") + path;
    return Response("404 Not Found", "text/plain", "not found; served paths: " + paths + "\n");
  }
  if (method != "GET" && method != "HEAD") return Response("405 Method Not Allowed", "text/plain", "use GET\n");
  const Reply reply = route->second();
  const std::string status = std::to_string(reply.code) + (reply.code == 200 ? " OK" : " Error");
  const std::string response = Response(status.c_str(), reply.content_type.c_str(), reply.body);
  return method == "HEAD" ? response.substr(0, response.find("\r\n\r\n") + 4) : response;
}

}  // namespace pstar
