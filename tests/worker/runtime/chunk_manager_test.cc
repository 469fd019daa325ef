#include "worker/runtime/chunk_manager.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/worker/dist/thread_group_communicator.h"

namespace pstar {
namespace {

constexpr int64_t kChunkBytes = 256;  // 64 floats

std::unique_ptr<ChunkManager> Make(int32_t num_chunks, int32_t slots, EvictionPolicy policy,
                                   int32_t prefetch_depth) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = 128 + int64_t(slots) * kChunkBytes;
  o.eviction = policy;
  o.prefetch_depth = prefetch_depth;
  o.min_chunks_per_moment = 1;
  auto m = ChunkManager::Create(num_chunks, kChunkBytes, MakeCpuBackend(), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

void ReadMoment(ChunkManager& m, int32_t chunk) {
  ChunkAccess a{{StateKind::kParam, chunk}, false};
  m.Access({&a, 1});
  m.Release({&a, 1});
}

int64_t H2D(const ChunkManager& m) { return m.counters().moved_bytes[int(Direction::kHostToDevice)]; }
int64_t D2H(const ChunkManager& m) { return m.counters().moved_bytes[int(Direction::kDeviceToHost)]; }

// Steps of the cyclic sequence 0, 1, ..., n-1; returns the bytes moved after the first step.
int64_t CyclicSteps(ChunkManager& m, int32_t n, int steps) {
  int64_t after_warmup = 0;
  for (int s = 0; s < steps; ++s) {
    m.BeginStep();
    for (int32_t c = 0; c < n; ++c) ReadMoment(m, c);
    m.EndStep();
    if (s == 0) after_warmup = H2D(m) + D2H(m);
  }
  return H2D(m) + D2H(m) - after_warmup;
}

TEST(ChunkManager, OptMovesStrictlyLessThanLruOnACycle) {
  // Three chunks cycled through two slots: LRU evicts exactly the chunk needed
  // next and misses every access; OPT keeps one chunk resident across the cycle.
  auto opt = Make(3, 2, EvictionPolicy::kOpt, 0);
  auto lru = Make(3, 2, EvictionPolicy::kLru, 0);
  const int64_t opt_bytes = CyclicSteps(*opt, 3, 6);
  const int64_t lru_bytes = CyclicSteps(*lru, 3, 6);
  EXPECT_EQ(lru_bytes, 5 * 3 * kChunkBytes);
  EXPECT_LT(opt_bytes, lru_bytes);
  EXPECT_TRUE(opt->trace_valid());
  EXPECT_EQ(opt->trace_moments(), 3);
}

TEST(ChunkManager, DataSurvivesEvictionAndCleanCopiesAreDropped) {
  auto m = Make(4, 2, EvictionPolicy::kLru, 0);
  for (int32_t c = 0; c < 4; ++c) {
    float* p = m->HostWrite({StateKind::kParam, c});
    for (int i = 0; i < 64; ++i) p[i] = float(c * 100 + i);
  }
  m->ZeroFill(StateKind::kGrad);
  // Write every grad chunk on the device; only two fit, so dirty ones go home.
  for (int32_t c = 0; c < 4; ++c) {
    ChunkAccess a[2] = {{{StateKind::kParam, c}, false}, {{StateKind::kGrad, c}, true}};
    m->Access(a);
    float* g = m->DeviceData({StateKind::kGrad, c});
    const float* p = m->DeviceData({StateKind::kParam, c});
    for (int i = 0; i < 64; ++i) g[i] = 2 * p[i];
    m->Release(a);
  }
  EXPECT_GT(D2H(*m), 0);
  // Param copies were clean: dropped, never written back. Every D2H byte is a grad.
  EXPECT_EQ(D2H(*m) % kChunkBytes, 0);
  EXPECT_LE(D2H(*m), 4 * kChunkBytes);
  for (int32_t c = 0; c < 4; ++c) {
    const float* g = m->HostRead({StateKind::kGrad, c});
    for (int i = 0; i < 64; ++i) ASSERT_EQ(g[i], 2.0f * float(c * 100 + i)) << c << " " << i;
  }
  EXPECT_EQ(m->counters().evictions[int(StateKind::kParam)] + m->counters().evictions[int(StateKind::kGrad)],
            6);  // 8 loads into 2 slots
}

TEST(ChunkManager, ZeroChunksNeedNoCopy) {
  auto m = Make(2, 4, EvictionPolicy::kOpt, 2);
  m->ZeroFill(StateKind::kGrad);
  ChunkAccess a{{StateKind::kGrad, 1}, true};
  m->Access({&a, 1});
  const float* g = m->DeviceData(a.key);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(g[i], 0.0f);
  m->Release({&a, 1});
  EXPECT_EQ(H2D(*m), 0);
  EXPECT_EQ(m->counters().prefetches, 0);  // a fill is not a transfer
}

TEST(ChunkManager, AChangedSequenceInvalidatesAndReRecordsTheTrace) {
  auto m = Make(3, 2, EvictionPolicy::kOpt, 0);
  CyclicSteps(*m, 3, 2);
  EXPECT_TRUE(m->trace_valid());
  EXPECT_EQ(m->trace_recordings(), 1);
  m->BeginStep();
  ReadMoment(*m, 2);  // a different first moment
  EXPECT_FALSE(m->trace_valid());
  ReadMoment(*m, 0);
  m->EndStep();
  EXPECT_TRUE(m->trace_valid());
  EXPECT_EQ(m->trace_recordings(), 2);
  EXPECT_EQ(m->trace_moments(), 2);
}

TEST(ChunkManager, AStepLongerThanTheTraceFallsBackToLru) {
  // One slot; the recorded step is [A]. A step [A], [B] runs past the trace:
  // eviction must not consult it (every chunk would look needed "now").
  auto m = Make(2, 1, EvictionPolicy::kOpt, 2);
  m->BeginStep();
  ReadMoment(*m, 0);
  m->EndStep();
  m->BeginStep();
  ReadMoment(*m, 0);
  EXPECT_TRUE(m->trace_valid());
  ReadMoment(*m, 1);
  EXPECT_FALSE(m->trace_valid());
  m->EndStep();
  EXPECT_EQ(m->trace_moments(), 2);
  CyclicSteps(*m, 2, 2);  // and the re-recorded trace serves the next steps
  EXPECT_TRUE(m->trace_valid());
}

TEST(ChunkManager, PrefetchBringsTheNextMomentsChunksAndCountsHits) {
  auto m = Make(6, 3, EvictionPolicy::kOpt, 2);
  CyclicSteps(*m, 6, 3);
  EXPECT_GT(m->counters().prefetches, 0);
  EXPECT_GT(m->counters().prefetch_hits, 0);
  EXPECT_LE(m->counters().prefetch_hits, m->counters().prefetches);
}

TEST(ChunkManager, NeverExceedsItsBudgetAtAnyMoment) {
  for (int32_t slots : {1, 2, 5}) {
    auto m = Make(5, slots, EvictionPolicy::kOpt, 3);
    int64_t moments = 0;
    m->SetMomentObserver([&](const ChunkManager& cm) {
      ++moments;
      // Count the resident chunks one by one, independently of the slot counter.
      int64_t resident = 0;
      for (int k = 0; k < kNumStateKinds; ++k) {
        for (int32_t c = 0; c < 5; ++c) resident += cm.OnDevice({StateKind(k), c});
      }
      ASSERT_LE(resident, slots);
      ASSERT_EQ(128 + resident * kChunkBytes, cm.device_bytes_in_use());
      ASSERT_LE(cm.device_bytes_in_use(), cm.device_capacity_bytes());
    });
    CyclicSteps(*m, 5, 4);
    EXPECT_EQ(moments, 20);
    EXPECT_LE(m->peak_device_bytes(), m->device_capacity_bytes());
    EXPECT_EQ(m->peak_device_bytes(), 128 + std::min(slots, 5) * kChunkBytes);
  }
}

TEST(ChunkManager, TooSmallABudgetNamesNeededAndAvailableBytes) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 1000;
  o.min_chunks_per_moment = 4;
  o.device_capacity_bytes = 1024 + 3 * kChunkBytes;
  auto m = ChunkManager::Create(8, kChunkBytes, MakeCpuBackend(), o);
  ASSERT_FALSE(m.ok());
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("need at least " + std::to_string(1024 + 4 * kChunkBytes) + " bytes"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("available " + std::to_string(1024 + 3 * kChunkBytes) + " bytes"), std::string::npos)
      << msg;
}

// A communicator that says its collectives take GPU memory (as NCCL's do).
class GpuBufferCommunicator final : public Communicator {
 public:
  explicit GpuBufferCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  bool device_buffers() const override { return true; }
  Status AllGather(const float* shard, float* full, int64_t n) override { return inner_->AllGather(shard, full, n); }
  Status ReduceScatter(const float* full, float* shard, int64_t n) override {
    return inner_->ReduceScatter(full, shard, n);
  }
  Status AllReduceSum(double* data, int64_t n) override { return inner_->AllReduceSum(data, n); }
  Status Broadcast(void* data, int64_t bytes, int root) override { return inner_->Broadcast(data, bytes, root); }
  Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

TEST(ChunkManager, ShardedChunksNeedACommunicatorForTheTiersMemory) {
  // Host-memory tier (the CPU backend) with a GPU-memory communicator: refused
  // before any collective could read host pointers as device ones.
  auto comms = test::MakeThreadGroupCommunicators(2);
  GpuBufferCommunicator gpu_comm(std::move(comms[0]));
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  auto m = ChunkManager::Create(2, 2 * kChunkBytes, MakeCpuBackend(), o, &gpu_comm);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("GPU memory"), std::string::npos) << m.status().message();
  // The same tier with a host-memory communicator is fine.
  auto fine = ChunkManager::Create(2, 2 * kChunkBytes, MakeCpuBackend(), o, comms[1].get());
  EXPECT_TRUE(fine.ok()) << fine.status().message();
}

TEST(ChunkManager, ALargerBudgetThanEverythingIsClampedToEverything) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = int64_t(64) << 30;
  EXPECT_EQ(ChunkManager::DeviceCapacity(3, kChunkBytes, o), 128 + 4 * 3 * kChunkBytes);
  EXPECT_EQ(ChunkManager::DeviceSlots(3, kChunkBytes, o), 12);
}

TEST(ChunkManagerDeathTest, MisuseAbortsWithTheReason) {
  auto m = Make(2, 2, EvictionPolicy::kOpt, 0);
  ChunkAccess twice[2] = {{{StateKind::kParam, 0}, false}, {{StateKind::kParam, 0}, false}};
  EXPECT_DEATH(m->Access(twice), "listed twice");
  ChunkAccess write{{StateKind::kGrad, 0}, true};
  EXPECT_DEATH(
      {
        m->Access({&write, 1});
        (void)m->HostRead(write.key);
      },
      "writing on the device");
}

TEST(ChunkManager, HybridAdamUsesRoomBeyondParamsAndGrads) {
  ChunkRuntimeOptions o;
  o.margin_use_ratio = 1.0;
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 19, o), 0);   // params and grads do not all fit
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 26, o), 3);   // 6 spare slots: 3 chunks' moments
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 40, o), 10);  // everything fits
  o.margin_use_ratio = 0.5;
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 26, o), 1);
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 38, o), 4);   // the margin holds back part of the room
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 40, o), 10);  // room for everything: no margin needed
  o.hybrid_adam = false;
  EXPECT_EQ(ChunkManager::DeviceAdamChunks(10, 40, o), 0);
}

}  // namespace
}  // namespace pstar
