#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"
#include "worker/data/batch_loader.h"
#include "worker/data/generated_corpus.h"
#include "worker/data/token_shard.h"
#include "worker/data/token_source.h"

namespace pstar {
namespace {

std::vector<int32_t> ReadAll(const TokenSource& s) {
  std::vector<int32_t> out(size_t(s.size()));
  s.Read(0, s.size(), out.data());
  return out;
}

TEST(TokenShard, RoundTripsAndConcatenatesADirectory) {
  test::TempDir dir("shards");
  std::vector<int32_t> a = {1, 2, 3, 65535}, b = {7, 8};
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/00.bin", a, 65536).ok());
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/01.bin", b, 65536).ok());
  auto one = OpenTokenShards(dir.path() + "/00.bin", 65536);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(ReadAll(**one), a);
  auto both = OpenTokenShards(dir.path(), 65536);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(ReadAll(**both), (std::vector<int32_t>{1, 2, 3, 65535, 7, 8}));
  std::vector<int32_t> middle(3);
  (*both)->Read(3, 3, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{65535, 7, 8}));
  // Wide vocabularies use 4-byte tokens.
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/wide.bin", {100000}, 200000).ok());
  EXPECT_EQ(std::filesystem::file_size(dir.path() + "/wide.bin"), 36u);
}

TEST(TokenShard, DetectsTruncationBadMagicAndVocabularyMismatch) {
  test::TempDir dir("bad");
  const std::string path = dir.path() + "/s.bin";
  ASSERT_TRUE(WriteTokenShard(path, {1, 2, 3, 4}, 100).ok());
  auto mismatch = OpenTokenShards(path, 50);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("vocabulary mismatch"), std::string::npos);
  std::filesystem::resize_file(path, 32 + 5);
  auto truncated = OpenTokenShards(path, 100);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos) << truncated.status().message();
  test::WriteText(path, "hello, this is not a shard at all......");
  auto magic = OpenTokenShards(path, 100);
  ASSERT_FALSE(magic.ok());
  EXPECT_NE(magic.status().message().find("not a token shard"), std::string::npos);
  auto missing = OpenTokenShards(dir.path() + "/nope.bin", 100);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no such file"), std::string::npos);
  EXPECT_FALSE(WriteTokenShard(dir.path() + "/x.bin", {5}, 5).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/x.bin"));
}

TEST(ByteText, OneTokenPerByteAndNeedsVocab256) {
  test::TempDir dir("text");
  test::WriteText(dir.path() + "/t.txt", "ab\xff");
  auto src = OpenByteText(dir.path() + "/t.txt", 256);
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(ReadAll(**src), (std::vector<int32_t>{97, 98, 255}));
  auto small = OpenByteText(dir.path() + "/t.txt", 100);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("vocabulary mismatch"), std::string::npos);
}

TEST(GeneratedCorpus, DeterministicInVocabularyAndLearnable) {
  auto a = GenerateCorpus(300, 50000, 9), b = GenerateCorpus(300, 50000, 9), c = GenerateCorpus(300, 50000, 10);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<std::vector<int>> successors(300);
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    ASSERT_GE(a[i], 0);
    ASSERT_LT(a[i], 300);
    auto& s = successors[size_t(a[i])];
    if (std::find(s.begin(), s.end(), a[i + 1]) == s.end()) s.push_back(a[i + 1]);
  }
  for (const auto& s : successors) EXPECT_LE(s.size(), 4u);
}

TEST(BatchLoader, TargetsAreNextTokensAndTheCursorWraps) {
  std::vector<int32_t> t(20);
  for (int i = 0; i < 20; ++i) t[size_t(i)] = i;
  VectorTokenSource src(t);
  auto loader = BatchLoader::Create(src, 2, 4);
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> x(8), y(8);
  loader->Next(x.data(), y.data());
  EXPECT_EQ(x, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(y, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  loader->Next(x.data(), y.data());
  EXPECT_EQ(x[0], 8);
  loader->Next(x.data(), y.data());  // 16 + 9 > 20: back to the start
  EXPECT_EQ(x[0], 0);
  EXPECT_FALSE(BatchLoader::Create(src, 5, 4).ok());
}

}  // namespace
}  // namespace pstar
