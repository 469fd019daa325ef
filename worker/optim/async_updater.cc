#include "worker/optim/async_updater.h"

#include <chrono>

namespace pstar {

namespace {
double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}
}  // namespace

AsyncUpdater::AsyncUpdater(int32_t num_chunks, std::function<void()> thread_init)
    : pending_(new std::atomic<uint8_t>[size_t(num_chunks)]), num_chunks_(num_chunks) {
  for (int32_t c = 0; c < num_chunks; ++c) pending_[size_t(c)].store(0, std::memory_order_relaxed);
  thread_ = std::thread([this, init = std::move(thread_init)] {
    if (init) init();
    Run();
  });
}

AsyncUpdater::~AsyncUpdater() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return in_flight_ == 0; });
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void AsyncUpdater::Submit(int32_t chunk, int64_t step, std::function<void()> update) {
  Wait(chunk);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[size_t(chunk)].store(1, std::memory_order_release);
    queue_.push_back({chunk, step, std::move(update)});
    ++in_flight_;
    current_step_ = step;
  }
  work_cv_.notify_one();
}

void AsyncUpdater::Wait(int32_t chunk) {
  if (chunk < 0 || chunk >= num_chunks_ || !pending(chunk)) return;
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (pending_[size_t(chunk)].load(std::memory_order_relaxed) == 0) return;
  if (log_ != nullptr) log_->Record(current_step_, ChunkEventKind::kUpdateWait, chunk);
  done_cv_.wait(lock, [&] { return pending_[size_t(chunk)].load(std::memory_order_relaxed) == 0; });
  times_.waited_s += Seconds(start);
}

void AsyncUpdater::Drain() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (in_flight_ == 0) return;
  done_cv_.wait(lock, [this] { return in_flight_ == 0; });
  times_.waited_s += Seconds(start);
}

AsyncUpdater::Times AsyncUpdater::TakeTimes() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(times_, Times{});
}

void AsyncUpdater::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (log_ != nullptr) log_->Record(job.step, ChunkEventKind::kUpdateBegin, job.chunk);
    const auto start = std::chrono::steady_clock::now();
    job.update();
    const double busy = Seconds(start);
    if (log_ != nullptr) log_->Record(job.step, ChunkEventKind::kUpdateEnd, job.chunk);
    job.update = nullptr;  // what it captured goes before the chunk is released
    lock.lock();
    times_.busy_s += busy;
    ++times_.updates;
    --in_flight_;
    pending_[size_t(job.chunk)].store(0, std::memory_order_release);
    done_cv_.notify_all();
  }
}

}  // namespace pstar
