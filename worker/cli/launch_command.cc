// pstar launch: forks this node's ranks, each running this same binary with
// the given subcommand and the torchrun-style rank environment, and watches
// them. The first rank to fail stops the rest: SIGTERM, then SIGKILL after a
// grace period; launch exits with that rank's code. SIGINT and SIGTERM are
// forwarded to every rank, which stop after the current step (saving a
// checkpoint) however long that takes; a second one kills them at once.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/cli/launch_command.h"

#include "worker/cli/commands.h"

extern char** environ;

namespace pstar::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
};

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::string Describe(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  const int sig = WTERMSIG(wait_status);
  return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
}

void SignalAll(std::vector<RankProcess>& ranks, int sig) {
  for (RankProcess& r : ranks) {
    if (r.running) ::kill(r.pid, sig);
  }
}

// A null-terminated argv/envp view of `strings`, which must outlive it.
std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// 128 random bits as hex, from the kernel.
Result<std::string> RandomToken() {
  unsigned char bytes[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::read(fd, bytes, sizeof bytes) == ssize_t(sizeof bytes);
  if (fd >= 0) ::close(fd);
  if (!ok) return Status::Internal("launch: cannot read /dev/urandom for the store token");
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

// A free loopback port for the node's own rendezvous, as torchrun's
// --standalone picks one.
Result<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::Internal(std::string("launch: --standalone found no free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return int(ntohs(addr.sin_port));
}

Result<std::string> ThisExecutable() {
  char buf[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) return Status::Internal("launch: cannot find this executable (/proc/self/exe)");
  return std::string(buf, size_t(len));
}

// The node's ranks as child processes, and what the launcher does when they
// exit or it is signalled. The launcher takes its signals synchronously
// (sigtimedwait): they are blocked before the first fork so that none is
// lost, and each rank unblocks them.
class RankSupervisor {
 public:
  explicit RankSupervisor(const LaunchOptions& options) : options_(options), ranks_(size_t(options.nproc_per_node)) {
    sigemptyset(&watched_);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched_, sig);
    sigprocmask(SIG_BLOCK, &watched_, &previous_);
  }
  ~RankSupervisor() { sigprocmask(SIG_SETMASK, &previous_, nullptr); }
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Forks the ranks, each exec'ing `exe` with the command and its rank's
  // environment; a failed fork stops those already started.
  void StartRanks(const std::string& exe);
  // Until every rank has exited; returns launch's exit code.
  int Supervise();

 private:
  // A rank failed: the others get SIGTERM and, after the grace period, SIGKILL.
  void StopAll(int sig) {
    if (!stopping_) kill_at_ = Clock::now() + options_.grace;
    stopping_ = true;
    SignalAll(ranks_, sig);
  }
  // Asked to stop: the ranks finish their step and save a checkpoint,
  // however long that takes; a second request kills them.
  void RequestStop(int sig) {
    stopping_ = true;
    SignalAll(ranks_, sig);
  }
  bool AnyRunning() const {
    for (const RankProcess& r : ranks_) {
      if (r.running) return true;
    }
    return false;
  }
  // Waits for a signal, at most a second and at most until the kill deadline.
  int WaitForSignal();
  void OnSignal(int sig);
  void ReapExitedRanks();
  void KillPastGrace();

  const LaunchOptions& options_;
  std::vector<RankProcess> ranks_;
  sigset_t watched_, previous_;
  int result_ = kExitOk;
  bool stopping_ = false, killed_ = false;
  Clock::time_point kill_at_ = Clock::time_point::max();
};

void RankSupervisor::StartRanks(const std::string& exe) {
  const pid_t launcher = ::getpid();
  std::fflush(nullptr);
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    // Everything the child needs is built before fork: it only calls exec.
    std::vector<std::string> argv_strings = {exe};
    argv_strings.insert(argv_strings.end(), options_.command.begin(), options_.command.end());
    std::vector<std::string> env_strings = RankEnvironment(options_, i, environ);
    std::vector<char*> argv = CStrings(argv_strings), envp = CStrings(env_strings);
    RankProcess& r = ranks_[size_t(i)];
    r.rank = options_.node_rank * options_.nproc_per_node + i;
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Die with the launcher, even when it is killed without a chance to stop us.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(kExitFailure);
      sigprocmask(SIG_SETMASK, &previous_, nullptr);
      ::execve(exe.c_str(), argv.data(), envp.data());
      const char msg[] = "pstar: error: launch: cannot execute this binary\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    if (pid < 0) {
      std::fprintf(stderr, "pstar: error: launch: cannot start rank %d: %s\n", r.rank, std::strerror(errno));
      result_ = kExitFailure;
      StopAll(SIGTERM);
      return;
    }
    r.pid = pid;
    r.running = true;
  }
}

