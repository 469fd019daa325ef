// Collectives under compute (runtime.comm_overlap): with N ranks on a queued
// communicator, a chunk's gather is waited for only where the chunk is used
// and a final gradient's reduce-scatter only where its home is read. Each
// test holds one collective back (the gate) and checks what the ranks can
// still do meanwhile; a rank that waited for it would sit until the gate's
// deadline, which the test reports.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/worker/dist/thread_group_communicator.h"
#include "worker/runtime/chunk_manager.h"

namespace pstar {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 2;
constexpr int64_t kChunkBytes = 512;  // 128 floats, 64 per rank
constexpr int64_t kShardFloats = kChunkBytes / 4 / kWorld;

// Holds back the collectives `held` picks until Open, or a deadline (then
// `timed_out` says the rank waited for one it should not have).
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Pass(std::chrono::milliseconds deadline) {
    ++held;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, deadline, [&] { return open_; })) {
      timed_out = true;
      open_ = true;
    }
  }
  std::atomic<bool> timed_out{false};
  std::atomic<int> held{0};  // collectives that came to the gate

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class GatedCommunicator final : public Communicator {
 public:
  using Held = std::function<bool(CollectiveOp op, const float* input)>;
  GatedCommunicator(std::unique_ptr<Communicator> inner, Gate* gate, Held held, std::chrono::milliseconds deadline)
      : inner_(std::move(inner)), gate_(gate), held_(std::move(held)), deadline_(deadline) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Status AllGather(const float* shard, float* full, int64_t n) override {
    if (held_(CollectiveOp::kAllGather, shard)) gate_->Pass(deadline_);
    return inner_->AllGather(shard, full, n);
  }
  Status ReduceScatter(const float* full, float* shard, int64_t n) override {
    if (held_(CollectiveOp::kReduceScatter, full)) gate_->Pass(deadline_);
    return inner_->ReduceScatter(full, shard, n);
  }
  Status AllReduceSum(double* data, int64_t n) override { return inner_->AllReduceSum(data, n); }
  Status Broadcast(void* data, int64_t bytes, int root) override { return inner_->Broadcast(data, bytes, root); }
  Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<Communicator> inner_;
  Gate* gate_;
  Held held_;
  std::chrono::milliseconds deadline_;
};

// Runs `body(rank, manager)` on kWorld threads, each rank's manager on a
// queued communicator whose collectives `held` picks wait for the gate.
void RunRanks(const ChunkRuntimeOptions& options, int32_t num_chunks, Gate& gate, GatedCommunicator::Held held,
              std::chrono::milliseconds deadline, const std::function<void(int, ChunkManager&)>& body) {
  auto inner = test::MakeThreadGroupCommunicators(kWorld);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& c : inner) {
    comms.push_back(MakeQueuedCommunicator(std::make_unique<GatedCommunicator>(std::move(c), &gate, held, deadline)));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto m = ChunkManager::Create(num_chunks, kChunkBytes, MakeCpuBackend(), options, comms[size_t(r)].get());
      ASSERT_TRUE(m.ok()) << m.status().message();
      body(r, **m);
    });
  }
  for (auto& t : threads) t.join();
}

ChunkRuntimeOptions Options(int32_t slots, bool overlap) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = 128 + int64_t(slots) * kChunkBytes;
  o.min_chunks_per_moment = 1;
  o.prefetch_depth = 1;
  o.hybrid_adam = false;
  o.comm_overlap = overlap;
  return o;
}

void Use(ChunkManager& m, ChunkKey key, bool writes) {
  ChunkAccess a{key, writes};
  m.Access({&a, 1});
  m.Release({&a, 1});
}

