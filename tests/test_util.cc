#include "tests/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace pstar::test {

uint64_t RunSeed() {
  if (const char* s = std::getenv("PSTAR_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// The environment's value of `name` when set and non-empty, else `built_in`.
static std::string EnvOr(const char* name, const char* built_in) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(built_in);
}

std::string SourceDir() { return EnvOr("PSTAR_SOURCE_DIR", PSTAR_SOURCE_DIR); }
std::string PstarBinary() { return EnvOr("PSTAR_BINARY", PSTAR_BINARY); }

bool MissingGpusAreAFailure(int needed, int found) {
  const char* expect = std::getenv("PSTAR_EXPECT_GPU");
  if (expect == nullptr || *expect == '\0') return false;
  char* end = nullptr;
  const long expected = std::strtol(expect, &end, 10);
  if (*end != '\0' || expected <= 0) return false;
  return found < std::min<long>(needed, expected);
}

TempDir::TempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("pstar-" + tag + "-XXXXXX")).string();
  char* p = ::mkdtemp(tmpl.data());
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

static std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env)
    : dir_("child") {
  const std::string out = dir_.path() + "/out", err = dir_.path() + "/err";
  pid_ = ::fork();
  if (pid_ == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

bool ChildProcess::Running() {
  if (reaped_) return false;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

ProcessResult ChildProcess::Wait() {
  if (!reaped_) {
    ::waitpid(pid_, &status_, 0);
    reaped_ = true;
  }
  ProcessResult r;
  r.exit_code = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  r.out = Slurp(dir_.path() + "/out");
  r.err = Slurp(dir_.path() + "/err");
  return r;
}

ProcessResult RunProcess(const std::vector<std::string>& argv) { return ChildProcess(argv).Wait(); }

std::string ChildProcess::Stdout() const { return Slurp(dir_.path() + "/out"); }

namespace {

bool CanBind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int FreePorts(int count) {
  // Below Linux's ephemeral range (32768 and up), where the kernel never
  // puts the source port of another test's connection: a port found free
  // here stays free unless another test picks the same one at random.
  constexpr int kLow = 20000, kHigh = 32000;
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(kLow, kHigh - count);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int base = pick(rng);
    bool free = true;
    for (int p = base; p < base + count && free; ++p) free = CanBind(p);
    if (free) return base;
  }
  return -1;
}

int FreePort() { return FreePorts(1); }

HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse resp;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    resp.error = "socket() failed";
    return resp;
  }
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    resp.error = "cannot connect to 127.0.0.1:" + std::to_string(port);
    return resp;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    resp.error = "sending the request failed";
    return resp;
  }
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (n < 0) {
    resp.error = "reading the response failed or timed out";
    return resp;
  }
  const size_t line_end = raw.find("\r\n");
  const size_t head_end = raw.find("\r\n\r\n");
  if (line_end == std::string::npos || head_end == std::string::npos) {
    resp.error = "malformed HTTP response: " + raw;
    return resp;
  }
  resp.ok = true;
  resp.status_line = raw.substr(0, line_end);
  resp.body = raw.substr(head_end + 4);
  return resp;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

}  // namespace pstar::test
