// 16-bit parameter chunks (ChunkRuntimeOptions::param_device): the fp32
// master stays home, its narrowed copy streams through half-size slots at half
// the bytes, masters of device-Adam chunks are homed on the device and
// narrowed there, and a host write to such a master on a separate-memory
// device lands before the next use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/worker/dist/thread_group_communicator.h"
#include "worker/runtime/chunk_manager.h"

namespace pstar {
namespace {

constexpr int64_t kChunkBytes = 512;  // 128 floats; a 16-bit copy is 256 bytes
constexpr int64_t kElems = kChunkBytes / 4;

ChunkRuntimeOptions HalfOptions(int64_t capacity, bool hybrid) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 128;
  o.device_capacity_bytes = capacity;
  o.min_chunks_per_moment = 2;
  o.min_param_chunks_per_moment = 1;
  o.min_grad_chunks_per_moment = 1;
  o.prefetch_depth = 0;
  o.hybrid_adam = hybrid;
  o.param_device = HalfFormat::kBf16;
  return o;
}

// Values bf16 cannot hold, so a copy that was not narrowed shows.
float Master(int32_t chunk, int64_t i) { return float(chunk * 1000 + i) / 3.0f + 0.001f; }

void WriteMasters(ChunkManager& m, int32_t chunks) {
  for (int32_t c = 0; c < chunks; ++c) {
    float* p = m.HostWrite({StateKind::kParam, c});
    for (int64_t i = 0; i < kElems; ++i) p[i] = Master(c, i);
  }
}

// The 16-bit copy an op reads of param chunk `c`, as the narrowed master wants it.
void ExpectNarrowedCopy(ChunkManager& m, int32_t c, float scale = 1.0f) {
  ChunkAccess a{{StateKind::kParam, c}, false};
  m.Access({&a, 1});
  const uint16_t* got = m.HalfParamData(c);
  std::vector<float> master(static_cast<size_t>(kElems));
  for (int64_t i = 0; i < kElems; ++i) master[size_t(i)] = Master(c, i) * scale;
  std::vector<uint16_t> want(static_cast<size_t>(kElems));
  NarrowToHalf(want.data(), master.data(), kElems, HalfFormat::kBf16);
  EXPECT_EQ(0, std::memcmp(got, want.data(), size_t(kElems) * 2)) << "chunk " << c;
  m.Release({&a, 1});
}

int64_t H2D(const ChunkManager& m) { return m.counters().moved_bytes[int(Direction::kHostToDevice)]; }

TEST(ChunkManagerHalfParams, TheTierSplitsIntoHalfSizeParamSlotsChunkSlotsAndHomes) {
  const int64_t half = kChunkBytes / 2, full = kChunkBytes;
  // Room for everything: 4 param copies, 4 grads, and every master and moment homed.
  ChunkRuntimeOptions all = HalfOptions(0, true);
  EXPECT_EQ(TierLayout::DeviceCapacity(4, kChunkBytes, all), 128 + 4 * half + 4 * full + 12 * full);
  TierLayout::TierSlots t = TierLayout::LayOutSlots(4, kChunkBytes, all);
  EXPECT_EQ(t.half, 4);
  EXPECT_EQ(t.full, 4);
  EXPECT_EQ(t.device_adam_chunks, 4);
  // The minimum: one param copy and one grad, nothing homed.
  ChunkRuntimeOptions least = HalfOptions(128 + half + full, true);
  EXPECT_EQ(TierLayout::MinDeviceBytes(kChunkBytes, least), 128 + half + full);
  t = TierLayout::LayOutSlots(4, kChunkBytes, least);
  EXPECT_EQ(t.half, 1);
  EXPECT_EQ(t.full, 1);
  EXPECT_EQ(t.device_adam_chunks, 0);
  // Past the reserve (prefetch depth 1: two of each), the margin's share of
  // the rest homes chunks at three chunk slots each, what is left streams.
  ChunkRuntimeOptions some = HalfOptions(128 + 2 * (half + full) + 7 * full + half, true);
  some.prefetch_depth = 1;
  some.margin_use_ratio = 0.9;
  t = TierLayout::LayOutSlots(4, kChunkBytes, some);
  EXPECT_EQ(t.device_adam_chunks, 2);  // 7.5 full slots x 0.9 = 6.75: two chunks of three
  EXPECT_EQ(t.half, 3);                // the last 1.5 slots: one more of each
  EXPECT_EQ(t.full, 3);
  // Masters of homed chunks take no host memory; grads stay fp32 here.
  EXPECT_EQ(TierLayout::HostHomeBytes(4, kChunkBytes, 2, some), (2 + 4 + 2 * 2) * kChunkBytes);
  // Without hybrid Adam the room beyond the reserve streams.
  ChunkRuntimeOptions plain = some;
  plain.hybrid_adam = false;
  t = TierLayout::LayOutSlots(4, kChunkBytes, plain);
  EXPECT_EQ(t.device_adam_chunks, 0);
  EXPECT_EQ(t.half, 4);
  EXPECT_EQ(t.full, 4);
}

TEST(ChunkManagerHalfParams, ParamsStreamNarrowedAtHalfTheBytesAndTheMasterStaysExact) {
  // Two param slots for four chunks: every cycle evicts (clean copies, never written home).
  const int64_t capacity = 128 + 2 * (kChunkBytes / 2) + kChunkBytes;
  ChunkRuntimeOptions o = HalfOptions(capacity, false);
  auto made = ChunkManager::Create(4, kChunkBytes, MakeCpuBackend(), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  EXPECT_EQ(m.streaming_slots(), 3);  // two half-size, one chunk-sized
  EXPECT_EQ(m.device_slots(), 3);
  WriteMasters(m, 4);
  for (int round = 0; round < 3; ++round) {
    for (int32_t c = 0; c < 4; ++c) {
      const int64_t before = H2D(m);
      ExpectNarrowedCopy(m, c);
      EXPECT_EQ(H2D(m) - before, kChunkBytes / 2) << "chunk " << c;
      EXPECT_LE(m.device_bytes_in_use(), m.device_capacity_bytes());
    }
  }
  EXPECT_EQ(m.peak_device_bytes(), 128 + kChunkBytes);  // two half-size copies at most
  EXPECT_EQ(m.counters().moved_bytes[int(Direction::kDeviceToHost)], 0);
  // The host still reads (and checkpoints) the exact fp32 master.
  const float* master = m.HostRead({StateKind::kParam, 2});
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(master[i], Master(2, i));
  // A host write (the host Adam) drops the copy; the next use narrows the new master.
  float* p = m.HostWrite({StateKind::kParam, 3});
  for (int64_t i = 0; i < kElems; ++i) p[i] = Master(3, i) * 2.0f;
  float* q = m.HostWrite({StateKind::kParam, 0});
  for (int64_t i = 0; i < kElems; ++i) q[i] = Master(0, i) * 2.0f;
  ExpectNarrowedCopy(m, 3, 2.0f);
  ExpectNarrowedCopy(m, 0, 2.0f);
}

TEST(ChunkManagerHalfParams, DeviceAdamChunksHomeTheirMastersAndNarrowOnTheDevice) {
  ChunkRuntimeOptions o = HalfOptions(0, true);  // everything resident: every chunk's Adam on the device
  auto made = ChunkManager::Create(3, kChunkBytes, MakeCpuBackend(), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  ASSERT_EQ(m.device_adam_chunks(), 3);
  EXPECT_TRUE(m.DeviceHomed({StateKind::kParam, 0}));
  EXPECT_EQ(m.host_bytes(), 3 * kChunkBytes);  // the gradients only
  WriteMasters(m, 3);
  for (int32_t c = 0; c < 3; ++c) ExpectNarrowedCopy(m, c);
  EXPECT_EQ(H2D(m), 0) << "narrowed on the device, nothing crosses";
  // The update writes the master in place; its copy is stale and dropped.
  const auto& device_params = m.counters().resident_chunks[int(Tier::kDevice)][int(StateKind::kParam)];
  EXPECT_EQ(device_params, 6);  // three masters, three copies
  float* master = m.DeviceMasterForUpdate(1);
  EXPECT_EQ(device_params, 5);
  for (int64_t i = 0; i < kElems; ++i) master[i] = Master(1, i) * 3.0f;
  ExpectNarrowedCopy(m, 1, 3.0f);
  ExpectNarrowedCopy(m, 2);
  EXPECT_EQ(m.HostRead({StateKind::kParam, 1})[5], Master(1, 5) * 3.0f);
}

// The CPU backend presented as a device with memory of its own: the chunk
// manager then narrows host masters through its pinned staging buffers and
// writes device-homed masters through a host window.
class SeparateMemoryBackend final : public DeviceBackend {
 public:
  SeparateMemoryBackend() : cpu_(MakeCpuBackend()) {}
  const char* name() const override { return "separate"; }
  bool device_is_host_memory() const override { return false; }
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
    ++device_narrows;
    cpu_->Narrow(dst, src, n, f, s);
  }
  std::unique_ptr<Event> CreateEvent() override { return cpu_->CreateEvent(); }
  std::unique_ptr<Event> CreateTimingEvent() override { return cpu_->CreateTimingEvent(); }
  void Record(Event& event, StreamKind s) override { cpu_->Record(event, s); }
  void StreamWait(StreamKind s, const Event& event) override { cpu_->StreamWait(s, event); }
  void Synchronize(const Event& event) override { cpu_->Synchronize(event); }
  double ElapsedSeconds(const Event& a, const Event& b) override { return cpu_->ElapsedSeconds(a, b); }
  Status CheckErrors() override { return Status::Ok(); }
  void* stream_handle(StreamKind) override { return nullptr; }

  int device_narrows = 0;

 private:
  std::unique_ptr<DeviceBackend> cpu_;
};

TEST(ChunkManagerHalfParams, OnASeparateMemoryDeviceHostWritesToHomedMastersLandBeforeTheNextUse) {
  // Room for two chunks' masters and moments (6 slots) beyond the reserve; the
  // other two chunks' masters stay on the host.
  ChunkRuntimeOptions o = HalfOptions(128 + kChunkBytes / 2 + kChunkBytes + 6 * kChunkBytes, true);
  o.margin_use_ratio = 1.0;
  auto backend = std::make_unique<SeparateMemoryBackend>();
  SeparateMemoryBackend* b = backend.get();
  auto made = ChunkManager::Create(4, kChunkBytes, std::move(backend), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  ASSERT_EQ(m.device_adam_chunks(), 2);
  EXPECT_EQ(TierLayout::ParamStagingBytes(kChunkBytes, o, false), kChunkBytes);
  WriteMasters(m, 4);  // chunks 0 and 1 through the window, 2 and 3 on the host
  for (int round = 0; round < 2; ++round) {
    for (int32_t c = 0; c < 4; ++c) ExpectNarrowedCopy(m, c);
  }
  EXPECT_EQ(b->device_narrows, 4);           // chunks 0 and 1, twice (one param slot)
  EXPECT_EQ(H2D(m), 4 * (kChunkBytes / 2));  // chunks 2 and 3, twice, at half size
  // A write through the window, then the host read of the same master.
  float* p = m.HostWrite({StateKind::kParam, 1});
  for (int64_t i = 0; i < kElems; ++i) p[i] = Master(1, i) * 0.5f;
  EXPECT_EQ(m.HostRead({StateKind::kParam, 1})[7], Master(1, 7) * 0.5f);
  ExpectNarrowedCopy(m, 1, 0.5f);
}

TEST(ChunkManagerHalfParams, ALargeChunkGoesUpInPiecesThroughTwoSmallBuffers) {
  // 40 MiB of fp32 master: 20 MiB of 16-bit copy, more than one staging piece,
  // while the pinned staging stays two pieces whatever the chunk size.
  const int64_t bytes = int64_t{40} << 20, n = bytes / 4;
  ChunkRuntimeOptions o = HalfOptions(0, false);
  EXPECT_EQ(TierLayout::ParamStagingBytes(bytes, o, false), int64_t{32} << 20);
  EXPECT_EQ(TierLayout::ParamStagingBytes(bytes, o, true), 0);
  auto made = ChunkManager::Create(1, bytes, std::make_unique<SeparateMemoryBackend>(), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  float* master = m.HostWrite({StateKind::kParam, 0});
  for (int64_t i = 0; i < n; ++i) master[i] = float(i % 100003) / 7.0f - 5000.0f;
  std::vector<uint16_t> want(static_cast<size_t>(n));
  NarrowToHalf(want.data(), master, n, HalfFormat::kBf16);
  ChunkAccess a{{StateKind::kParam, 0}, false};
  m.Access({&a, 1});
  EXPECT_EQ(0, std::memcmp(m.HalfParamData(0), want.data(), size_t(n) * 2));
  m.Release({&a, 1});
  EXPECT_EQ(H2D(m), bytes / 2);
}

TEST(ChunkManagerHalfParams, RanksGatherTheirNarrowedShards) {
  constexpr int kWorld = 2;
  auto comms = test::MakeThreadGroupCommunicators(kWorld);
  std::vector<std::thread> ranks;
  std::vector<int> ok(kWorld, 0);
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      ChunkRuntimeOptions o = HalfOptions(128 + kChunkBytes / 2 + kChunkBytes, false);
      auto made = ChunkManager::Create(3, kChunkBytes, MakeCpuBackend(), o, comms[size_t(r)].get());
      if (!made.ok()) return;
      ChunkManager& m = **made;
      const int64_t shard = kElems / kWorld;
      for (int32_t c = 0; c < 3; ++c) {
        float* p = m.HostWrite({StateKind::kParam, c});
        for (int64_t i = 0; i < shard; ++i) p[i] = Master(c, r * shard + i);
      }
      bool same = true;
      for (int32_t c = 0; c < 3; ++c) {
        ChunkAccess a{{StateKind::kParam, c}, false};
        m.Access({&a, 1});
        std::vector<float> master(static_cast<size_t>(kElems));
        for (int64_t i = 0; i < kElems; ++i) master[size_t(i)] = Master(c, i);
        std::vector<uint16_t> want(static_cast<size_t>(kElems));
        NarrowToHalf(want.data(), master.data(), kElems, HalfFormat::kBf16);
        same = same && std::memcmp(m.HalfParamData(c), want.data(), size_t(kElems) * 2) == 0;
        m.Release({&a, 1});
      }
      // Each rank moved its own shard, at half size.
      ok[size_t(r)] = same && H2D(m) == 3 * kChunkBytes / kWorld / 2;
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(ok[size_t(r)]) << "rank " << r;
}

TEST(ChunkManagerHalfParamsDeathTest, A16BitParamCopyIsReadOnly) {
  ChunkRuntimeOptions o = HalfOptions(0, false);
  auto made = ChunkManager::Create(2, kChunkBytes, MakeCpuBackend(), o);
  ASSERT_TRUE(made.ok());
  ChunkAccess a{{StateKind::kParam, 0}, true};
  EXPECT_DEATH((*made)->Access({&a, 1}), "read-only");
  EXPECT_DEATH((void)(*made)->DeviceData({StateKind::kParam, 0}), "16-bit param");
}

}  // namespace
}  // namespace pstar
