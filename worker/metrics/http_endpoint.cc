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

#include "worker/core/accept_loop.h"

namespace pstar {

namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;
// One request, read and answered, may take this long in total: a slow or
// stalled client can neither hold the endpoint nor delay shutdown longer.
constexpr auto kRequestDeadline = std::chrono::seconds(5);

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
    if (::bind(e->listen_fd_, found->ai_addr, found->ai_addrlen) != 0 || ::listen(e->listen_fd_, 16) != 0) {
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
  AcceptUntilWoken(listen_fd_, wake_fds_[0], [this](int client) {
    Answer(client);
    ::close(client);
    return true;
  });
}

// Waits until `client` is ready for `events`, the deadline passes or Stop is
// asked for; true only in the first case.
bool HttpEndpoint::WaitFor(int client, short events, Clock::time_point deadline) const {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{client, events, 0}, {wake_fds_[0], POLLIN, 0}};
    const int n = ::poll(fds, 2, int(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || fds[1].revents != 0) return false;
    return (fds[0].revents & (events | POLLERR | POLLHUP)) != 0;
  }
}

bool HttpEndpoint::SendAll(int client, const std::string& data, Clock::time_point deadline) const {
  size_t sent = 0;
  while (sent < data.size()) {
    if (!WaitFor(client, POLLOUT, deadline)) return false;
    const ssize_t n = ::send(client, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return false;  // the client went away
    sent += size_t(n);
  }
  return true;
}

void HttpEndpoint::Answer(int client) {
  const Clock::time_point deadline = Clock::now() + kRequestDeadline;
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    if (!WaitFor(client, POLLIN, deadline)) return;
    const ssize_t n = ::recv(client, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    request.append(buf, size_t(n));
  }
  const size_t line_end = request.find("\r\n");
  // "GET /metrics HTTP/1.1"; a query string is ignored.
  const std::string line = line_end == std::string::npos ? "" : request.substr(0, line_end);
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) {
    SendAll(client, Response("400 Bad Request", "text/plain", "bad request\n"), deadline);
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  const auto route = routes_.find(target);
  if (route == routes_.end()) {
    std::string paths;
    for (const auto& [path, handler] : routes_) paths += (paths.empty() ? "" : ", ") + path;
    SendAll(client, Response("404 Not Found", "text/plain", "not found; served paths: " + paths + "\n"), deadline);
  } else if (method != "GET" && method != "HEAD") {
    SendAll(client, Response("405 Method Not Allowed", "text/plain", "use GET\n"), deadline);
  } else {
    const Reply reply = route->second();
    const std::string status = std::to_string(reply.code) + (reply.code == 200 ? " OK" : " Error");
    const std::string response = Response(status.c_str(), reply.content_type.c_str(), reply.body);
    SendAll(client, method == "HEAD" ? response.substr(0, response.find("\r\n\r\n") + 4) : response,
            deadline);
  }
}

}  // namespace pstar
