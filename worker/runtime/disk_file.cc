#include "worker/runtime/disk_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "worker/core/bytes.h"
#include "worker/runtime/runtime_error.h"

namespace pstar {

namespace {

std::string Errno(int err) { return std::strerror(err); }

}  // namespace

DiskFile::DiskFile(std::string path, int fd, int64_t bytes, bool direct)
    : path_(std::move(path)), fd_(fd), bytes_(bytes), direct_(direct) {}

Result<std::unique_ptr<DiskFile>> DiskFile::Create(const std::string& path, int64_t bytes, int threads) {
  if (bytes <= 0 || bytes % kAlignment != 0 || threads <= 0) {
    return Status::InvalidArgument("disk tier file " + path + ": bad size " + std::to_string(bytes));
  }
  bool direct = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    // The file system refuses O_DIRECT (tmpfs before Linux 6.6): buffered I/O.
    direct = false;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0) return Status::FailedPrecondition("disk tier: cannot create " + path + ": " + Errno(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FailedPrecondition("disk tier: " + path + " is in use by another run (" + Errno(err) +
                                      "): give each run its own runtime.nvme_path");
  }
  // What a crashed run left is scratch: start from an empty file.
  if (::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::FailedPrecondition("disk tier: cannot truncate " + path + ": " + Errno(err));
  }
  if (const int err = ::posix_fallocate(fd, 0, bytes); err != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    if (err == ENOSPC) {
      return Status::ResourceExhausted("disk tier: no room for " + std::to_string(bytes) + " bytes (" +
                                       FormatBytes(bytes) + ") of chunk homes at " + path);
    }
    return Status::FailedPrecondition("disk tier: cannot allocate " + std::to_string(bytes) + " bytes at " + path +
                                      ": " + Errno(err));
  }
  auto file = std::unique_ptr<DiskFile>(new DiskFile(path, fd, bytes, direct));
  for (int t = 0; t < threads; ++t) file->threads_.emplace_back([f = file.get()] { f->Serve(); });
  return file;
}

DiskFile::~DiskFile() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return queue_.empty(); });
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
  ::unlink(path_.c_str());
  ::close(fd_);
}

DiskFile::Ticket DiskFile::Read(void* buffer, int64_t bytes, int64_t offset) {
  return Submit(false, static_cast<std::byte*>(buffer), bytes, offset);
}

DiskFile::Ticket DiskFile::Write(const void* buffer, int64_t bytes, int64_t offset) {
  return Submit(true, static_cast<std::byte*>(const_cast<void*>(buffer)), bytes, offset);
}

DiskFile::Ticket DiskFile::Submit(bool write, std::byte* buffer, int64_t bytes, int64_t offset) {
  if (bytes <= 0 || bytes % kAlignment != 0 || offset % kAlignment != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % kAlignment != 0 || offset + bytes > bytes_) {
    RuntimeBug("unaligned or out-of-range disk request of " + std::to_string(bytes) + " bytes at " +
               std::to_string(offset));
  }
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    Pending& p = pending_[ticket];
    for (int64_t first = 0; first < bytes; first += kPieceBytes) {
      queue_.push_back({ticket, write, buffer + first, std::min(kPieceBytes, bytes - first), offset + first});
      ++p.pieces;
    }
  }
  work_.notify_all();
  return ticket;
}

Status DiskFile::Wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(ticket);
  if (it == pending_.end()) RuntimeBug("wait for an unknown disk request");
  done_.wait(lock, [&] { return it->second.pieces == 0; });
  Status status = std::move(it->second.status);
  pending_.erase(it);
  return status;
}

bool DiskFile::Ready(Ticket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(ticket);
  return it == pending_.end() || it->second.pieces == 0;
}

void DiskFile::Serve() {
  for (;;) {
    Piece piece;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      piece = queue_.front();
      queue_.pop_front();
    }
    Status status = Transfer(piece);
    {
      std::lock_guard<std::mutex> lock(mu_);
      Pending& p = pending_[piece.ticket];
      if (p.status.ok() && !status.ok()) p.status = std::move(status);
      --p.pieces;
    }
    done_.notify_all();
  }
}

Status DiskFile::Transfer(const Piece& piece) const {
  // Checked before every piece, reads and writes alike: a write past a
  // truncation would extend the file again over a hole, whose reads return
  // zeros instead of failing.
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    if (st.st_nlink == 0) return Status::DataLoss("disk tier: " + path_ + " was deleted under the run");
    if (int64_t(st.st_size) < bytes_) {
      return Status::DataLoss("disk tier: " + path_ + " holds " + std::to_string(st.st_size) + " bytes (it should hold " +
                              std::to_string(bytes_) + "): truncated under the run");
    }
  }
  int64_t done = 0;
  while (done < piece.bytes) {
    const ssize_t n = piece.write ? ::pwrite(fd_, piece.buffer + done, size_t(piece.bytes - done), piece.offset + done)
                                  : ::pread(fd_, piece.buffer + done, size_t(piece.bytes - done), piece.offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      const std::string what = std::string(piece.write ? "writing " : "reading ") + std::to_string(piece.bytes) +
                               " bytes at offset " + std::to_string(piece.offset) + " of " + path_;
      if (err == ENOSPC) return Status::ResourceExhausted("disk tier: disk full " + what);
      return Status::DataLoss("disk tier: error " + what + ": " + Errno(err));
    }
    if (n == 0) {
      return Status::DataLoss("disk tier: " + path_ + " ends before byte " + std::to_string(piece.offset + done) +
                              " (it should hold " + std::to_string(bytes_) + "): truncated under the run");
    }
    done += n;
  }
  return Status::Ok();
}

}  // namespace pstar
