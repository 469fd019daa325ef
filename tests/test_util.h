// Helpers shared by the tests: a per-run random seed, temp directories, paths
// and running the pstar binary as a child process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pstar::test {

// PSTAR_TEST_SEED if set, else a fresh random seed (printed by the caller).
uint64_t RunSeed();

// The source tree and the built pstar binary (set by CMake).
std::string SourceDir();
std::string PstarBinary();

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

void WriteText(const std::string& path, const std::string& text);

}  // namespace pstar::test
