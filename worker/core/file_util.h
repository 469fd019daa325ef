// Files written whole or not at all: write to a temp file beside the target,
// fsync it, rename over the target, fsync the directory.
#pragma once

#include <string>
#include <string_view>

#include "worker/core/status.h"

namespace pstar {

Status WriteFileAtomically(const std::string& path, std::string_view contents);

// The same for a file written piece by piece: Append goes to the temp file,
// Commit publishes it. Destroyed without Commit, the temp file is removed and
// the target is left as it was.
class AtomicFileWriter {
 public:
  static Result<AtomicFileWriter> Open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  Status Append(std::string_view bytes);
  Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  Status Flush();
  // Writes all of [p, p + n) to the temp file, retrying short writes.
  Status WriteAll(const char* p, size_t n);

  std::string path_, tmp_;
  int fd_ = -1;
  std::string buffer_;  // small appends, written in larger blocks
};

// fsyncs a directory, making renames and creations in it durable.
Status SyncDirectory(const std::string& dir);

// Reads a whole file; NotFound / DataLoss name the path.
Result<std::string> ReadFile(const std::string& path);

}  // namespace pstar
