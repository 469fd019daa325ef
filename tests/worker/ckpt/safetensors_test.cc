#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"

namespace pstar {
namespace {

TEST(Safetensors, RoundTripAndTruncationDetected) {
  test::TempDir dir("st");
  const std::string path = dir.path() + "/t.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int32_t> b = {4, 5};
  SafetensorsWriter w;
  w.Add("a", Dtype::kF32, {2, 3}, a.data());
  w.Add("b", Dtype::kI32, {2}, b.data());
  w.SetMetadata("step", "12");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*f->ToDoubles("a"), (std::vector<double>{1.5, -2.0, 3.25, 0.0, 7.0, 8.0}));
  EXPECT_EQ(*f->ToDoubles("b"), (std::vector<double>{4, 5}));
  EXPECT_EQ(f->metadata().at("step"), "12");
  EXPECT_FALSE(f->ToDoubles("c").ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  auto cut = SafetensorsFile::Read(path);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
}

// What a Fetch callback was asked for.
struct FetchCall {
  std::string tensor;
  const char* dst;
  int64_t offset, bytes;
};

// A Fetch serving `source`, recording each call in `calls`.
SafetensorsWriter::Fetch Recording(const std::string& tensor, const void* source, std::vector<FetchCall>* calls) {
  return [=](char* dst, int64_t offset, int64_t bytes) {
    calls->push_back({tensor, dst, offset, bytes});
    std::memcpy(dst, static_cast<const char*>(source) + offset, size_t(bytes));
    return Status::Ok();
  };
}

TEST(Safetensors, FetchedTensorsStreamThroughOneBoundedBufferIntoTheSameFile) {
  test::TempDir dir("st_fetch");
  std::vector<float> big(1'500'000);  // more than one 4 MiB block
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 9973) * 0.25f - float(i % 7);
  std::vector<double> small = {1.0 / 3.0, -2.5};
  std::vector<int32_t> tail = {7, 8, 9};

  SafetensorsWriter viewed, fetched;
  std::vector<FetchCall> calls;
  viewed.AddView("small", Dtype::kF64, {2}, small.data());
  fetched.AddFetched("small", Dtype::kF64, {2}, Recording("small", small.data(), &calls));
  viewed.AddView("empty", Dtype::kF32, {0, 4}, big.data());
  fetched.AddFetched("empty", Dtype::kF32, {0, 4}, Recording("empty", big.data(), &calls));
  viewed.AddView("big", Dtype::kF32, {1500, 1000}, big.data());
  fetched.AddFetched("big", Dtype::kF32, {1500, 1000}, Recording("big", big.data(), &calls));
  viewed.Add("tail", Dtype::kI32, {3}, tail.data());
  fetched.Add("tail", Dtype::kI32, {3}, tail.data());
  for (SafetensorsWriter* w : {&viewed, &fetched}) w->SetMetadata("step", "3");

  FileDigest from_views, from_fetches;
  ASSERT_TRUE(viewed.Write(dir.path() + "/viewed.safetensors", &from_views).ok());
  Status st = fetched.Write(dir.path() + "/fetched.safetensors", &from_fetches);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(from_fetches.bytes, from_views.bytes);
  EXPECT_EQ(from_fetches.crc64, from_views.crc64);
  EXPECT_TRUE(*ReadFile(dir.path() + "/fetched.safetensors") == *ReadFile(dir.path() + "/viewed.safetensors"));

  // In order, each tensor from offset 0 to its end, in blocks of at most
  // 4 MiB, all into one buffer; nothing asked for the empty tensor.
  ASSERT_GE(calls.size(), 3u);
  std::set<const char*> buffers;
  int64_t small_next = 0, big_next = 0, big_calls = 0;
  for (const FetchCall& c : calls) {
    buffers.insert(c.dst);
    EXPECT_GT(c.bytes, 0);
    EXPECT_LE(c.bytes, SafetensorsWriter::kFetchBlockBytes);
    EXPECT_NE(c.tensor, "empty");
    int64_t& next = c.tensor == "big" ? big_next : small_next;
    EXPECT_EQ(c.offset, next) << c.tensor;
    next = c.offset + c.bytes;
    if (c.tensor == "big") {
      ++big_calls;
      EXPECT_EQ(small_next, int64_t(small.size() * sizeof(double))) << "small after big";
    }
  }
  EXPECT_EQ(buffers.size(), 1u);
  EXPECT_EQ(small_next, int64_t(small.size() * sizeof(double)));
  EXPECT_EQ(big_next, int64_t(big.size() * sizeof(float)));
  EXPECT_EQ(big_calls, 2);
}

TEST(Safetensors, FetchErrorAbortsTheWriteAndLeavesNoFile) {
  test::TempDir dir("st_fetch");
  std::vector<float> big(1'500'000, 2.0f);
  int64_t calls = 0;
  auto failing = [&](char* dst, int64_t offset, int64_t bytes) {
    if (++calls == 2) return Status::Internal("device unplugged");
    std::memcpy(dst, reinterpret_cast<const char*>(big.data()) + offset, size_t(bytes));
    return Status::Ok();
  };
  const std::string fresh = dir.path() + "/fresh.safetensors", old = dir.path() + "/old.safetensors";
  test::WriteText(old, "the previous file");
  for (const std::string& path : {fresh, old}) {
    calls = 0;
    SafetensorsWriter w;
    w.Add("head", Dtype::kF32, {2}, big.data());
    w.AddFetched("big", Dtype::kF32, {int64_t(big.size())}, failing);
    FileDigest digest{-1, 0};
    Status st = w.Write(path, &digest);
    ASSERT_FALSE(st.ok()) << path;
    EXPECT_EQ(st.code(), StatusCode::kInternal);
    EXPECT_NE(st.message().find(path + ": fetching big: device unplugged"), std::string::npos) << st.message();
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(digest.bytes, -1);  // untouched
  }
  EXPECT_FALSE(std::filesystem::exists(fresh));
  EXPECT_EQ(*ReadFile(old), "the previous file");
  int entries = 0;  // no temp file left behind
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace pstar
