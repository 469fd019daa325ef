// DiskFile: one preallocated scratch file of chunk homes on a local disk,
// read and written with O_DIRECT (buffered where the file system refuses
// O_DIRECT, said by direct()) by a small pool of threads, so that the copies
// overlap the host's compute. A request is split into pieces the threads
// take in turn; it returns a ticket, and Wait(ticket) its status.
//
// The file is scratch for the run: created (or, left by a crashed run,
// truncated and rewritten) at start, locked against a second live run on the
// same path, and removed when the DiskFile goes. A full disk, an I/O error,
// or the file deleted or truncated under the run fail the request with a
// status naming the path and the bytes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

class DiskFile {
 public:
  // Buffers, offsets and sizes of requests are multiples of this.
  static constexpr int64_t kAlignment = 4096;
  // Requests are split into pieces of at most this many bytes.
  static constexpr int64_t kPieceBytes = int64_t{8} << 20;

  // Creates `path` with `bytes` allocated (posix_fallocate: a disk without
  // room fails here, naming both sizes) and `threads` I/O threads.
  static Result<std::unique_ptr<DiskFile>> Create(const std::string& path, int64_t bytes, int threads);
  DiskFile(const DiskFile&) = delete;
  DiskFile& operator=(const DiskFile&) = delete;
  // Waits for the requests in flight, then closes and removes the file.
  ~DiskFile();

  using Ticket = int64_t;
  Ticket Read(void* buffer, int64_t bytes, int64_t offset);
  Ticket Write(const void* buffer, int64_t bytes, int64_t offset);
  // Waits for the request; its status (each ticket is waited for once).
  Status Wait(Ticket ticket);
  // Whether the request is done (Wait then returns at once).
  bool Ready(Ticket ticket);

  const std::string& path() const { return path_; }
  int64_t bytes() const { return bytes_; }
  bool direct() const { return direct_; }

 private:
  struct Piece {
    Ticket ticket;
    bool write;
    std::byte* buffer;
    int64_t bytes;
    int64_t offset;
  };
  struct Pending {
    int pieces = 0;
    Status status;
  };
  DiskFile(std::string path, int fd, int64_t bytes, bool direct);
  Ticket Submit(bool write, std::byte* buffer, int64_t bytes, int64_t offset);
  void Serve();
  Status Transfer(const Piece& piece) const;

  const std::string path_;
  const int fd_;
  const int64_t bytes_;
  const bool direct_;
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::deque<Piece> queue_;
  std::map<Ticket, Pending> pending_;
  Ticket next_ticket_ = 1;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pstar
