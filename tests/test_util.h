// Helpers shared by the tests: a per-run random seed, temp directories, paths
// and running the pstar binary as a child process.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace pstar::test {

// PSTAR_TEST_SEED if set, else a fresh random seed (printed by the caller).
uint64_t RunSeed();

// A test that needs `needed` CUDA devices and sees `found` fewer skips, saying
// so; on a host that must have GPUs it fails instead. PSTAR_EXPECT_GPU=N (the
// GPU runner sets it to the host's device count) makes a skip a failure when
// found < min(needed, N): a missing device then fails every GPU test, while a
// two-GPU test on a one-GPU host still skips.
bool MissingGpusAreAFailure(int needed, int found);

#define PSTAR_REQUIRE_GPUS_FOUND(needed, found)                                              \
  do {                                                                                       \
    const int pstar_needed_ = (needed), pstar_found_ = (found);                              \
    if (pstar_found_ < pstar_needed_) {                                                      \
      if (::pstar::test::MissingGpusAreAFailure(pstar_needed_, pstar_found_)) {              \
        FAIL() << "needs " << pstar_needed_ << " CUDA device(s), found " << pstar_found_     \
               << ", and PSTAR_EXPECT_GPU says this host has them";                          \
      }                                                                                      \
      GTEST_SKIP() << "needs " << pstar_needed_ << " CUDA device(s), this host has "         \
                   << pstar_found_;                                                          \
    }                                                                                        \
  } while (0)

// Whether this build runs under AddressSanitizer (scripts/sanitize.sh): its
// shadow memory and quarantine make a process's RSS meaningless as a
// measure, so tests of memory use skip there (the Release build runs them).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// The source tree and the built pstar binary: the environment variables
// PSTAR_SOURCE_DIR and PSTAR_BINARY when set (a relocated test bundle), else
// the paths CMake compiled in.
std::string SourceDir();
std::string PstarBinary();

// Sets an environment variable (unsets it, for a null value) for one scope
// and restores what was there afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A fresh directory, removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out, err;
};

// Runs `argv` (argv[0] a path) to completion, capturing stdout and stderr.
ProcessResult RunProcess(const std::vector<std::string>& argv);

// A child process running in the background, its output captured to files.
// The destructor kills it (SIGKILL) if it still runs.
class ChildProcess {
 public:
  // `env` entries ("NAME=value") are set on top of this process's environment.
  explicit ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  int pid() const { return pid_; }
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  void Signal(int signal);
  bool Running();
  // Waits for exit; the result holds the exit code and everything written.
  ProcessResult Wait();
  // What it has written to stdout so far.
  std::string Stdout() const;

 private:
  TempDir dir_;
  int pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();
// A port p such that p .. p + count - 1 are all free now (a job whose ranks
// listen on consecutive ports).
int FreePorts(int count);

// GET http://127.0.0.1:port/path (HTTP/1.0). ok is false when the connection
// or the read failed; error says why.
struct HttpResponse {
  bool ok = false;
  std::string error, status_line, body;
};
HttpResponse HttpGet(int port, const std::string& path);

void WriteText(const std::string& path, const std::string& text);

}  // namespace pstar::test
