#include "worker/runtime/disk_file.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "tests/test_util.h"

namespace pstar {
namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(int64_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(DiskFile::kAlignment, size_t(bytes)))), size(bytes) {}
  ~AlignedBuffer() { std::free(data); }
  float* floats() const { return reinterpret_cast<float*>(data); }
  std::byte* data;
  int64_t size;
};

TEST(DiskFile, WritesAndReadsBackAcrossPiecesAndThreads) {
  test::TempDir dir("disk-file");
  const std::string path = dir.path() + "/homes.bin";
  const int64_t bytes = 3 * DiskFile::kPieceBytes + 5 * DiskFile::kAlignment;  // pieces of unequal size
  auto file = DiskFile::Create(path, 2 * bytes, 3);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(std::filesystem::file_size(path), uint64_t(2 * bytes));
  AlignedBuffer a(bytes), b(bytes), back(bytes);
  for (int64_t i = 0; i < bytes / 4; ++i) {
    a.floats()[i] = float(i);
    b.floats()[i] = -float(i) * 0.5f;
  }
  const DiskFile::Ticket wa = (*file)->Write(a.data, bytes, 0);
  const DiskFile::Ticket wb = (*file)->Write(b.data, bytes, bytes);
  EXPECT_TRUE((*file)->Wait(wb).ok());
  EXPECT_TRUE((*file)->Wait(wa).ok());
  EXPECT_TRUE((*file)->Ready(wa));
  EXPECT_TRUE((*file)->Wait((*file)->Read(back.data, bytes, bytes)).ok());
  EXPECT_EQ(0, std::memcmp(back.data, b.data, size_t(bytes)));
  EXPECT_TRUE((*file)->Wait((*file)->Read(back.data, bytes, 0)).ok());
  EXPECT_EQ(0, std::memcmp(back.data, a.data, size_t(bytes)));
  file->reset();
  EXPECT_FALSE(std::filesystem::exists(path)) << "the file is scratch: removed with the tier";
}

TEST(DiskFile, ASecondLiveRunOnThePathIsRefusedAndACrashedRunsFileIsReused) {
  test::TempDir dir("disk-file-lock");
  const std::string path = dir.path() + "/homes.bin";
  {
    // What a crashed run left: a larger file of old bytes.
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::vector<char> junk(1 << 16, 'x');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  auto first = DiskFile::Create(path, DiskFile::kAlignment * 2, 1);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(std::filesystem::file_size(path), uint64_t(DiskFile::kAlignment * 2));
  auto second = DiskFile::Create(path, DiskFile::kAlignment * 2, 1);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another run"), std::string::npos) << second.status().message();
  EXPECT_NE(second.status().message().find(path), std::string::npos);
}

TEST(DiskFile, TruncatedOrDeletedUnderTheRunFailsNamingThePath) {
  test::TempDir dir("disk-file-fault");
  const std::string path = dir.path() + "/homes.bin";
  const int64_t bytes = 4 * DiskFile::kAlignment;
  auto file = DiskFile::Create(path, bytes, 2);
  ASSERT_TRUE(file.ok()) << file.status().message();
  AlignedBuffer buf(bytes);
  ASSERT_EQ(::truncate(path.c_str(), DiskFile::kAlignment), 0);
  const Status truncated = (*file)->Wait((*file)->Read(buf.data, bytes, 0));
  EXPECT_EQ(truncated.code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.message().find("truncated under the run"), std::string::npos) << truncated.message();
  EXPECT_NE(truncated.message().find(path), std::string::npos);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  const Status deleted = (*file)->Wait((*file)->Write(buf.data, bytes, 0));
  EXPECT_EQ(deleted.code(), StatusCode::kDataLoss);
  EXPECT_NE(deleted.message().find("deleted under the run"), std::string::npos) << deleted.message();
}

// A truncation followed by a write: the write would extend the file again
// over a hole, and reads below it return zeros; every piece is refused
// instead, the write first.
TEST(DiskFile, AWriteAfterATruncationIsRefusedSoNoHoleIsRead) {
  test::TempDir dir("disk-file-hole");
  const std::string path = dir.path() + "/homes.bin";
  const int64_t bytes = 4 * DiskFile::kAlignment;
  auto file = DiskFile::Create(path, bytes, 1);
  ASSERT_TRUE(file.ok()) << file.status().message();
  AlignedBuffer buf(DiskFile::kAlignment);
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  const Status write = (*file)->Wait((*file)->Write(buf.data, DiskFile::kAlignment, 3 * DiskFile::kAlignment));
  EXPECT_EQ(write.code(), StatusCode::kDataLoss);
  EXPECT_NE(write.message().find("truncated under the run"), std::string::npos) << write.message();
  EXPECT_EQ(std::filesystem::file_size(path), 0u) << "the refused write did not extend the file";
  const Status read = (*file)->Wait((*file)->Read(buf.data, DiskFile::kAlignment, 0));
  EXPECT_EQ(read.code(), StatusCode::kDataLoss);
}

TEST(DiskFile, NoRoomOrNoDirectoryFailsAtCreation) {
  test::TempDir dir("disk-file-room");
  auto missing = DiskFile::Create(dir.path() + "/no/such/dir/homes.bin", DiskFile::kAlignment, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot create " + dir.path() + "/no/such/dir/homes.bin"),
            std::string::npos)
      << missing.status().message();
  // More than the file system has free: refused by the preallocation, on file
  // systems that reserve it without writing (glibc writes zeros elsewhere).
  struct statfs fs;
  ASSERT_EQ(::statfs(dir.path().c_str(), &fs), 0);
  constexpr long kExt4 = 0xEF53, kXfs = 0x58465342, kTmpfs = 0x01021994, kBtrfs = 0x9123683E;
  if (fs.f_type != kExt4 && fs.f_type != kXfs && fs.f_type != kTmpfs && fs.f_type != kBtrfs) {
    GTEST_SKIP() << "the temporary directory's file system may emulate fallocate by writing";
  }
  const int64_t free_bytes = int64_t(fs.f_bavail) * int64_t(fs.f_bsize);
  const int64_t too_much = (free_bytes / DiskFile::kAlignment + (int64_t{1} << 18)) * DiskFile::kAlignment;
  auto full = DiskFile::Create(dir.path() + "/big.bin", too_much, 1);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().message();
  EXPECT_NE(full.status().message().find(std::to_string(too_much)), std::string::npos) << full.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/big.bin"));
}

}  // namespace
}  // namespace pstar
