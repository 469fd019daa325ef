#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "worker/dist/communicator.h"

namespace pstar {

namespace {

class QueuedCommunicator final : public Communicator {
 public:
  explicit QueuedCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)), thread_([this] { Run(); }) {}

  ~QueuedCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_ready_.notify_one();
    thread_.join();
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  bool device_buffers() const override { return inner_->device_buffers(); }
  bool queued() const override { return true; }
  const CollectiveCounters& counters() const override { return inner_->counters(); }

  Status AllGather(const float* shard, float* full, int64_t shard_elems) override {
    return Direct([&](Communicator& c) { return c.AllGather(shard, full, shard_elems); });
  }
  Status ReduceScatter(const float* full, float* shard, int64_t shard_elems) override {
    return Direct([&](Communicator& c) { return c.ReduceScatter(full, shard, shard_elems); });
  }
  Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t shard_elems, HalfFormat format) override {
    return Direct([&](Communicator& c) { return c.ReduceScatterHalf(full, shard, shard_elems, format); });
  }
  Status AllReduceSum(double* data, int64_t n) override {
    return Direct([&](Communicator& c) { return c.AllReduceSum(data, n); });
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    return Direct([&](Communicator& c) { return c.Broadcast(data, bytes, root); });
  }
  Status Barrier() override {
    return Direct([&](Communicator& c) { return c.Barrier(); });
  }

  CollectiveTicket Start(std::function<Status(Communicator&)> work) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    const CollectiveTicket ticket = ++started_;
    work_ready_.notify_one();
    return ticket;
  }

  bool Done(CollectiveTicket ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ >= ticket;
  }

  int64_t waited_nanoseconds() const override { return waited_ns_.load(); }

  Status Wait(CollectiveTicket ticket) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (done_ < ticket) {
      const auto start = std::chrono::steady_clock::now();
      work_done_.wait(lock, [&] { return done_ >= ticket; });
      waited_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                        .count();
    }
    if (!failure_.ok() && failed_at_ <= ticket) return failure_;
    return Status();
  }

 private:
  // A direct call: on the queue's thread (from inside started work) it runs
  // at once; elsewhere it is queued and waited for.
  template <typename Fn>
  Status Direct(Fn fn) {
    if (std::this_thread::get_id() == thread_.get_id()) return fn(*inner_);
    Status result;
    const CollectiveTicket ticket = Start([&](Communicator& c) {
      result = fn(c);
      return result;
    });
    Status waited = Wait(ticket);
    return result.ok() ? waited : result;
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      std::function<Status(Communicator&)> work = std::move(queue_.front());
      queue_.pop_front();
      const bool broken = !failure_.ok();
      lock.unlock();
      // After a failure the inner communicator refuses every call with its
      // first failure; work is not run, so nothing is read or written.
      Status s = broken ? Status() : work(*inner_);
      lock.lock();
      ++done_;
      if (!s.ok() && failure_.ok()) {
        failure_ = std::move(s);
        failed_at_ = done_;
      }
      work_done_.notify_all();
    }
  }

  std::unique_ptr<Communicator> inner_;
  std::mutex mu_;
  std::condition_variable work_ready_, work_done_;
  std::deque<std::function<Status(Communicator&)>> queue_;
  CollectiveTicket started_ = 0, done_ = 0, failed_at_ = 0;
  Status failure_;
  bool stopping_ = false;
  std::atomic<int64_t> waited_ns_{0};
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace

std::unique_ptr<Communicator> MakeQueuedCommunicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<QueuedCommunicator>(std::move(inner));
}

}  // namespace pstar