TEST(ChunkManagerCollectives, AFinalGradientsReduceScatterRunsUnderTheComputeAndItsHomeWaitsForIt) {
  for (bool overlap : {true, false}) {
    Gate gate;
    std::atomic<int> computed_while_held{0};
    // Gradient chunk 0's partials start with 100 + rank: its reduce-scatter is held.
    auto held = [](CollectiveOp op, const float* in) { return op == CollectiveOp::kReduceScatter && in[0] >= 100; };
    RunRanks(Options(4, overlap), 3, gate, held, overlap ? 10s : 300ms, [&](int rank, ChunkManager& m) {
      m.ZeroFill(StateKind::kGrad);
      for (int32_t c = 0; c < 2; ++c) {
        ChunkAccess a{{StateKind::kGrad, c}, true};
        m.Access({&a, 1});
        float* g = m.DeviceData(a.key);
        for (int64_t i = 0; i < kChunkBytes / 4; ++i) g[i] = float(c == 0 ? 100 + rank : rank) + float(i);
        m.Release({&a, 1});
      }
      m.StartGradReduce(0);
      EXPECT_FALSE(m.OnDevice({StateKind::kGrad, 0}));  // its slot is free for what comes next
      // The compute goes on: another gradient is written meanwhile.
      ChunkAccess next{{StateKind::kGrad, 1}, true};
      m.Access({&next, 1});
      m.DeviceData(next.key)[0] += 1.0f;
      m.Release({&next, 1});
      if (!gate.timed_out) ++computed_while_held;
      if (rank == 0) {
        while (computed_while_held.load() < kWorld && !gate.timed_out) std::this_thread::yield();
        gate.Open();
      }
      // The home is read only after the sum landed in it.
      const float* home = m.HostRead({StateKind::kGrad, 0});
      for (int64_t i = 0; i < kShardFloats; ++i) {
        const float element = float(rank * kShardFloats + i);
        ASSERT_EQ(home[i], 100.0f + 101.0f + 2 * element) << "rank " << rank << " element " << i;
      }
      m.Flush(StateKind::kGrad);
    });
    EXPECT_EQ(gate.held.load(), kWorld);
    if (overlap) {
      EXPECT_FALSE(gate.timed_out.load()) << "a rank waited for the held reduce-scatter";
      EXPECT_EQ(computed_while_held.load(), kWorld);
    } else {
      EXPECT_TRUE(gate.timed_out.load()) << "without overlap each collective is waited for as it starts";
    }
  }
}

TEST(ChunkManagerCollectives, AGatherAheadIsWaitedForOnlyWhereItsChunkIsUsed) {
  Gate gate;
  std::atomic<bool> hold{false};
  std::atomic<int> used_first{0};
  // Param chunk 1's home holds 2s: once armed, its gather is held.
  auto held = [&](CollectiveOp op, const float* in) { return hold && op == CollectiveOp::kAllGather && in[0] == 2.0f; };
  RunRanks(Options(2, true), 4, gate, held, 10s, [&](int rank, ChunkManager& m) {
    for (int32_t c = 0; c < 4; ++c) {
      float* p = m.HostWrite({StateKind::kParam, c});
      for (int64_t i = 0; i < kShardFloats; ++i) p[i] = float(c + 1);
    }
    // A step records the trace: 0, 1, 2, 3 (two slots: each use loads, and
    // the step ends with chunk 0 prefetched beside 2).
    m.BeginStep();
    for (int32_t c = 0; c < 4; ++c) Use(m, {StateKind::kParam, c}, false);
    m.EndStep();
    EXPECT_FALSE(m.OnDevice({StateKind::kParam, 1}));
    if (rank == 0) hold = true;
    while (!hold) std::this_thread::yield();
    // The next step's use of chunk 0 prefetches chunk 1 (held): the use
    // goes on without it.
    m.BeginStep();
    ChunkAccess first{{StateKind::kParam, 0}, false};
    m.Access({&first, 1});
    EXPECT_EQ(m.DeviceData(first.key)[int64_t(rank) * kShardFloats], 1.0f);
    m.Release({&first, 1});
    EXPECT_TRUE(m.OnDevice({StateKind::kParam, 1})) << "chunk 1 was not prefetched";
    if (!gate.timed_out) ++used_first;
    if (rank == 0) {
      while (used_first.load() < kWorld && !gate.timed_out) std::this_thread::yield();
      gate.Open();
    }
    // Its use waits for its gather, and sees every rank's shard.
    ChunkAccess second{{StateKind::kParam, 1}, false};
    m.Access({&second, 1});
    const float* p = m.DeviceData(second.key);
    for (int64_t i = 0; i < kChunkBytes / 4; ++i) ASSERT_EQ(p[i], 2.0f) << "element " << i;
    m.Release({&second, 1});
    Use(m, {StateKind::kParam, 2}, false);
    Use(m, {StateKind::kParam, 3}, false);
    m.EndStep();
  });
  EXPECT_EQ(gate.held.load(), kWorld) << "chunk 1's gather never came to the gate";
  EXPECT_FALSE(gate.timed_out.load()) << "a rank waited for a gather it did not use yet";
  EXPECT_EQ(used_first.load(), kWorld);
}

