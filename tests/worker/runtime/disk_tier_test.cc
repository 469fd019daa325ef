#include "worker/runtime/disk_tier.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {
namespace {

constexpr int64_t kHomeFloats = 3000;  // not a multiple of the disk alignment

DiskTier::Shape Shape(const std::string& dir, int32_t homes, int32_t windows) {
  DiskTier::Shape s;
  s.directory = dir;
  s.rank = 3;
  s.home_bytes = kHomeFloats * 4;
  s.homes = homes;
  s.windows = windows;
  s.io_threads = 2;
  return s;
}

float Value(int32_t home, int64_t i, int round) { return float(home * 100000 + i) + 0.25f * float(round); }

TEST(DiskTier, HomesSurviveManyMoreHomesThanWindowsWithReadAheadAndWriteBehind) {
  test::TempDir dir("disk-tier");
  const int32_t homes = 12;
  auto tier = DiskTier::Create(Shape(dir.path(), homes, 4));
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  EXPECT_EQ((*tier)->path(), dir.path() + "/pstar-chunks-rank3.bin");
  EXPECT_EQ((*tier)->host_bytes(), 4 * TierLayout::DiskHomeStride(kHomeFloats * 4));
  for (int round = 0; round < 3; ++round) {
    for (int32_t h = 0; h < homes; ++h) {
      (*tier)->UnpinAll();
      float* w = (*tier)->Open(h, /*zero=*/round == 0, /*write=*/true);
      if (round > 0) {
        for (int64_t i = 0; i < kHomeFloats; ++i) ASSERT_EQ(w[i], Value(h, i, round - 1)) << h << " " << i;
      } else {
        for (int64_t i = 0; i < kHomeFloats; ++i) ASSERT_EQ(w[i], 0.0f);
      }
      for (int64_t i = 0; i < kHomeFloats; ++i) w[i] = Value(h, i, round);
      if (round > 0 && h + 1 < homes) (*tier)->ReadAhead(h + 1);  // zeros are not read ahead
    }
  }
  (*tier)->UnpinAll();
  (*tier)->Sync();
  const int64_t stride = TierLayout::DiskHomeStride(kHomeFloats * 4);
  EXPECT_EQ((*tier)->written_bytes(), 3 * homes * stride);
  // The first round's zeros cost no read; each later round reads every home
  // but those still in one of the 4 windows, which depends on when the
  // writes behind landed (a window whose write is in flight is not taken).
  EXPECT_LE((*tier)->read_bytes(), 2 * homes * stride) << "the first round's zeros cost no read";
  EXPECT_GE((*tier)->read_bytes(), 2 * (homes - 4) * stride);
  // Reading only: nothing is written back.
  (*tier)->UnpinAll();
  const float* w = (*tier)->Open(5, false, false);
  EXPECT_EQ(w[7], Value(5, 7, 2));
  (*tier)->UnpinAll();
  (*tier)->Sync();
  EXPECT_EQ((*tier)->written_bytes(), 3 * homes * stride);
  const std::string path = (*tier)->path();
  tier->reset();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(DiskTier, PinnedWindowsStayPutWhileOthersCycle) {
  test::TempDir dir("disk-tier-pins");
  auto tier = DiskTier::Create(Shape(dir.path(), 6, 3));
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  float* a = (*tier)->Open(0, true, true);
  float* b = (*tier)->Open(1, true, true);
  a[0] = 1.5f;
  b[0] = 2.5f;
  // One window is left for read-ahead; the pinned ones are never taken.
  for (int32_t h = 2; h < 6; ++h) (*tier)->ReadAhead(h);
  EXPECT_EQ((*tier)->Open(0, false, false), a);
  EXPECT_EQ(a[0], 1.5f);
  EXPECT_EQ(b[0], 2.5f);
  (*tier)->UnpinAll();
  for (int32_t h = 2; h < 6; ++h) (*tier)->UnpinAll(), (*tier)->Open(h, true, true);
  (*tier)->UnpinAll();
  EXPECT_EQ((*tier)->Open(0, false, false)[0], 1.5f);
  EXPECT_EQ((*tier)->Open(1, false, false)[0], 2.5f);
}

TEST(DiskTierDeathTest, AFileTruncatedUnderTheRunEndsItWithOneLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  test::TempDir dir("disk-tier-death");
  EXPECT_EXIT(
      {
        auto tier = DiskTier::Create(Shape(dir.path(), 4, 2));
        if (!tier.ok()) std::_Exit(3);
        (*tier)->Open(2, true, true)[0] = 1.0f;
        (*tier)->UnpinAll();
        // Homes 0 and 1 take both windows: home 2 must be read again.
        (*tier)->Open(0, true, true);
        (*tier)->UnpinAll();
        (*tier)->Open(1, true, true);
        (*tier)->UnpinAll();
        (*tier)->Sync();
        if (::truncate((*tier)->path().c_str(), 0) != 0) std::_Exit(4);
        (*tier)->Open(2, false, false);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(1),
      "pstar: error: disk tier: .*pstar-chunks-rank3.bin holds 0 bytes \\(it should hold [0-9]+\\): truncated under the run");
}

TEST(DiskTier, RoomIsCheckedAgainstTheAllowanceOrTheFreeSpace) {
  test::TempDir dir("disk-tier-room");
  EXPECT_TRUE(DiskTier::CheckRoom(dir.path(), 1 << 20, 2 << 20).ok());
  const Status over = DiskTier::CheckRoom(dir.path(), 3 << 20, 2 << 20);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("runtime.nvme_memory allows 2097152"), std::string::npos) << over.message();
  EXPECT_TRUE(DiskTier::CheckRoom(dir.path(), 1 << 20, 0).ok());
  const Status huge = DiskTier::CheckRoom(dir.path(), int64_t{1} << 62, 0);
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.message().find("free less a margin"), std::string::npos) << huge.message();
  const Status missing = DiskTier::CheckRoom(dir.path() + "/absent", 1, 0);
  EXPECT_NE(missing.message().find("runtime.nvme_path"), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace pstar
