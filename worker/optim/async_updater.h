// AsyncUpdater: runs the host's chunk updates on a thread of its own, in the
// order they are submitted, so the step's thread can go on (the next forward
// pass, or the rest of a backward pass) while they run. Wait(chunk) is the
// per-chunk fence: the ChunkManager calls it before it touches any host home
// of that chunk, so each use waits for its own chunk's update only and sees
// its result. Updates are plain element-wise kernels over memory no other
// thread touches while they are pending, so the results are the bits a
// synchronous update would give.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "worker/runtime/chunk_event_log.h"

namespace pstar {

class AsyncUpdater {
 public:
  // `thread_init` runs first on the update thread (binding it to a GPU).
  explicit AsyncUpdater(int32_t num_chunks, std::function<void()> thread_init = nullptr);
  // Finishes every pending update first.
  ~AsyncUpdater();
  AsyncUpdater(const AsyncUpdater&) = delete;
  AsyncUpdater& operator=(const AsyncUpdater&) = delete;

  // Queues `update` of `chunk` (of training step `step`, for the event log).
  // A chunk has at most one update pending: submitting another first waits
  // for the one before.
  void Submit(int32_t chunk, int64_t step, std::function<void()> update);
  // Returns once no update of `chunk` is pending (at once when none is).
  void Wait(int32_t chunk);
  // Returns once no update is pending.
  void Drain();
  bool pending(int32_t chunk) const { return pending_[size_t(chunk)].load(std::memory_order_acquire) != 0; }

  // Seconds the update thread spent updating, and the calling threads spent
  // in Wait and Drain for a pending update, since the last TakeTimes.
  struct Times {
    double busy_s = 0.0;
    double waited_s = 0.0;
    int64_t updates = 0;
  };
  Times TakeTimes();

  // Records update begin/end and waits; null for none. Not owned.
  void SetEventLog(ChunkEventLog* log) { log_ = log; }

 private:
  struct Job {
    int32_t chunk;
    int64_t step;
    std::function<void()> update;
  };
  void Run();

  std::unique_ptr<std::atomic<uint8_t>[]> pending_;
  const int32_t num_chunks_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> queue_;  // guarded by mu_
  int64_t in_flight_ = 0;  // queued or running; guarded by mu_
  bool stop_ = false;      // guarded by mu_
  Times times_;            // guarded by mu_
  int64_t current_step_ = 0;  // the step of the newest submission, for wait events
  ChunkEventLog* log_ = nullptr;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace pstar