TEST(ChunkManagerCollectives, AGradientDoesNotWaitForAReduceScatterWhileAParamDoneForTheStepHoldsASlot) {
  Gate gate;
  std::atomic<int> loaded_while_held{0};
  // In the second step gradient chunk 1's partials start at 100 + rank: that
  // reduce-scatter is held.
  auto held = [](CollectiveOp op, const float* in) { return op == CollectiveOp::kReduceScatter && in[0] >= 100.0f; };
  RunRanks(Options(3, true), 2, gate, held, 10s, [&](int rank, ChunkManager& m) {
    for (int32_t c = 0; c < 2; ++c) {
      float* p = m.HostWrite({StateKind::kParam, c});
      for (int64_t i = 0; i < kShardFloats; ++i) p[i] = float(c + 1);
    }
    // Forward over params 0 and 1, backward over 1 then 0, each gradient
    // reduce-scattered as it is final. Three slots: when gradient 0 comes,
    // gradient 1's slot is still being read and params 0 and 1 hold the
    // others; param 1 is not used again this step.
    const auto step = [&](bool armed) {
      m.BeginStep();
      m.ZeroFill(StateKind::kGrad);
      Use(m, {StateKind::kParam, 0}, false);
      Use(m, {StateKind::kParam, 1}, false);
      for (int32_t c : {1, 0}) {
        ChunkAccess a[2] = {{{StateKind::kParam, c}, false}, {{StateKind::kGrad, c}, true}};
        m.Access(a);
        float* g = m.DeviceData(a[1].key);
        for (int64_t i = 0; i < kChunkBytes / 4; ++i) g[i] = float(armed && c == 1 ? 100 + rank : rank) + float(i);
        m.Release(a);
        if (c == 0 && armed && !gate.timed_out) ++loaded_while_held;
        m.StartGradReduce(c);
      }
      if (armed && rank == 0) {
        while (loaded_while_held.load() < kWorld && !gate.timed_out) std::this_thread::yield();
        gate.Open();
      }
      const float* home = m.HostRead({StateKind::kGrad, 1});
      for (int64_t i = 0; i < kShardFloats; ++i) {
        const float element = float(rank * kShardFloats + i);
        const float expected = armed ? 100.0f + 101.0f + 2 * element : 0.0f + 1.0f + 2 * element;
        ASSERT_EQ(home[i], expected) << "rank " << rank << " element " << i;
      }
      m.EndStep();
    };
    step(false);  // records the trace
    step(true);
    EXPECT_FALSE(m.OnDevice({StateKind::kParam, 1})) << "param 1 kept its slot";
  });
  EXPECT_EQ(gate.held.load(), kWorld) << "gradient 1's reduce-scatter never came to the gate";
  EXPECT_FALSE(gate.timed_out.load()) << "a rank waited for a reduce-scatter to load a gradient";
  EXPECT_EQ(loaded_while_held.load(), kWorld);
}

}  // namespace
}  // namespace pstar
