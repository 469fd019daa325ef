#include "worker/runtime/host_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "worker/runtime/tier_layout.h"

#include "tests/worker/runtime/runtime_test_fixtures.h"

namespace pstar {
namespace {

using test::Placement;

TEST(ChunkPlacement, HomesEveryChunkOnceAndStreamsWhatIsNotHomedOnTheDevice) {
  const ChunkPlacement p = Placement(5, 2, true, false);
  for (int32_t i = 0; i < p.total(); ++i) {
    const ChunkKey k = p.KeyOf(i);
    EXPECT_EQ(p.Index(k), i);
    const bool moment = k.kind == StateKind::kExpAvg || k.kind == StateKind::kExpAvgSq;
    EXPECT_EQ(p.DeviceHomed(i), k.chunk < 2 && (moment || k.kind == StateKind::kParam)) << i;
    EXPECT_EQ(p.HalfParam(i), k.kind == StateKind::kParam);
    EXPECT_EQ(p.Streams(i), !p.DeviceHomed(i) || k.kind == StateKind::kParam);
  }
  const ChunkPlacement fp32 = Placement(5, 2, false, true);
  EXPECT_FALSE(fp32.DeviceHomed(fp32.Index({StateKind::kParam, 0})));
  EXPECT_TRUE(fp32.HalfHomed(fp32.Index({StateKind::kGrad, 4})));
  EXPECT_FALSE(fp32.HalfHomed(fp32.Index({StateKind::kExpAvg, 4})));
}

TEST(ChunkPlacement, DiskHomesNumberEveryDiskChunkOnceChunkByChunk) {
  ChunkPlacement p = Placement(7, 1, true, false);
  p.disk_chunks = 5;
  p.disk_master_chunks = 3;
  std::vector<int32_t> seen(size_t(2 * 5 + 3), -1);
  int32_t last_chunk = -1, last_home = -1;
  for (int32_t chunk = 0; chunk < p.num_chunks; ++chunk) {
    for (StateKind kind : {StateKind::kParam, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      const int32_t i = p.Index({kind, chunk});
      const bool on_disk = kind == StateKind::kParam ? chunk >= 4 : chunk >= 2;
      ASSERT_EQ(p.DiskHomed(i), on_disk) << chunk << " " << StateKindName(kind);
      if (!on_disk) continue;
      const int32_t h = p.DiskHome(i);
      ASSERT_GE(h, 0);
      ASSERT_LT(h, int32_t(seen.size()));
      EXPECT_EQ(seen[size_t(h)], -1) << "home " << h << " taken twice";
      seen[size_t(h)] = i;
      // A sweep in chunk order, each chunk's master then its moments, walks the file forward.
      if (chunk != last_chunk) { EXPECT_GT(h, last_home) << chunk; }
      last_chunk = chunk;
      last_home = std::max(last_home, h);
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), -1), 0);
  EXPECT_FALSE(p.DiskHomed(p.Index({StateKind::kGrad, 6}))) << "gradients stream every step";
}

// Every host home lies inside the block and no two overlap; homes on the
// device or on disk take none (a param whose master is on disk has a 16-bit
// home instead).
void ExpectDisjointHomes(const ChunkPlacement& p, int64_t shard, const ChunkRuntimeOptions& o) {
  auto host = HostTier::Create(*MakeCpuBackend(), p, shard, o);
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->bytes(), TierLayout::HostHomeBytes(p.num_chunks, shard, p.device_adam_chunks, o));
  std::vector<std::pair<const std::byte*, const std::byte*>> spans;
  for (int32_t i = 0; i < p.total(); ++i) {
    if (p.DeviceHomed(i)) continue;
    if (p.DiskHomed(i)) {
      if (!p.HalfParam(i)) continue;
      const auto* half = reinterpret_cast<const std::byte*>(host->HalfParamHome(i));
      spans.push_back({half, half + shard / 2});
      continue;
    }
    spans.push_back({host->Home(i), host->Home(i) + host->HomeBytes(i)});
    EXPECT_EQ(host->HomeBytes(i), p.HalfHomed(i) ? shard / 2 : shard);
  }
  ASSERT_FALSE(spans.empty());
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) EXPECT_LE(spans[k - 1].second, spans[k].first) << k;
  // The first home starts the block; the last ends within it.
  EXPECT_LE(spans.back().second - spans.front().first, host->bytes());
}

TEST(HostTier, HomesAreDisjointAndFillTheLayoutsBytes) {
  ChunkRuntimeOptions o;
  ExpectDisjointHomes(Placement(4, 0, false, false), 256, o);
  ExpectDisjointHomes(Placement(4, 1, false, false), 256, o);
  o.grad_home = HalfFormat::kBf16;
  ExpectDisjointHomes(Placement(3, 1, false, true), 192, o);
  o.grad_home.reset();
  o.param_device = HalfFormat::kBf16;
  ExpectDisjointHomes(Placement(4, 2, true, false), 256, o);
}

TEST(HostTier, DiskHomesTakeNoHostBytesButMastersLeaveA16BitHome) {
  ChunkRuntimeOptions o;
  ChunkPlacement p = Placement(6, 1, false, false);
  p.disk_chunks = o.disk_moment_chunks = 3;
  ExpectDisjointHomes(p, 256, o);
  EXPECT_EQ(TierLayout::HostHomeBytes(6, 256, 1, o), (6 + 6 + 2 * (6 - 1 - 3)) * 256);
  o.param_device = HalfFormat::kFp16;
  p.half_params = true;
  p.disk_master_chunks = o.disk_master_chunks = 2;
  ExpectDisjointHomes(p, 256, o);
  // Masters: 6 - 1 on the device - 2 on disk; 2 homes of 128 bytes instead.
  EXPECT_EQ(TierLayout::HostHomeBytes(6, 256, 1, o), (3 + 6 + 2 * 2) * 256 + 2 * 128);
  o.grad_home = HalfFormat::kFp16;
  p.half_grads = true;
  ExpectDisjointHomes(p, 192, o);
}

}  // namespace
}  // namespace pstar
