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

#include "worker/cli/commands.h"
#include "worker/dist/launch_options.h"

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

}  // namespace

int LaunchCommand(const std::vector<std::string>& args) {
  Result<LaunchOptions> parsed = ParseLaunchArgs(args);
  if (!parsed.ok()) return UsageError(parsed.status().message());
  if (parsed->standalone) {
    // A free loopback port for the node's own rendezvous, as torchrun's
    // --standalone picks one.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) ::close(fd);
      return ReportError(Status::Internal(std::string("launch: --standalone found no free port: ") + std::strerror(errno)));
    }
    ::close(fd);
    parsed->master_port = ntohs(addr.sin_port);
  }
  // The rendezvous store's secret: on one node the launcher makes it; across
  // nodes every node must be given the same one.
  const char* inherited_token = std::getenv("PSTAR_STORE_TOKEN");
  if (inherited_token == nullptr || *inherited_token == '\0') {
    if (parsed->nnodes == 1) {
      Result<std::string> token = RandomToken();
      if (!token.ok()) return ReportError(token.status());
      parsed->store_token = *token;
    } else {
      std::fprintf(stderr,
                   "pstar: warning: launch: the rendezvous store at %s:%d is open to anyone who reaches it; set "
                   "PSTAR_STORE_TOKEN to the same secret on every node\n",
                   parsed->master_addr.c_str(), parsed->master_port);
    }
  }
  const LaunchOptions& options = *parsed;

  char exe_buf[PATH_MAX];
  const ssize_t exe_len = ::readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
  if (exe_len <= 0) return ReportError(Status::Internal("launch: cannot find this executable (/proc/self/exe)"));
  std::string exe(exe_buf, size_t(exe_len));

  // The launcher takes its signals synchronously (sigtimedwait below): block
  // them before the first fork so none is lost; each rank unblocks them.
  sigset_t watched, previous;
  sigemptyset(&watched);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched, sig);
  sigprocmask(SIG_BLOCK, &watched, &previous);
  const pid_t launcher = ::getpid();

  std::vector<RankProcess> ranks(size_t(options.nproc_per_node));
  int result = kExitOk;
  bool stopping = false, killed = false;
  Clock::time_point kill_at = Clock::time_point::max();
  // A rank failed: the others get SIGTERM and, after the grace period, SIGKILL.
  auto stop_all = [&](int sig) {
    if (!stopping) kill_at = Clock::now() + options.grace;
    stopping = true;
    SignalAll(ranks, sig);
  };
  // Asked to stop: the ranks finish their step and save a checkpoint, however
  // long that takes; a second request kills them.
  auto request_stop = [&](int sig) {
    stopping = true;
    SignalAll(ranks, sig);
  };

  std::fflush(nullptr);
  for (int i = 0; i < options.nproc_per_node; ++i) {
    // Everything the child needs is built before fork: it only calls exec.
    std::vector<std::string> argv_strings = {exe};
    argv_strings.insert(argv_strings.end(), options.command.begin(), options.command.end());
    std::vector<std::string> env_strings = RankEnvironment(options, i, environ);
    std::vector<char*> argv = CStrings(argv_strings), envp = CStrings(env_strings);
    ranks[size_t(i)].rank = options.node_rank * options.nproc_per_node + i;
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Die with the launcher, even when it is killed without a chance to stop us.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(kExitFailure);
      sigprocmask(SIG_SETMASK, &previous, nullptr);
      ::execve(exe.c_str(), argv.data(), envp.data());
      const char msg[] = "pstar: error: launch: cannot execute this binary\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    if (pid < 0) {
      std::fprintf(stderr, "pstar: error: launch: cannot start rank %d: %s\n", ranks[size_t(i)].rank,
                   std::strerror(errno));
      result = kExitFailure;
      stop_all(SIGTERM);
      break;
    }
    ranks[size_t(i)].pid = pid;
    ranks[size_t(i)].running = true;
  }

  auto any_running = [&] {
    for (const RankProcess& r : ranks) {
      if (r.running) return true;
    }
    return false;
  };
  while (any_running()) {
    // Wake at least once a second, and at the kill deadline.
    auto wait = std::chrono::milliseconds(1000);
    if (stopping && !killed && kill_at != Clock::time_point::max()) {
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()));
      wait = std::max(wait, std::chrono::milliseconds(0));
    }
    timespec ts{time_t(wait.count() / 1000), long(wait.count() % 1000) * 1000000L};
    const int sig = ::sigtimedwait(&watched, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (stopping) {
        SignalAll(ranks, SIGKILL);  // asked twice: no more grace
        killed = true;
      } else {
        request_stop(sig);
      }
    }
    // Reap whoever exited (one SIGCHLD may stand for several). Of ranks found
    // failed at once, one killed by a signal is the likelier cause: its peers
    // exit with an error right after losing it.
    const RankProcess* failed = nullptr;
    int failed_status = 0;
    for (RankProcess& r : ranks) {
      int status = 0;
      if (!r.running || ::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      if (ExitCode(status) == 0) continue;
      if (failed == nullptr || (WIFSIGNALED(status) && !WIFSIGNALED(failed_status))) {
        failed = &r;
        failed_status = status;
      }
    }
    if (failed != nullptr && result == kExitOk) {
      result = ExitCode(failed_status);
      if (result == kExitInterrupted && !stopping) {
        // The rank stopped on request (a terminal's Ctrl-C reaches every rank):
        // the others stop after the same step, which the ranks agree on.
        request_stop(SIGINT);
      } else if (!stopping) {
        std::fprintf(stderr, "pstar: error: rank %d %s%s\n", failed->rank, Describe(failed_status).c_str(),
                     options.nproc_per_node > 1 ? "; stopping the other ranks" : "");
        stop_all(SIGTERM);
      }
    }
    if (stopping && !killed && Clock::now() >= kill_at && any_running()) {
      std::fprintf(stderr, "pstar: error: launch: ranks still running %lld ms after SIGTERM; killing them\n",
                   (long long)options.grace.count());
      SignalAll(ranks, SIGKILL);
      killed = true;
    }
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  return result;
}

}  // namespace pstar::cli
