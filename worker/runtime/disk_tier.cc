#include "worker/runtime/disk_tier.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "worker/core/bytes.h"
#include "worker/runtime/runtime_error.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

namespace {

int64_t AlignToDisk(int64_t bytes) { return TierLayout::DiskHomeStride(bytes); }

void FreeAligned(std::byte* p) { std::free(p); }

}  // namespace

std::string DiskTier::FilePath(const std::string& directory, int rank) {
  std::string dir = directory;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/pstar-chunks-rank" + std::to_string(rank) + ".bin";
}

int64_t DiskTier::FileBytes(const Shape& shape) { return int64_t(shape.homes) * AlignToDisk(shape.home_bytes); }

int64_t DiskTier::WindowBytes(const Shape& shape) { return int64_t(shape.windows) * AlignToDisk(shape.home_bytes); }

Status DiskTier::CheckRoom(const std::string& directory, int64_t bytes, int64_t allowed) {
  if (allowed > 0) {
    if (bytes <= allowed) return Status::Ok();
    return Status::ResourceExhausted("disk tier at " + directory + ": needs " + std::to_string(bytes) + " bytes (" +
                                     FormatBytes(bytes) + "), runtime.nvme_memory allows " +
                                     std::to_string(allowed) + " (" + FormatBytes(allowed) + ")");
  }
  struct statvfs fs;
  if (::statvfs(directory.c_str(), &fs) != 0) {
    return Status::FailedPrecondition("disk tier: cannot use " + directory + " (runtime.nvme_path): " +
                                      std::strerror(errno));
  }
  const int64_t free_bytes = int64_t(fs.f_bavail) * int64_t(fs.f_frsize);
  const int64_t usable = free_bytes - std::max(int64_t{1} << 30, free_bytes / 20);
  if (bytes <= usable) return Status::Ok();
  return Status::ResourceExhausted("disk tier at " + directory + ": needs " + std::to_string(bytes) + " bytes (" +
                                   FormatBytes(bytes) + "), " + std::to_string(std::max<int64_t>(usable, 0)) +
                                   " usable (" + FormatBytes(free_bytes) +
                                   " free less a margin of 1 GiB or 5%); set runtime.nvme_memory to override");
}

Result<std::unique_ptr<DiskTier>> DiskTier::Create(const Shape& shape) {
  if (shape.homes <= 0 || shape.home_bytes <= 0 || shape.windows < 2) {
    return Status::InvalidArgument("disk tier: nothing to home, or fewer than 2 windows");
  }
  auto t = std::unique_ptr<DiskTier>(new DiskTier(shape));
  t->stride_ = AlignToDisk(shape.home_bytes);
  const int64_t window_bytes = WindowBytes(shape);
  auto* data = static_cast<std::byte*>(std::aligned_alloc(size_t(DiskFile::kAlignment), size_t(window_bytes)));
  if (data == nullptr) {
    return Status::ResourceExhausted("disk tier: cannot allocate " + std::to_string(window_bytes) +
                                     " bytes of host windows");
  }
  t->block_ = MemoryBlock(data, size_t(window_bytes), &FreeAligned);
  PSTAR_ASSIGN_OR_RETURN(t->file_,
                         DiskFile::Create(FilePath(shape.directory, shape.rank), FileBytes(shape), shape.io_threads));
  t->windows_.resize(size_t(shape.windows));
  t->window_of_.assign(size_t(shape.homes), -1);
  return t;
}

DiskTier::~DiskTier() {
  // The file is scratch: what is in flight is waited for, not kept.
  for (int32_t w = 0; w < int32_t(windows_.size()); ++w) {
    const WindowState s = windows_[size_t(w)].state;
    if (s == WindowState::kReading || s == WindowState::kWriting) (void)file_->Wait(windows_[size_t(w)].ticket);
  }
}

