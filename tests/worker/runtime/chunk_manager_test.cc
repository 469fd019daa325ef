#include "worker/runtime/chunk_manager.h"

#include <gtest/gtest.h>

#include <bit>
#include <optional>
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

// A fill costs nothing at its use, so loading one ahead must not evict a
// copy the step needs again: here gradient 2's zeros, wanted two moments
// ahead, would take param 1's slot (next used three ahead) although param 0
// frees one by then; param 1 would then be copied in twice a step.
TEST(ChunkManager, AFillLoadedAheadNeverEvictsACopyTheStepNeedsAgain) {
  auto m = Make(3, 3, EvictionPolicy::kOpt, 8);
  auto use = [&](std::initializer_list<ChunkAccess> accesses) {
    const std::vector<ChunkAccess> a(accesses);
    m->Access(a);
    m->Release(a);
  };
  const ChunkAccess p0{{StateKind::kParam, 0}, false}, p1{{StateKind::kParam, 1}, false},
      p2{{StateKind::kParam, 2}, false}, g1{{StateKind::kGrad, 1}, true}, g2{{StateKind::kGrad, 2}, true};
  int64_t per_step = 0;
  for (int step = 0; step < 3; ++step) {
    const int64_t before = H2D(*m);
    m->BeginStep();
    m->ZeroFill(StateKind::kGrad);
    use({p0});
    use({p1});
    use({p2});
    use({p0});  // param 0's last use this step
    if (step > 0) EXPECT_TRUE(m->OnDevice(p1.key)) << "step " << step << ": param 1 left for gradient 2's zeros";
    use({p2, g2});
    use({p1, g1});
    m->EndStep();
    per_step = H2D(*m) - before;
  }
  EXPECT_TRUE(m->trace_valid());
  // Params 0 and 2 come in once a step; param 1, used last, stays for the next.
  EXPECT_LE(per_step, 2 * kChunkBytes) << "a param was copied in more than once a step";
}

// Four steps of param 0, param 1 three times, param 2 `held_moments`
// times, param 3, param 0, param 1; the bytes copied in by the last.
int64_t HeldChunkStepBytes(ChunkManager& m, int held_moments) {
  int64_t per_step = 0;
  for (int step = 0; step < 4; ++step) {
    const int64_t before = H2D(m);
    m.BeginStep();
    ReadMoment(m, 0);
    for (int k = 0; k < 3; ++k) ReadMoment(m, 1);
    for (int k = 0; k < held_moments; ++k) ReadMoment(m, 2);
    ReadMoment(m, 3);
    ReadMoment(m, 0);
    ReadMoment(m, 1);
    m.EndStep();
    per_step = H2D(m) - before;
  }
  return per_step;
}

// A prefetch waits for a chunk an op holds now rather than evict a copy the
// step needs again sooner: param 3's copy, wanted eight moments ahead while
// param 1 is held, would take param 0's slot (next used nine ahead), although
// param 1 frees its slot two moments later and is next used after param 0;
// param 0 would then be copied in twice a step.
TEST(ChunkManager, APrefetchWaitsForAHeldChunkRatherThanEvictACopyNeededSooner) {
  auto m = Make(4, 3, EvictionPolicy::kOpt, 8);
  const int64_t per_step = HeldChunkStepBytes(*m, 6);
  EXPECT_TRUE(m->trace_valid());
  // Params 1 (evicted for param 3), 2 and 3 come in once a step; param 0 stays.
  EXPECT_LE(per_step, 3 * kChunkBytes) << "a param was copied in more than once a step";
  EXPECT_GT(m->counters().prefetch_hits, 0);
}

