#include "operator/reconciler/job_planner.h"

#include <algorithm>

namespace pstar::op {

JobPlanner::JobPlanner(int threads, PlanFn plan, std::function<void(const std::string& key)> on_ready)
    : plan_(plan ? std::move(plan) : PlanFn(PlanJob)), on_ready_(std::move(on_ready)) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

JobPlanner::~JobPlanner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<const JobPlan> JobPlanner::Find(const std::string& key, const Json& job) {
  const Json& meta = job["metadata"];
  const std::string uid = meta.value("uid", "");
  const int64_t generation = meta.value("generation", int64_t(1));
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = plans_[uid];
  if (e.generation == generation) return e.plan;  // made, or null: on its way
  e.generation = generation;
  e.plan = nullptr;
  queue_.push_back({key, uid, generation, job});
  cv_.notify_one();
  return nullptr;
}

void JobPlanner::Forget(const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.erase(uid);
}

void JobPlanner::Run() {
  while (true) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    std::shared_ptr<const JobPlan> plan = plan_(r.job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(r.uid);
      // Kept only if the job still wants this generation (not forgotten, not edited since).
      if (it == plans_.end() || it->second.generation != r.generation) continue;
      it->second.plan = std::move(plan);
    }
    if (on_ready_) on_ready_(r.key);
  }
}

}  // namespace pstar::op