void DiskTier::Finish(int32_t w) {
  Window& win = windows_[size_t(w)];
  const auto start = std::chrono::steady_clock::now();
  const Status status = file_->Wait(win.ticket);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  wait_seconds_ += waited;
  if (counters_ != nullptr) counters_->disk_wait_ns += int64_t(waited * 1e9);
  if (!status.ok()) {
    std::fprintf(stderr, "pstar: error: %s\n", status.message().c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  win.state = WindowState::kClean;
}

int32_t DiskTier::TakeWindow(bool wait) {
  int32_t clean = -1, writing = -1;
  for (int32_t w = 0; w < int32_t(windows_.size()); ++w) {
    const Window& win = windows_[size_t(w)];
    if (win.pinned) continue;
    // A write that landed leaves its window clean (no wait).
    if (win.state == WindowState::kWriting && file_->Ready(win.ticket)) Finish(w);
    if (win.state == WindowState::kFree) return w;
    if (win.state == WindowState::kClean && (clean < 0 || win.last_use < windows_[size_t(clean)].last_use)) clean = w;
    if (win.state == WindowState::kWriting && (writing < 0 || win.ticket < windows_[size_t(writing)].ticket)) {
      writing = w;
    }
  }
  if (clean < 0 && wait && writing >= 0) {
    Finish(writing);
    clean = writing;
  }
  if (clean >= 0) window_of_[size_t(windows_[size_t(clean)].home)] = -1;
  return clean;
}

void DiskTier::ReadAhead(int32_t home) {
  if (window_of_[size_t(home)] >= 0) return;
  const int32_t w = TakeWindow(/*wait=*/false);
  if (w < 0) return;
  Window& win = windows_[size_t(w)];
  win.home = home;
  win.state = WindowState::kReading;
  win.last_use = ++tick_;
  win.ticket = file_->Read(WindowData(w), stride_, Offset(home));
  window_of_[size_t(home)] = w;
  read_bytes_ += stride_;
  if (counters_ != nullptr) counters_->disk_read_bytes += stride_;
}

float* DiskTier::Open(int32_t home, bool zero, bool write) {
  int32_t w = window_of_[size_t(home)];
  if (w < 0) {
    w = TakeWindow(/*wait=*/true);
    if (w < 0) RuntimeBug("no disk window free: every window is pinned");
    Window& win = windows_[size_t(w)];
    win.home = home;
    window_of_[size_t(home)] = w;
    if (zero) {
      win.state = WindowState::kClean;
    } else {
      win.ticket = file_->Read(WindowData(w), stride_, Offset(home));
      win.state = WindowState::kReading;
      read_bytes_ += stride_;
      if (counters_ != nullptr) counters_->disk_read_bytes += stride_;
    }
  }
  Window& win = windows_[size_t(w)];
  // A write in flight keeps reading the window: the host writes it again
  // only after that write landed.
  if (win.state == WindowState::kReading || (win.state == WindowState::kWriting && (write || zero))) Finish(w);
  if (zero) std::memset(WindowData(w), 0, size_t(stride_));
  if (write || zero) win.state = WindowState::kDirty;
  win.pinned = true;
  win.last_use = ++tick_;
  return reinterpret_cast<float*>(WindowData(w));
}

void DiskTier::UnpinAll() {
  for (int32_t w = 0; w < int32_t(windows_.size()); ++w) {
    Window& win = windows_[size_t(w)];
    win.pinned = false;
    if (win.state != WindowState::kDirty) continue;
    win.ticket = file_->Write(WindowData(w), stride_, Offset(win.home));
    win.state = WindowState::kWriting;
    written_bytes_ += stride_;
    if (counters_ != nullptr) counters_->disk_written_bytes += stride_;
  }
}

void DiskTier::Sync() {
  for (int32_t w = 0; w < int32_t(windows_.size()); ++w) {
    if (windows_[size_t(w)].state == WindowState::kWriting) Finish(w);
  }
}

}  // namespace pstar
