#include "worker/runtime/device_tier.h"

#include <gtest/gtest.h>

#include "tests/worker/runtime/runtime_test_fixtures.h"

namespace pstar {
namespace {

using test::Placement;

TEST(DeviceTier, SlotsComeBackLastFreedFirstAndCountAgainstTheCapacity) {
  ChunkRuntimeOptions o;
  o.non_model_bytes = 100;
  o.param_device = HalfFormat::kFp16;
  const ChunkPlacement p = Placement(4, 1, true, false);
  TierLayout::TierSlots slots;
  slots.full = 2;
  slots.half = 3;
  slots.device_adam_chunks = 1;
  const int64_t chunk = 256;
  const int64_t capacity = 128 + 2 * 256 + 3 * 128 + 3 * 256;
  auto backend = MakeCpuBackend();
  auto tier = DeviceTier::Create(*backend, p, chunk, slots, o, capacity);
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  EXPECT_EQ(tier->non_model_bytes(), 128);
  EXPECT_EQ(tier->bytes_in_use(), 128 + 3 * 256);
  EXPECT_EQ(tier->pool_count(), 2);
  EXPECT_EQ(tier->pool_first(1), 2);
  EXPECT_EQ(tier->TakeFreeSlot(0), 0);
  EXPECT_EQ(tier->TakeFreeSlot(0), 1);
  EXPECT_EQ(tier->TakeFreeSlot(0), -1);
  tier->Occupy(0, 4);
  tier->Occupy(1, 5);
  EXPECT_EQ(tier->owner(1), 5);
  tier->Vacate(0);
  EXPECT_EQ(tier->owner(0), -1);
  EXPECT_EQ(tier->TakeFreeSlot(0), 0);
  tier->Occupy(0, 6);
  const int32_t h = tier->TakeFreeSlot(1);
  EXPECT_EQ(h, 2);
  tier->Occupy(h, 0);
  EXPECT_EQ(tier->SlotStride(h), 128);
  EXPECT_EQ(reinterpret_cast<std::byte*>(tier->SlotData(h)) - tier->non_model_memory(), 128 + 2 * 256);
  EXPECT_EQ(tier->bytes_in_use(), 128 + 2 * 256 + 128 + 3 * 256);
  EXPECT_EQ(tier->peak_bytes(), 128 + 2 * 256 + 128 + 3 * 256);
  // The device homes follow the slots: exp_avg, exp_avg_sq, then the masters.
  const std::byte* homes = tier->non_model_memory() + 128 + 2 * 256 + 3 * 128;
  EXPECT_EQ(reinterpret_cast<std::byte*>(tier->Home(p.Index({StateKind::kExpAvg, 0}))), homes);
  EXPECT_EQ(reinterpret_cast<std::byte*>(tier->Home(p.Index({StateKind::kExpAvgSq, 0}))), homes + 256);
  EXPECT_EQ(reinterpret_cast<std::byte*>(tier->Home(p.Index({StateKind::kParam, 0}))), homes + 512);
  EXPECT_EQ(tier->Home(p.Index({StateKind::kExpAvg, 0}))[63], 0.0f);  // homes start zero-filled
}

}  // namespace
}  // namespace pstar