int RankSupervisor::WaitForSignal() {
  auto wait = std::chrono::milliseconds(1000);
  if (stopping_ && !killed_ && kill_at_ != Clock::time_point::max()) {
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()));
    wait = std::max(wait, std::chrono::milliseconds(0));
  }
  timespec ts{time_t(wait.count() / 1000), long(wait.count() % 1000) * 1000000L};
  return ::sigtimedwait(&watched_, nullptr, &ts);
}

void RankSupervisor::OnSignal(int sig) {
  if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return;
  if (stopping_) {
    SignalAll(ranks_, SIGKILL);  // asked twice: no more grace
    killed_ = true;
  } else {
    RequestStop(sig);
  }
}

void RankSupervisor::ReapExitedRanks() {
  // One SIGCHLD may stand for several exits. Of ranks found failed at once,
  // one killed by a signal is the likelier cause: its peers exit with an
  // error right after losing it.
  const RankProcess* failed = nullptr;
  int failed_status = 0;
  for (RankProcess& r : ranks_) {
    int status = 0;
    if (!r.running || ::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
    r.running = false;
    if (ExitCode(status) == 0) continue;
    if (failed == nullptr || (WIFSIGNALED(status) && !WIFSIGNALED(failed_status))) {
      failed = &r;
      failed_status = status;
    }
  }
  if (failed == nullptr || result_ != kExitOk) return;
  result_ = ExitCode(failed_status);
  if (stopping_) return;
  if (result_ == kExitInterrupted) {
    // The rank stopped on request (a terminal's Ctrl-C reaches every rank):
    // the others stop after the same step, which the ranks agree on.
    RequestStop(SIGINT);
  } else {
    std::fprintf(stderr, "pstar: error: rank %d %s%s\n", failed->rank, Describe(failed_status).c_str(),
                 options_.nproc_per_node > 1 ? "; stopping the other ranks" : "");
    StopAll(SIGTERM);
  }
}

void RankSupervisor::KillPastGrace() {
  if (!stopping_ || killed_ || Clock::now() < kill_at_ || !AnyRunning()) return;
  std::fprintf(stderr, "pstar: error: launch: ranks still running %lld ms after SIGTERM; killing them\n",
               (long long)options_.grace.count());
  SignalAll(ranks_, SIGKILL);
  killed_ = true;
}

int RankSupervisor::Supervise() {
  while (AnyRunning()) {
    OnSignal(WaitForSignal());
    ReapExitedRanks();
    KillPastGrace();
  }
  return result_;
}

}  // namespace

Status SetRendezvous(LaunchOptions* options, const char* inherited_token) {
  if (options->standalone) {
    Result<int> port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    options->master_port = *port;
  }
  // The rendezvous store's secret: on one node the launcher makes it; across
  // nodes every node must be given the same one.
  if (inherited_token != nullptr && *inherited_token != '\0') return Status::Ok();
  if (options->nnodes == 1) {
    Result<std::string> token = RandomToken();
    if (!token.ok()) return token.status();
    options->store_token = *token;
  } else {
    std::fprintf(stderr,
                 "pstar: warning: launch: the rendezvous store at %s:%d is open to anyone who reaches it; set "
                 "PSTAR_STORE_TOKEN to the same secret on every node\n",
                 options->master_addr.c_str(), options->master_port);
  }
  return Status::Ok();
}

int LaunchCommand(const std::vector<std::string>& args) {
  Result<LaunchOptions> options = ParseLaunchArgs(args);
  if (!options.ok()) return UsageError(options.status().message());
  if (Status set = SetRendezvous(&*options, std::getenv("PSTAR_STORE_TOKEN")); !set.ok()) return ReportError(set);
  Result<std::string> exe = ThisExecutable();
  if (!exe.ok()) return ReportError(exe.status());
  RankSupervisor supervisor(*options);
  supervisor.StartRanks(*exe);
  return supervisor.Supervise();
}

}  // namespace pstar::cli
