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

// llm.c's shard, written from its documented header: 256 int32 (magic,
// version, token count, zeros), then the tokens.
void WriteLlmcShard(const std::string& path, const std::vector<int32_t>& tokens, bool wide = false,
                    int32_t version = -1, int64_t count = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = wide ? kLlmcShardMagicUint32 : kLlmcShardMagic;
  header[1] = version >= 0 ? version : (wide ? 7 : 1);
  header[2] = int32_t(count >= 0 ? count : int64_t(tokens.size()));
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (int32_t t : tokens) {
    if (wide) {
      const uint32_t v = uint32_t(t);
      f.write(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t v = uint16_t(t);
      f.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
}

TEST(TokenShard, LlmcShardsGiveTheSameBatchesAsPstarShards) {
  test::TempDir dir("llmc");
  std::vector<int32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919 + 13) % 50257);
  // The same tokens as two llm.c shards (one uint16, one uint32) and as one pstar shard.
  const std::vector<int32_t> a(tokens.begin(), tokens.begin() + 3001), b(tokens.begin() + 3001, tokens.end());
  std::filesystem::create_directories(dir.path() + "/llmc");
  WriteLlmcShard(dir.path() + "/llmc/fineweb_train_000001.bin", a);
  WriteLlmcShard(dir.path() + "/llmc/fineweb_train_000002.bin", b, /*wide=*/true);
  ASSERT_TRUE(WriteTokenShard(dir.path() + "/pstar.bin", tokens, 50257).ok());
  auto llmc = OpenTokenShards(dir.path() + "/llmc", 50304);
  ASSERT_TRUE(llmc.ok()) << llmc.status().message();
  auto pstar = OpenTokenShards(dir.path() + "/pstar.bin", 50304);
  ASSERT_TRUE(pstar.ok()) << pstar.status().message();
  EXPECT_EQ(ReadAll(**llmc), tokens);
  auto x = BatchLoader::Create(**llmc, 4, 64), y = BatchLoader::Create(**pstar, 4, 64);
  ASSERT_TRUE(x.ok() && y.ok());
  std::vector<int32_t> tx(256), gx(256), ty(256), gy(256);
  for (int step = 0; step < 50; ++step) {  // past the end: wraps the same way
    x->Next(tx.data(), gx.data());
    y->Next(ty.data(), gy.data());
    ASSERT_EQ(tx, ty) << "step " << step;
    ASSERT_EQ(gx, gy) << "step " << step;
  }
  // Token ids are still checked against the model (llm.c's header has no vocabulary).
  auto small = OpenTokenShards(dir.path() + "/llmc", 50000);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("is not below model.vocab_size 50000"), std::string::npos);
}

TEST(TokenShard, LlmcHeadersAreChecked) {
  test::TempDir dir("llmc-bad");
  const std::string p = dir.path() + "/s.bin";
  const auto expect = [&](const std::string& needle) {
    auto s = OpenTokenShards(p, 65536);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
  };
  WriteLlmcShard(p, {1, 2, 3}, false, /*version=*/2);
  expect("unsupported llm.c token shard version 2");
  WriteLlmcShard(p, {1, 2, 3}, false, -1, /*count=*/4);
  expect("header says 4 tokens (8 bytes) but 6 bytes follow");
  WriteLlmcShard(p, {1, 2, 3}, false, -1, /*count=*/0x80000000LL);
  expect("negative token count");
  WriteLlmcShard(p, {1, 2, 3});
  std::filesystem::resize_file(p, 100);
  expect("the header alone is 1024");
}

TEST(TokenShard, GlobsPickShardsAndMixedTrainValFoldersAreRefused) {
  test::TempDir dir("globs");
  const std::string d = dir.path();
  ASSERT_TRUE(WriteTokenShard(d + "/data_train_000001.bin", {1, 2, 3}, 256).ok());
  ASSERT_TRUE(WriteTokenShard(d + "/data_train_000002.bin", {4, 5}, 256).ok());
  ASSERT_TRUE(WriteTokenShard(d + "/data_val_000000.bin", {9, 9}, 256).ok());
  auto mixed = OpenTokenShards(d, 256);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.status().message().find("both training (*_train_*) and validation (*_val_*)"), std::string::npos);
  EXPECT_NE(mixed.status().message().find(d + "/*_train_*.bin"), std::string::npos);
  auto train = OpenTokenShards(d + "/*_train_*.bin", 256);
  ASSERT_TRUE(train.ok()) << train.status().message();
  EXPECT_EQ(ReadAll(**train), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  auto val = OpenTokenShards(d + "/data_val_*", 256);
  ASSERT_TRUE(val.ok());
  EXPECT_EQ(ReadAll(**val), (std::vector<int32_t>{9, 9}));
  auto none = OpenTokenShards(d + "/*_test_*.bin", 256);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("matches no files"), std::string::npos);
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
