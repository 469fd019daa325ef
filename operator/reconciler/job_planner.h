// JobPlanner: parses and sizes jobs (PlanJob) off the reconcile workers. A
// job's sizing plans its memory, which for the largest accepted models takes
// about a second; done inline, a few such jobs would hold every worker and
// stall unrelated jobs. Find() returns a generation's plan when it is made,
// and otherwise queues it once and returns null; `on_ready` is then called
// with the job's key, so the reconciler looks at the job again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/reconciler/job_actions.h"

namespace pstar::op {

class JobPlanner {
 public:
  using PlanFn = std::function<std::shared_ptr<const JobPlan>(const Json& job)>;

  // `threads` (at least 1) make plans with `plan` (PlanJob when empty).
  JobPlanner(int threads, PlanFn plan, std::function<void(const std::string& key)> on_ready);
  ~JobPlanner();  // waits for plans being made, drops queued ones
  JobPlanner(const JobPlanner&) = delete;
  JobPlanner& operator=(const JobPlanner&) = delete;

  // The plan of `job` at its generation, or null while it is being made.
  // `key` is the job's "ns/name", given back to on_ready.
  std::shared_ptr<const JobPlan> Find(const std::string& key, const Json& job);
  // Drops what is kept for a deleted job.
  void Forget(const std::string& uid);

 private:
  struct Request {
    std::string key, uid;
    int64_t generation;
    Json job;
  };
  struct Entry {
    int64_t generation = -1;
    std::shared_ptr<const JobPlan> plan;  // null while queued or being made
  };
  void Run();

  PlanFn plan_;
  std::function<void(const std::string&)> on_ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<Request> queue_;
  std::map<std::string, Entry> plans_;  // by job uid
  std::vector<std::thread> threads_;
};

}  // namespace pstar::op
