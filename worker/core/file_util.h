// Files written whole or not at all: write to a temp file beside the target,
// fsync it, rename over the target, fsync the directory.
#pragma once

#include <cstdint>
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
  // A target that exists must be a regular file (a device node or a FIFO is
  // never replaced); a missing directory is NotFound.
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

// A regular file opened for reads at any offset (pread), closed on
// destruction; what streams tensors out of a file much larger than memory.
class RandomAccessFile {
 public:
  // Anything but a regular file is InvalidArgument; never blocks.
  static Result<RandomAccessFile> Open(const std::string& path);
  RandomAccessFile(RandomAccessFile&& other) noexcept;
  RandomAccessFile& operator=(RandomAccessFile&& other) noexcept;
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;
  ~RandomAccessFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Bytes [offset, offset + n) into dst; past the end is DataLoss (the file
  // shrank since it was opened), naming the path.
  Status ReadAt(int64_t offset, int64_t n, char* dst) const;
  // The whole file, refused (InvalidArgument) past `max_bytes`: for small
  // files whose path comes from users (a /proc file may claim terabytes).
  Result<std::string> ReadAll(int64_t max_bytes) const;

 private:
  RandomAccessFile(std::string path, int fd, int64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// fsyncs a directory, making renames and creations in it durable.
Status SyncDirectory(const std::string& dir);

// Reads a whole file; NotFound / DataLoss name the path. Any readable file,
// a pipe included (a config may come from `<(...)`).
Result<std::string> ReadFile(const std::string& path);
// The same for data pstar must be able to trust the size of (training text,
// checkpoint files): anything but a regular file (a FIFO that would block, a
// device such as /dev/zero that never ends) is InvalidArgument, and opening
// never blocks.
Result<std::string> ReadRegularFile(const std::string& path);
// InvalidArgument unless `path` is a regular file; never blocks.
Status CheckRegularFile(const std::string& path);
// Creates `dir` (and its parents) if missing and proves a file can be written
// there, by creating and removing one named after `tag`; FailedPrecondition
// names the directory and the reason. For checks at start-up rather than at
// the first save.
Status CheckWritableDirectory(const std::string& dir, const std::string& tag);

}  // namespace pstar