// The same wait however little of the lookahead is left when the held chunk
// is released: at depth 16 the prefetch of param 3, five moments ahead,
// waits for param 1's release two moments before that use rather than
// evict param 0, which the step reads again before param 1.
TEST(ChunkManager, ADeepPrefetchWaitsForAHeldChunkReleasedJustInTime) {
  auto m = Make(4, 3, EvictionPolicy::kOpt, 16);
  const int64_t per_step = HeldChunkStepBytes(*m, 2);
  EXPECT_TRUE(m->trace_valid());
  EXPECT_LE(per_step, 3 * kChunkBytes) << "a param was copied in more than once a step";
  EXPECT_GT(m->counters().prefetch_hits, 0);
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
  EXPECT_EQ(TierLayout::DeviceCapacity(3, kChunkBytes, o), 128 + 4 * 3 * kChunkBytes);
  EXPECT_EQ(TierLayout::DeviceSlots(3, kChunkBytes, o), 12);
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

TEST(ChunkManager, FlushStartsTheHostUpdatedGradientsHomeAndKeepsTheDeviceCopies) {
  auto m = Make(3, 3, EvictionPolicy::kOpt, 0);  // no room to home moments: every chunk updates on the host
  ASSERT_EQ(m->device_adam_chunks(), 0);
  m->ZeroFill(StateKind::kGrad);
  for (int32_t c = 0; c < 3; ++c) {
    ChunkAccess a{{StateKind::kGrad, c}, true};
    m->Access({&a, 1});
    float* g = m->DeviceData(a.key);
    for (int i = 0; i < 64; ++i) g[i] = float(c * 64 + i);
    m->Release({&a, 1});
  }
  ASSERT_EQ(D2H(*m), 0);
  m->Flush(StateKind::kGrad);
  EXPECT_EQ(D2H(*m), 3 * kChunkBytes);  // every dirty gradient on its way home
  for (int32_t c = 0; c < 3; ++c) {
    EXPECT_TRUE(m->OnDevice({StateKind::kGrad, c}));  // kept, clean
    const ChunkManager::CurrentCopy current = m->Current({StateKind::kGrad, c});
    EXPECT_TRUE(current.on_device) << "the norm reads the device copy in place";
    const float* g = m->HostRead({StateKind::kGrad, c});
    for (int i = 0; i < 64; ++i) ASSERT_EQ(g[i], float(c * 64 + i));
  }
  EXPECT_EQ(D2H(*m), 3 * kChunkBytes);  // no second copy
  m->Flush(StateKind::kGrad);
  EXPECT_EQ(D2H(*m), 3 * kChunkBytes);  // nothing dirty is left
}

// The CPU backend with a log of stream ordering: which stream each event was
// last recorded on, and every wait a stream was told to make for one.
class StreamOrderLog final : public DeviceBackend {
 public:
  struct Wait {
    StreamKind waiter;
    StreamKind recorded_on;
  };
  StreamOrderLog() : cpu_(MakeCpuBackend()) {}
  const char* name() const override { return cpu_->name(); }
  bool device_is_host_memory() const override { return true; }
  Result<MemoryBlock> AllocateDevice(size_t bytes) override { return cpu_->AllocateDevice(bytes); }
  Result<MemoryBlock> AllocateHost(size_t bytes) override { return cpu_->AllocateHost(bytes); }
  void Copy(void* dst, const void* src, size_t bytes, StreamKind s) override { cpu_->Copy(dst, src, bytes, s); }
  void Zero(void* dst, size_t bytes, StreamKind s) override { cpu_->Zero(dst, bytes, s); }
  void CopyNarrowed(uint16_t* dst, const float* src, int64_t n, HalfFormat f, void* staging, StreamKind s) override {
    cpu_->CopyNarrowed(dst, src, n, f, staging, s);
  }
  void CopyWidened(float* dst, const uint16_t* src, int64_t n, HalfFormat f, void* staging, StreamKind s) override {
    cpu_->CopyWidened(dst, src, n, f, staging, s);
  }
  void Narrow(uint16_t* dst, const float* src, int64_t n, HalfFormat f, StreamKind s) override {
    cpu_->Narrow(dst, src, n, f, s);
  }
  std::unique_ptr<Event> CreateEvent() override { return std::make_unique<LoggedEvent>(); }
  std::unique_ptr<Event> CreateTimingEvent() override { return std::make_unique<LoggedEvent>(); }
  void Record(Event& event, StreamKind stream) override { static_cast<LoggedEvent&>(event).recorded_on = stream; }
  void StreamWait(StreamKind stream, const Event& event) override {
    const auto& e = static_cast<const LoggedEvent&>(event);
    if (e.recorded_on) waits.push_back({stream, *e.recorded_on});
  }
  void Synchronize(const Event&) override {}
  double ElapsedSeconds(const Event&, const Event&) override { return 0; }
  Status CheckErrors() override { return Status::Ok(); }
  void* stream_handle(StreamKind) override { return nullptr; }

  // Waits of `waiter` on work of `recorded_on` logged since index `from`.
  int CountWaits(size_t from, StreamKind waiter, StreamKind recorded_on) const {
    int n = 0;
    for (size_t i = from; i < waits.size(); ++i) n += waits[i].waiter == waiter && waits[i].recorded_on == recorded_on;
    return n;
  }

  std::vector<Wait> waits;

 private:
  struct LoggedEvent final : Event {
    std::optional<StreamKind> recorded_on;
  };
  std::unique_ptr<DeviceBackend> cpu_;
};

TEST(ChunkManager, ReadingFlushedGradientsInPlaceDoesNotWaitForTheirCopiesHome) {
  // After Flush the gradient norm reads every gradient on the device while the
  // copies home run: compute must not wait for the device-to-host stream
  // then. Writing a gradient again must wait for its copy home to have read it.
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = 128 + 3 * kChunkBytes;
  o.eviction = EvictionPolicy::kOpt;
  o.min_chunks_per_moment = 1;
  auto backend = std::make_unique<StreamOrderLog>();
  StreamOrderLog* log = backend.get();
  auto made = ChunkManager::Create(3, kChunkBytes, std::move(backend), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = *made.value();
  ASSERT_EQ(m.device_adam_chunks(), 0);
  m.ZeroFill(StateKind::kGrad);
  for (int32_t c = 0; c < 3; ++c) {
    ChunkAccess a{{StateKind::kGrad, c}, true};
    m.Access({&a, 1});
    m.DeviceData(a.key)[0] = float(c + 1);
    m.Release({&a, 1});
  }
  const size_t before_flush = log->waits.size();
  m.Flush(StateKind::kGrad);
  EXPECT_EQ(log->CountWaits(before_flush, StreamKind::kDeviceToHost, StreamKind::kCompute), 3)
      << "each copy home waits for the gradient's last computation";
  const size_t after_flush = log->waits.size();
  for (int32_t c = 0; c < 3; ++c) {
    const ChunkManager::CurrentCopy g = m.Current({StateKind::kGrad, c});  // how the norm reads
    ASSERT_TRUE(g.on_device);
    EXPECT_EQ(g.data[0], float(c + 1));
  }
  ChunkAccess read{{StateKind::kGrad, 1}, false};
  m.Access({&read, 1});
  m.Release({&read, 1});
  EXPECT_EQ(log->CountWaits(after_flush, StreamKind::kCompute, StreamKind::kDeviceToHost), 0)
      << "a reader on compute waited for a gradient's copy home";
  ChunkAccess write{{StateKind::kGrad, 2}, true};
  m.Access({&write, 1});
  m.Release({&write, 1});
  EXPECT_EQ(log->CountWaits(after_flush, StreamKind::kCompute, StreamKind::kDeviceToHost), 1)
      << "a writer must wait until the copy home has read the old contents";
}

TEST(ChunkManager, EndStepPrefetchesTheNextStepsFirstParams) {
  // Three params cycled through two slots, each rewritten on the host at the
  // end of the step as the host Adam does: the end of the step brings the
  // first moment's fresh param back, and the next step finds it there.
  auto m = Make(3, 2, EvictionPolicy::kOpt, 1);
  for (int step = 0; step < 3; ++step) {
    const int64_t hits = m->counters().prefetch_hits;
    m->BeginStep();
    ChunkAccess first{{StateKind::kParam, 0}, false};
    m->Access({&first, 1});
    if (step > 0) {
      EXPECT_EQ(m->counters().prefetch_hits, hits + 1) << step;
      EXPECT_EQ(m->DeviceData(first.key)[5], float((step - 1) * 1000 + 5)) << "the latest host write";
    }
    m->Release({&first, 1});
    for (int32_t c = 1; c < 3; ++c) ReadMoment(*m, c);
    for (int32_t c = 0; c < 3; ++c) {
      float* p = m->HostWrite({StateKind::kParam, c});  // drops the device copy
      for (int i = 0; i < 64; ++i) p[i] = float(step * 1000 + c * 64 + i);
    }
    EXPECT_FALSE(m->OnDevice({StateKind::kParam, 0}));
    m->EndStep();
    EXPECT_TRUE(m->OnDevice({StateKind::kParam, 0})) << step;
    EXPECT_FALSE(m->OnDevice({StateKind::kParam, 1})) << "prefetch depth 1: one moment ahead";
  }
}

TEST(ChunkManager, SixteenBitGradientHomesAreExactAndMoveHalfTheBytes) {
  for (HalfFormat format : {HalfFormat::kBf16, HalfFormat::kFp16}) {
    ChunkRuntimeOptions o;
    o.non_model_bytes = 128;
    o.grad_home = format;
    o.hybrid_adam = false;
    o.min_chunks_per_moment = 1;
    o.prefetch_depth = 0;
    o.device_capacity_bytes = TierLayout::MinDeviceBytes(kChunkBytes, o) + kChunkBytes;  // two slots
    EXPECT_EQ(TierLayout::StagingBytes(kChunkBytes, o), kChunkBytes);
    auto made = ChunkManager::Create(4, kChunkBytes, MakeCpuBackend(), o);
    ASSERT_TRUE(made.ok()) << made.status().message();
    ChunkManager& m = **made;
    EXPECT_EQ(m.host_bytes(), 4 * 3 * kChunkBytes + 4 * kChunkBytes / 2);
    EXPECT_EQ(m.counters().resident_bytes[int(Tier::kHost)][int(StateKind::kGrad)], 4 * kChunkBytes / 2);
    // Values both formats hold exactly: negative ones, and a subnormal of each.
    auto value = [](int32_t c, int i) { return i == 0 ? -1.5f : i == 1 ? 0x1p-24f : float(c * 64 + i) * -0.25f; };
    m.ZeroFill(StateKind::kGrad);
    for (int32_t c = 0; c < 4; ++c) {  // four gradients through two slots: two are written home
      ChunkAccess a{{StateKind::kGrad, c}, true};
      m.Access({&a, 1});
      float* g = m.DeviceData(a.key);
      for (int i = 0; i < 64; ++i) g[i] += value(c, i);
      m.Release({&a, 1});
    }
    EXPECT_EQ(D2H(m), 2 * kChunkBytes / 2);  // two evictions, half a chunk each
    // Accumulating into a gradient that went home brings it back exactly.
    ChunkAccess again{{StateKind::kGrad, 0}, true};
    m.Access({&again, 1});
    EXPECT_EQ(H2D(m), kChunkBytes / 2);
    float* g0 = m.DeviceData(again.key);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(g0[i], value(0, i)) << i;
    for (int i = 0; i < 64; ++i) g0[i] += value(0, i);
    m.Release({&again, 1});
    m.Flush(StateKind::kGrad);
    for (int32_t c = 0; c < 4; ++c) {
      const float* g = m.HostRead({StateKind::kGrad, c});
      for (int i = 0; i < 64; ++i) {
        const float want = (c == 0 ? 2.0f : 1.0f) * value(c, i);
        ASSERT_EQ(std::bit_cast<uint32_t>(g[i]), std::bit_cast<uint32_t>(want)) << c << " " << i;
      }
    }
    EXPECT_DEATH((void)m.HostWrite({StateKind::kGrad, 1}), "homed in 16 bits");
  }
}

TEST(ChunkManager, EndStepPrefetchNeverWritesADeadGradientHome) {
  // One slot: at the end of the step it holds a dirty gradient, which the
  // next step zeroes. Fetching the next step's first param would have to
  // write it home first; the prefetch gives way instead.
  auto m = Make(1, 1, EvictionPolicy::kOpt, 1);
  for (int step = 0; step < 3; ++step) {
    m->BeginStep();
    m->ZeroFill(StateKind::kGrad);
    ReadMoment(*m, 0);
    ChunkAccess g{{StateKind::kGrad, 0}, true};
    m->Access({&g, 1});
    m->DeviceData(g.key)[0] = 1.0f;
    m->Release({&g, 1});
    const int64_t d2h = D2H(*m);
    m->EndStep();
    EXPECT_EQ(D2H(*m), d2h) << step;
    EXPECT_FALSE(m->OnDevice({StateKind::kParam, 0})) << step;
  }
  EXPECT_EQ(D2H(*m), 0);
}

TEST(ChunkManager, HybridAdamHomesMomentsBeyondTheStreamingReserve) {
  ChunkRuntimeOptions o;
  o.min_chunks_per_moment = 4;
  o.prefetch_depth = 1;
  EXPECT_EQ(TierLayout::StreamingReserve(10, o), 8);  // this moment's chunks and the next one's
  EXPECT_EQ(TierLayout::StreamingReserve(3, o), 6);   // never more than every param and grad chunk
  o.margin_use_ratio = 1.0;
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 9, o), 0);    // one spare slot: no chunk's two moments
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 10, o), 1);
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 19, o), 5);   // params and grads stream, 5 chunks' moments stay
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 26, o), 9);
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 40, o), 10);  // everything fits
  o.margin_use_ratio = 0.5;
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 26, o), 4);
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 38, o), 7);   // the margin holds back part of the room
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 40, o), 10);  // room for everything: no margin needed
  o.hybrid_adam = false;
  EXPECT_EQ(TierLayout::DeviceAdamChunks(10, 40, o), 0);
  EXPECT_EQ(TierLayout::HostHomeBytes(10, 256, 3, o), (40 - 6) * 256);
  o.grad_home = HalfFormat::kBf16;
  EXPECT_EQ(TierLayout::HostHomeBytes(10, 256, 3, o), (30 - 6) * 256 + 10 * 128);  // gradients at half size
}

