#include "tests/worker/dist/thread_group_communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

namespace pstar::test {

namespace {

// What every rank of the group shares: one posted pointer per rank and a
// reusable barrier.
struct Group {
  explicit Group(int n) : size(n), posted(size_t(n), nullptr), calls(size_t(n)) {}

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t gen = generation;
    if (++waiting == size) {
      waiting = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }

  const int size;
  std::vector<const void*> posted;
  std::vector<std::pair<int, int64_t>> calls;  // per rank: the op and size it posted
  std::mutex mu;
  std::condition_variable cv;
  int waiting = 0;
  int64_t generation = 0;
};

class ThreadGroupCommunicator final : public Communicator {
 public:
  ThreadGroupCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_->size; }

  Status AllGather(const float* shard, float* full, int64_t n) override {
    PSTAR_RETURN_IF_ERROR(Post(shard, 0, n));
    for (int r = 0; r < group_->size; ++r) {
      const float* src = static_cast<const float*>(group_->posted[size_t(r)]);
      if (src != full + r * n) std::memmove(full + r * n, src, size_t(n) * sizeof(float));
    }
    group_->Barrier();  // every rank has read every shard
    return Status();
  }

  Status ReduceScatter(const float* full, float* shard, int64_t n) override {
    PSTAR_RETURN_IF_ERROR(Post(full, 1, n));
    std::vector<float> out(size_t(n), 0.0f);
    for (int r = 0; r < group_->size; ++r) {
      const float* src = static_cast<const float*>(group_->posted[size_t(r)]) + int64_t(rank_) * n;
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] += src[i];
    }
    group_->Barrier();
    std::memcpy(shard, out.data(), size_t(n) * sizeof(float));
    return Status();
  }

  Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t n, HalfFormat format) override {
    PSTAR_RETURN_IF_ERROR(Post(full, 4, n));
    // In rank order, each partial sum rounded to the format.
    std::vector<float> acc(static_cast<size_t>(n), 0.0f), x(static_cast<size_t>(n));
    std::vector<uint16_t> rounded(static_cast<size_t>(n));
    for (int r = 0; r < group_->size; ++r) {
      WidenFromHalf(x.data(), static_cast<const uint16_t*>(group_->posted[size_t(r)]) + int64_t(rank_) * n, n, format);
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += x[size_t(i)];
      NarrowToHalf(rounded.data(), acc.data(), n, format);
      WidenFromHalf(acc.data(), rounded.data(), n, format);
    }
    group_->Barrier();
    std::memcpy(shard, rounded.data(), size_t(n) * sizeof(uint16_t));
    return Status();
  }

  Status AllReduceSum(double* data, int64_t n) override {
    PSTAR_RETURN_IF_ERROR(Post(data, 2, n));
    std::vector<double> out(size_t(n), 0.0);
    for (int r = 0; r < group_->size; ++r) {
      const double* src = static_cast<const double*>(group_->posted[size_t(r)]);
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] += src[i];
    }
    group_->Barrier();
    std::memcpy(data, out.data(), size_t(n) * sizeof(double));
    return Status();
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    PSTAR_RETURN_IF_ERROR(Post(data, 3, bytes));
    if (rank_ != root) std::memcpy(data, group_->posted[size_t(root)], size_t(bytes));
    group_->Barrier();
    return Status();
  }

  Status Barrier() override {
    group_->Barrier();
    return Status();
  }

 private:
  // Publishes this rank's buffer and waits until every rank has published;
  // fails (on every rank) when the ranks did not all call the same op and size.
  Status Post(const void* p, int op, int64_t n) {
    group_->posted[size_t(rank_)] = p;
    group_->calls[size_t(rank_)] = {op, n};
    group_->Barrier();
    const auto first = group_->calls[0];
    bool same = true;
    for (const auto& call : group_->calls) same = same && call == first;
    if (same) return Status();
    group_->Barrier();  // every rank has compared before anyone posts again
    return Status::Internal("ranks called different collectives (op or size differs)");
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeThreadGroupCommunicators(int world_size) {
  auto group = std::make_shared<Group>(world_size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<ThreadGroupCommunicator>(group, r));
  return out;
}

}  // namespace pstar::test
