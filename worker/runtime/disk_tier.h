// DiskTier: the third tier. Chunk shards homed on a local disk (numbered
// 0..homes-1, each in a fixed aligned slot of one DiskFile per rank) and the
// counted pool of aligned host windows the host reads and writes them
// through. A home is used on the host only in a window: Open waits for its
// read (started ahead by ReadAhead where the order of use is known) and pins
// the window; Unpin lets it go, starting the write of a window the host wrote
// (write-behind). A window is reused for another home only once its write
// landed; when none is free, Open waits for the oldest write.
//
// An I/O failure (a full or failing disk, the file deleted or truncated under
// the run) is fatal for the run: it ends the process with one line naming
// the path and the bytes, as a lost peer does; checkpoints, written apart,
// stay as they were.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/core/status.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/disk_file.h"
#include "worker/runtime/runtime_counters.h"

namespace pstar {

class DiskTier {
 public:
  struct Shape {
    std::string directory;   // where the file goes (runtime.nvme_path)
    int rank = 0;            // names the file: one per rank
    int64_t home_bytes = 0;  // one home (a chunk shard)
    int32_t homes = 0;
    int32_t windows = 0;     // host windows, at least 2
    int io_threads = 2;
  };
  // The file's name in `directory` for `rank`, and its bytes for `shape`.
  static std::string FilePath(const std::string& directory, int rank);
  static int64_t FileBytes(const Shape& shape);
  // Host bytes the windows take.
  static int64_t WindowBytes(const Shape& shape);

  // OK when `directory` has room for `bytes`: at most `allowed` (> 0), or
  // (0) the free space there less a margin of 1 GiB or 5%, the larger.
  static Status CheckRoom(const std::string& directory, int64_t bytes, int64_t allowed);

  static Result<std::unique_ptr<DiskTier>> Create(const Shape& shape);
  // Waits for every write, then removes the file.
  ~DiskTier();

  // `home` in a window, pinned: its contents read from disk (or zeros, with
  // `zero`, without a read). With `write` the host will change it, and the
  // window is written back once unpinned.
  float* Open(int32_t home, bool zero, bool write);
  // Starts reading `home` into a free window, when one is free without
  // waiting and the home is not in a window yet.
  void ReadAhead(int32_t home);
  // Unpins every window; those written start their writes.
  void UnpinAll();
  // Waits for every write in flight.
  void Sync();
  // Where the bytes read and written and the waits are also counted (the
  // metrics); null for nowhere. Not owned.
  void SetCounters(RuntimeCounters* counters) { counters_ = counters; }

  const std::string& path() const { return file_->path(); }
  bool direct() const { return file_->direct(); }
  int64_t read_bytes() const { return read_bytes_; }
  int64_t written_bytes() const { return written_bytes_; }
  // Seconds the host waited for reads and writes.
  double wait_seconds() const { return wait_seconds_; }
  int64_t host_bytes() const { return int64_t(block_.bytes()); }

 private:
  enum class WindowState { kFree, kReading, kClean, kDirty, kWriting };
  struct Window {
    int32_t home = -1;
    WindowState state = WindowState::kFree;
    bool pinned = false;
    DiskFile::Ticket ticket = 0;
    int64_t last_use = 0;
  };
  explicit DiskTier(const Shape& shape) : shape_(shape) {}
  std::byte* WindowData(int32_t w) const { return block_.data() + int64_t(w) * stride_; }
  int64_t Offset(int32_t home) const { return int64_t(home) * stride_; }
  // A window for a new home: a free one, else the least recently used clean
  // one, else (when `wait`) the oldest write's, once it landed; -1 if none.
  int32_t TakeWindow(bool wait);
  // Waits for the window's request; a failure ends the run.
  void Finish(int32_t w);

  const Shape shape_;
  int64_t stride_ = 0;
  MemoryBlock block_;
  std::unique_ptr<DiskFile> file_;
  std::vector<Window> windows_;
  std::vector<int32_t> window_of_;  // per home, or -1
  int64_t tick_ = 0;
  int64_t read_bytes_ = 0, written_bytes_ = 0;
  double wait_seconds_ = 0;
  RuntimeCounters* counters_ = nullptr;
};

}  // namespace pstar
