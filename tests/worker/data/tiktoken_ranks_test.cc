// BpeTokenizer::FromTiktokenText on small rank files made here: tiktoken's
// merge rule (the pair whose joined bytes rank lowest, the leftmost of
// equals; a word that is a token whole), Llama 3's special tokens after the
// ranks, the checkpoint and tokenizer.json forms, and one-line refusals.
// Llama 3's real rank file against tiktoken is hf_tokenizer_test.py.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "worker/data/bpe_tokenizer.h"

namespace pstar {
namespace {

std::string Base64(const std::string& bytes) {
  static const char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t bits = 0;
    for (size_t k = 0; k < 3; ++k) bits = (bits << 8) | (k < n ? uint8_t(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kDigits[(bits >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

// Every byte at its own value, then `tokens` from rank 256 on.
std::string RankFile(const std::vector<std::string>& tokens) {
  std::string text;
  for (int b = 0; b < 256; ++b) text += Base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t k = 0; k < tokens.size(); ++k) text += Base64(tokens[k]) + " " + std::to_string(256 + k) + "\n";
  return text;
}

std::vector<int32_t> Ids(const BpeTokenizer& t, const std::string& text) { return t.Encode(text); }

TEST(TiktokenRanks, MergeByTheJoinedTokensRankLeftmostFirst) {
  // "ab" 256, "bc" 257, "abc" 258, "cd" 259, "abcd" 260.
  auto t = BpeTokenizer::FromTiktokenText(RankFile({"ab", "bc", "abc", "cd", "abcd"}), "ranks");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{258}));
  // "abcdx": ab (256) first, then ab+c (258), then abc+d (260).
  EXPECT_EQ(Ids(*t, "abcdx"), (std::vector<int32_t>{260, 'x'}));
  // "bcd": bc (257) before cd (259); "bc"+"d" is no token.
  EXPECT_EQ(Ids(*t, "bcd"), (std::vector<int32_t>{257, 'd'}));
  // Equal ranks: the leftmost pair merges first ("abab" -> ab ab).
  EXPECT_EQ(Ids(*t, "ababab"), (std::vector<int32_t>{256, 256, 256}));
  // Words are Llama 3's pattern's: a space joins the next word.
  EXPECT_EQ(Ids(*t, "ab abc"), (std::vector<int32_t>{256, ' ', 258}));
}

TEST(TiktokenRanks, AWordThatIsATokenIsThatTokenWhole) {
  // "wxyz" has no split into two tokens: no merge reaches it, but the word
  // "wxyz" is the token itself, as tiktoken's encoder takes it.
  auto t = BpeTokenizer::FromTiktokenText(RankFile({"wxyz"}), "ranks");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(Ids(*t, "wxyz"), (std::vector<int32_t>{256}));
  EXPECT_EQ(Ids(*t, "wxyzw"), (std::vector<int32_t>{'w', 'x', 'y', 'z', 'w'}));
}

TEST(TiktokenRanks, LongWordsMergeAsShortOnesDo) {
  // Past 64 symbols the heap-based merge runs; it must agree with the loop.
  auto t = BpeTokenizer::FromTiktokenText(RankFile({"ab", "abab", "ba", "aba"}), "ranks");
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::string word;
  for (int k = 0; k < 100; ++k) word += "ab";
  std::vector<int32_t> want;
  for (int k = 0; k < 50; ++k) want.push_back(257);  // abab each
  EXPECT_EQ(Ids(*t, word), want);
  std::vector<int32_t> short_want(5, 257);
  EXPECT_EQ(Ids(*t, word.substr(0, 20)), short_want);
}

TEST(TiktokenRanks, Llama3sSpecialTokensFollowTheRanks) {
  auto t = BpeTokenizer::FromTiktokenText(RankFile({"ab"}), "ranks");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const int32_t n = 257;
  EXPECT_EQ(t->vocab_size(), n + 256);
  EXPECT_EQ(t->DocumentStart(), (std::vector<int32_t>{n}));
  EXPECT_EQ(t->eot(), n + 1);
  const std::map<std::string, int32_t> want = {
      {"<|begin_of_text|>", n},        {"<|end_of_text|>", n + 1},
      {"<|reserved_special_token_0|>", n + 2}, {"<|finetune_right_pad_id|>", n + 4},
      {"<|reserved_special_token_2|>", n + 5}, {"<|start_header_id|>", n + 6},
      {"<|end_header_id|>", n + 7},    {"<|eom_id|>", n + 8},
      {"<|eot_id|>", n + 9},           {"<|python_tag|>", n + 10},
      {"<|reserved_special_token_3|>", n + 11}, {"<|reserved_special_token_247|>", n + 255}};
  for (const auto& [name, id] : want) {
    EXPECT_EQ(t->TokenId(name), std::optional<int32_t>(id)) << name;
    auto text = t->Decode(std::vector<int32_t>{id});
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, name);
  }
  // A special token's text in data is text; with `special` it is the token.
  EXPECT_EQ(t->Encode("<|eot_id|>").size(), 10u);  // its ten bytes: this vocabulary has no token of them
  EXPECT_EQ(t->Encode("<|eot_id|>", /*special=*/true), (std::vector<int32_t>{n + 9}));
  EXPECT_TRUE(t->lossless());
  const std::string bytes = "\xFF\x80 ab\xE6\x97\xA5 \r\n\t x";
  auto back = t->Decode(t->Encode(bytes));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, bytes);
}

TEST(TiktokenRanks, CheckpointsKeepTheRankFileAndExportsATokenizerJson) {
  const std::string text = RankFile({"ab", "bc", "abc", "cd", "abcd", " a"});
  auto t = BpeTokenizer::FromTiktokenText(text, "ranks");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->tiktoken());
  EXPECT_EQ(t->SavedText(), text);
  auto saved = BpeTokenizer::FromSaved("tiktoken", t->SavedText(), "ckpt/tokenizer.model");
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  auto json = BpeTokenizer::FromTokenizerJsonText(t->ToTokenizerJson(), "tokenizer.json");
  ASSERT_TRUE(json.ok()) << json.status().message();
  EXPECT_FALSE(json->tiktoken());
  for (const char* s : {"abcd abc bcd", " abcdx ab", "<|eot_id|> x", "\xFF\xFE"}) {
    EXPECT_EQ(saved->Encode(s), t->Encode(s)) << s;
    EXPECT_EQ(json->Encode(s), t->Encode(s)) << s;
  }
  EXPECT_EQ(json->DocumentStart(), t->DocumentStart());
  EXPECT_EQ(json->eot(), t->eot());
  EXPECT_EQ(json->TokenId("<|eot_id|>"), t->TokenId("<|eot_id|>"));
  EXPECT_EQ(json->vocab_size(), t->vocab_size());
}

TEST(TiktokenRanks, BadRankFilesAreOneLineErrors) {
  const auto expect_error = [](const std::string& text, const std::string& needle) {
    auto t = BpeTokenizer::FromTiktokenText(text, "bad.model");
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find("bad.model"), 0u) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().message();
  };
  const std::string good = RankFile({"ab"});
  expect_error("", "holds no ranks");
  expect_error("{\"model\": {}}", "is JSON, not a tiktoken rank file");
  expect_error(good + "YWJj\n", "line 258 is not 'BASE64 RANK'");
  expect_error(good + "YWJj 257 x\n", "line 258 is not 'BASE64 RANK'");
  expect_error(good + "YW!j 257\n", "line 258: 'YW!j' is not base64");
  expect_error(good + "YWJ 257\n", "is not base64");
  expect_error(good + "YR== 257\n", "is not base64");  // bits the padding drops are not zero
  expect_error(good + "YWJj 25x\n", "the rank '25x' is not a number");
  expect_error(good + "YWJj -1\n", "is not a number");
  expect_error(good + "YWJj 9999999999\n", "not a number below 10^9");
  expect_error(good + "YWI= 257\n", "line 258 repeats the token of line 257");
  expect_error(good + "YWJj 256\n", "rank 256 is given twice");
  expect_error(good + "YWJj 300\n", "rank 300 is past the end");
  // No token for byte 0x41 ("A"): not a byte-level rank file.
  std::string missing;
  for (int b = 0; b < 256; ++b) {
    if (b != 'A') missing += Base64(std::string(1, char(b))) + " " + std::to_string(b < 'A' ? b : b - 1) + "\n";
  }
  expect_error(missing, "no token for byte 0x41");
  auto none = BpeTokenizer::FromTiktokenFile("/nonexistent/tokenizer.model");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("/nonexistent/tokenizer.model"), std::string::npos);
}

}  // namespace
}  // namespace pstar