TEST(ChunkManager, MomentsHomedOnTheDeviceNeverMoveAndTakeNoHostMemory) {
  // 4 chunks, 12 slots, a reserve of 2 x (1 + 1) = 4: (12 - 4) / 2 = 4 chunks' moments would fit, the
  // margin keeps 3 of them; params and grads stream through the 6 slots left.
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = 128 + 12 * kChunkBytes;
  o.min_chunks_per_moment = 2;
  o.prefetch_depth = 1;
  o.margin_use_ratio = 0.75;
  auto made = ChunkManager::Create(4, kChunkBytes, MakeCpuBackend(), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  ASSERT_EQ(m.device_adam_chunks(), 3);
  EXPECT_EQ(m.device_slots(), 12);
  EXPECT_EQ(m.streaming_slots(), 6);
  EXPECT_EQ(m.host_bytes(), (16 - 6) * kChunkBytes);
  EXPECT_EQ(m.device_bytes_in_use(), 128 + 6 * kChunkBytes);  // the homes, from the start
  const RuntimeCounters& rc = m.counters();
  EXPECT_EQ(rc.resident_chunks[int(Tier::kDevice)][int(StateKind::kExpAvg)], 3);
  EXPECT_EQ(rc.resident_chunks[int(Tier::kHost)][int(StateKind::kExpAvg)], 1);
  EXPECT_EQ(rc.resident_bytes[int(Tier::kHost)][int(StateKind::kExpAvgSq)], kChunkBytes);
  for (int32_t c = 0; c < 4; ++c) {
    EXPECT_EQ(m.DeviceHomed({StateKind::kExpAvg, c}), c < 3);
    EXPECT_EQ(m.DeviceHomed({StateKind::kExpAvgSq, c}), c < 3);
    EXPECT_FALSE(m.DeviceHomed({StateKind::kParam, c}));
    EXPECT_FALSE(m.DeviceHomed({StateKind::kGrad, c}));
    EXPECT_EQ(m.OnDevice({StateKind::kExpAvg, c}), c < 3);
  }
  // Moments start at zero, and the host reaches a homed one in place (CPU backend).
  const float* home = m.DeviceHome({StateKind::kExpAvg, 1});
  for (int i = 0; i < 64; ++i) ASSERT_EQ(home[i], 0.0f);
  EXPECT_EQ(m.HostRead({StateKind::kExpAvg, 1}), home);
  EXPECT_EQ(m.HostWrite({StateKind::kExpAvg, 1}), home);
  EXPECT_EQ(m.Current({StateKind::kExpAvg, 1}).data, home);
  EXPECT_TRUE(m.Current({StateKind::kExpAvg, 1}).on_device);
  // Steps that write every moment through the device while params and grads
  // stream: the moments are where they were, with every write, and only
  // params and grads ever moved.
  m.ZeroFill(StateKind::kGrad);
  for (int step = 1; step <= 3; ++step) {
    m.BeginStep();
    for (int32_t c = 0; c < 4; ++c) {
      ChunkAccess a[2] = {{{StateKind::kParam, c}, false}, {{StateKind::kGrad, c}, true}};
      m.Access(a);
      m.Release(a);
    }
    for (int32_t c = 0; c < 3; ++c) {
      ChunkAccess u[3] = {{{StateKind::kParam, c}, true},
                          {{StateKind::kExpAvg, c}, true},
                          {{StateKind::kExpAvgSq, c}, true}};
      m.Access(u);
      float* avg = m.DeviceData({StateKind::kExpAvg, c});
      float* sq = m.DeviceData({StateKind::kExpAvgSq, c});
      EXPECT_EQ(avg, m.DeviceHome({StateKind::kExpAvg, c}));
      for (int i = 0; i < 64; ++i) {
        avg[i] += float(c + 1);
        sq[i] += float(i);
      }
      m.Release(u);
    }
    m.EndStep();
  }
  for (int32_t c = 0; c < 3; ++c) {
    const float* avg = m.Peek({StateKind::kExpAvg, c});
    const float* sq = m.Peek({StateKind::kExpAvgSq, c});
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(avg[i], 3.0f * float(c + 1)) << c << " " << i;
      ASSERT_EQ(sq[i], 3.0f * float(i)) << c << " " << i;
    }
  }
  EXPECT_EQ(rc.evictions[int(StateKind::kExpAvg)] + rc.evictions[int(StateKind::kExpAvgSq)], 0);
  EXPECT_GT(rc.evictions[int(StateKind::kParam)] + rc.evictions[int(StateKind::kGrad)], 0);
  EXPECT_EQ(m.trace_moments(), 7);  // homed chunks stay out of the trace: they never need a slot
  EXPECT_LE(m.peak_device_bytes(), m.device_capacity_bytes());
  // A moment chunk homed on the host still goes through a slot.
  ChunkAccess host_homed{{StateKind::kExpAvg, 3}, false};
  m.Access({&host_homed, 1});
  EXPECT_NE(m.DeviceData(host_homed.key), nullptr);
  m.Release({&host_homed, 1});
}

}  // namespace
}  // namespace pstar
