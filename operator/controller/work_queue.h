// WorkQueue: a rate-limited queue of keys ("ns/name") for level-triggered
// controllers, with client-go's semantics: a key is queued at most once; a
// key being processed is not handed to a second worker, and if it is added
// meanwhile it is queued again when Done() is called. Failed keys are retried
// with per-key exponential backoff combined with an overall token bucket.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace pstar::op {

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};       // first per-key retry delay
  std::chrono::milliseconds max_delay{1000000};  // per-key cap (1000 s)
  double qps = 10;                               // overall retry rate...
  int burst = 100;                               // ...and bucket size
};

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `key` unless it is already queued (no-op after ShutDown).
  void Add(const std::string& key);
  // Queues `key` after `delay` (an earlier pending time wins).
  void AddAfter(const std::string& key, std::chrono::milliseconds delay);
  // Queues `key` after its rate-limit delay: max(per-key backoff, bucket).
  void AddRateLimited(const std::string& key);
  // The delay AddRateLimited would use now (and counts it as a requeue).
  std::chrono::milliseconds NextDelay(const std::string& key);
  // Clears `key`'s backoff (call after a successful reconcile).
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key) const;

  // Blocks until a key is ready; nullopt once ShutDown was called.
  std::optional<std::string> Get();
  // Marks `key` processed; re-queues it if it was added meanwhile.
  void Done(const std::string& key);
  // Wakes every Get() with nullopt; later Adds are ignored.
  void ShutDown();
  bool ShuttingDown() const;
  // Keys ready to be handed out (not counting delayed ones).
  size_t Len() const;

 private:
  void AddLocked(const std::string& key);
  void PromoteReadyLocked(Clock::time_point now);

  const WorkQueueOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::unordered_set<std::string> dirty_;       // queued (or to re-queue after Done)
  std::unordered_set<std::string> processing_;  // handed out, Done not yet called
  // Delayed adds: a min-heap of (ready time, key) plus each key's earliest time.
  using Delayed = std::pair<Clock::time_point, std::string>;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<Delayed>> delayed_;
  std::unordered_map<std::string, Clock::time_point> waiting_;
  std::unordered_map<std::string, int> failures_;
  double tokens_;
  Clock::time_point bucket_time_;
  bool shutting_down_ = false;
};

}  // namespace pstar::op
