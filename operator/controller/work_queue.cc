#include "operator/controller/work_queue.h"

#include <algorithm>
#include <cmath>

namespace pstar::op {

WorkQueue::WorkQueue(WorkQueueOptions options)
    : options_(options), tokens_(std::max(1, options.burst)), bucket_time_(Clock::now()) {}

WorkQueue::~WorkQueue() { ShutDown(); }

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // Done() queues it again
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  if (delay.count() <= 0) {
    AddLocked(key);
    return;
  }
  auto when = Clock::now() + delay;
  auto it = waiting_.find(key);
  if (it != waiting_.end() && it->second <= when) return;
  waiting_[key] = when;
  delayed_.emplace(when, key);
  cv_.notify_all();  // a sleeping Get may need to wake earlier
}

std::chrono::milliseconds WorkQueue::NextDelay(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  int failures = failures_[key]++;
  double per_key_ms = static_cast<double>(options_.base_delay.count()) * std::pow(2.0, std::min(failures, 62));
  per_key_ms = std::min(per_key_ms, static_cast<double>(options_.max_delay.count()));
  double bucket_ms = 0;
  if (options_.qps > 0) {
    auto now = Clock::now();
    double elapsed = std::chrono::duration<double>(now - bucket_time_).count();
    tokens_ = std::min<double>(std::max(1, options_.burst), tokens_ + elapsed * options_.qps);
    bucket_time_ = now;
    tokens_ -= 1;
    if (tokens_ < 0) bucket_ms = -tokens_ / options_.qps * 1000.0;
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(std::max(per_key_ms, bucket_ms))));
}

void WorkQueue::AddRateLimited(const std::string& key) { AddAfter(key, NextDelay(key)); }

void WorkQueue::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

void WorkQueue::PromoteReadyLocked(Clock::time_point now) {
  while (!delayed_.empty() && delayed_.top().first <= now) {
    Delayed top = delayed_.top();
    delayed_.pop();
    auto it = waiting_.find(top.second);
    if (it == waiting_.end() || it->second != top.first) continue;  // superseded by an earlier time
    waiting_.erase(it);
    AddLocked(top.second);
  }
}

std::optional<std::string> WorkQueue::Get() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutting_down_) return std::nullopt;
    PromoteReadyLocked(Clock::now());
    if (!queue_.empty()) {
      std::string key = std::move(queue_.front());
      queue_.pop_front();
      dirty_.erase(key);
      processing_.insert(key);
      return key;
    }
    if (delayed_.empty()) {
      cv_.wait(lock);
    } else {
      // A copy: wait_until reads its deadline again after waking, and while
      // it waits an AddAfter may grow the heap and move the element.
      const Clock::time_point deadline = delayed_.top().first;
      cv_.wait_until(lock, deadline);
    }
  }
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) && !shutting_down_) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::ShutDown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  cv_.notify_all();
}

bool WorkQueue::ShuttingDown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

size_t WorkQueue::Len() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace pstar::op
