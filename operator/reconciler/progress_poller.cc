#include "operator/reconciler/progress_poller.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

namespace pstar::op {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// "name{labels} value [timestamp]" or "name value": the name and the value.
bool ParseSample(std::string_view line, std::string_view* name, double* value) {
  if (line.empty() || line[0] == '#') return false;
  size_t end = 0;
  while (end < line.size() && line[end] != '{' && line[end] != ' ') ++end;
  *name = line.substr(0, end);
  size_t at = end;
  if (at < line.size() && line[at] == '{') {
    // Label values may hold '}' inside quotes.
    bool quoted = false;
    for (++at; at < line.size(); ++at) {
      if (line[at] == '\\' && quoted) {
        ++at;
      } else if (line[at] == '"') {
        quoted = !quoted;
      } else if (line[at] == '}' && !quoted) {
        break;
      }
    }
    if (at >= line.size()) return false;
    ++at;
  }
  while (at < line.size() && line[at] == ' ') ++at;
  size_t stop = at;
  while (stop < line.size() && line[stop] != ' ') ++stop;
  const std::string number(line.substr(at, stop - at));
  if (number.empty()) return false;
  char* parsed_end = nullptr;
  errno = 0;
  const double v = std::strtod(number.c_str(), &parsed_end);
  if (parsed_end != number.c_str() + number.size() || errno == ERANGE) return false;
  *value = v;
  return true;
}

int64_t AsCount(double v) { return v >= 0 && v < 9.0e15 ? int64_t(v) : -1; }

}  // namespace

std::optional<JobProgress> ParseProgress(std::string_view text) {
  JobProgress p;
  bool have_step = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    std::string_view name;
    double v = 0;
    if (!ParseSample(line, &name, &v) || !std::isfinite(v)) continue;
    if (name == "patrickstar_step" && AsCount(v) >= 0) {
      p.step = AsCount(v);
      have_step = true;
    } else if (name == "patrickstar_target_steps" && AsCount(v) >= 0) {
      p.target_steps = AsCount(v);
    } else if (name == "patrickstar_last_checkpoint_step" && AsCount(v) >= 0) {
      p.last_checkpoint_step = AsCount(v);
    } else if (name == "patrickstar_loss") {
      p.loss = v;
    } else if (name == "patrickstar_tokens_per_second" && v >= 0) {
      p.tokens_per_second = v;
    }
  }
  if (!have_step) return std::nullopt;
  return p;
}

nlohmann::json ProgressStatus(const JobProgress& p) {
  nlohmann::json j = nlohmann::json::object();
  j["step"] = p.step;
  if (p.target_steps > 0) j["targetSteps"] = p.target_steps;
  if (p.loss) j["loss"] = std::round(*p.loss * 1e4) / 1e4;
  if (p.tokens_per_second) j["tokensPerSecond"] = std::round(*p.tokens_per_second);
  if (p.last_checkpoint_step >= 0) j["lastCheckpointStep"] = p.last_checkpoint_step;
  if (p.target_steps > p.step && p.steps_per_second > 0) {
    const double seconds = double(p.target_steps - p.step) / p.steps_per_second;
    if (seconds < 1e9) {
      j["estimatedCompletionTime"] =
          FormatTime(p.at + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::duration<double>(seconds)));
    }
  }
  j["updateTime"] = FormatTime(p.at);
  return j;
}

Result<std::string> BoundedHttpGet(const std::string& host, int port, const std::string& path, milliseconds timeout,
                                   size_t max_bytes) {
  const auto deadline = Clock::now() + timeout;
  auto left_ms = [&] {
    return int(std::max<int64_t>(0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count()));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;  // pod IPs: no name lookup that could stall
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    return Status::InvalidArgument("not an IP address: " + host);
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return Status::Internal(std::string("socket: ") + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (rc != 0 && errno != EINPROGRESS) return Status::Internal(std::string("connect: ") + std::strerror(errno));
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, left_ms()) <= 0) return Status::Internal("connect timed out");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return Status::Internal(std::string("connect: ") + std::strerror(err));
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    p = {fd, POLLOUT, 0};
    if (::poll(&p, 1, left_ms()) <= 0) return Status::Internal("request timed out");
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return Status::Internal("request failed");
    sent += size_t(n);
  }
  std::string response;
  std::vector<char> buf(64 * 1024);
  while (true) {
    p = {fd, POLLIN, 0};
    if (::poll(&p, 1, left_ms()) <= 0) return Status::Internal("response timed out");
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0) return Status::Internal("response failed");
    if (n == 0) break;
    if (response.size() + size_t(n) > max_bytes) return Status::ResourceExhausted("response over the size limit");
    response.append(buf.data(), size_t(n));
  }
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) return Status::Internal("no HTTP response");
  if (response.compare(0, 9, "HTTP/1.0 ") != 0 && response.compare(0, 9, "HTTP/1.1 ") != 0) {
    return Status::Internal("not an HTTP response");
  }
  if (response.compare(9, 3, "200") != 0) return Status::Internal("HTTP " + response.substr(9, 3));
  return response.substr(head_end + 4);
}

ProgressPoller::ProgressPoller(Options options, std::function<void(const std::string& key)> on_change)
    : options_(options), on_change_(std::move(on_change)), thread_([this] { Run(); }) {}

ProgressPoller::~ProgressPoller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressPoller::Track(const std::string& key, const std::string& host, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  Target& t = targets_[key];
  if (t.active && t.host == host && t.port == port) return;
  t.host = host;
  t.port = port;
  t.active = true;
  t.due = Clock::now();
  cv_.notify_all();
}

void ProgressPoller::Untrack(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(key);
  if (it != targets_.end()) it->second.active = false;
}

void ProgressPoller::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.erase(key);
}

std::optional<JobProgress> ProgressPoller::Latest(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = targets_.find(key);
  return it == targets_.end() ? std::nullopt : it->second.latest;
}

void ProgressPoller::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // The target due first, if any is due now.
    std::string key, host;
    int port = 0;
    auto next = Clock::time_point::max();
    for (auto& [k, t] : targets_) {
      if (!t.active) continue;
      if (t.due <= Clock::now() && key.empty()) {
        key = k;
        host = t.host;
        port = t.port;
        t.due = Clock::now() + options_.interval;
      }
      next = std::min(next, t.due);
    }
    if (key.empty()) {
      if (next == Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, next);
      }
      continue;
    }
    lock.unlock();
    Result<std::string> body = BoundedHttpGet(host, port, "/metrics", options_.timeout, options_.max_bytes);
    std::optional<JobProgress> read = body.ok() ? ParseProgress(*body) : std::nullopt;
    bool moved = false;
    lock.lock();
    auto it = targets_.find(key);
    if (read && it != targets_.end()) {
      read->at = std::chrono::system_clock::now();
      const std::optional<JobProgress>& before = it->second.latest;
      if (before && read->step > before->step && read->at > before->at) {
        read->steps_per_second =
            double(read->step - before->step) / std::chrono::duration<double>(read->at - before->at).count();
      } else if (before && read->step == before->step) {
        read->steps_per_second = before->steps_per_second;
      }
      moved = !before || before->step != read->step || before->last_checkpoint_step != read->last_checkpoint_step;
      it->second.latest = read;
    }
    if (moved && on_change_) {
      lock.unlock();
      on_change_(key);
      lock.lock();
    }
  }
}

}  // namespace pstar::op
