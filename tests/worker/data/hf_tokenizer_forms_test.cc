// The tokenizer.json forms BpeTokenizer reads, on small files made here:
// the pre-tokenization pattern on PCRE2, byte-level BPE with Split, added
// and special tokens, ignore_merges, the post-processor's document tokens and
// NFC (Llama 3 and Qwen's form), SentencePiece-style BPE with Metaspace or
// the legacy normalizer and byte fallback (Llama 2 and Mistral's form), and a
// one-line refusal for each part not supported. The real files against the
// reference tokenizers are tests/worker/data/hf_tokenizer_test.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/data/byte_level_spelling.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/regex_splitter.h"

namespace pstar {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> Pieces(const RegexSplitter& r, std::string_view text) {
  std::vector<std::string_view> views;
  r.Split(text, views);
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(RegexSplitter, CutsTextAsThePatternMatchesIt) {
  auto r = RegexSplitter::Compile(kLlama3Pattern, "test");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Pieces(*r, "Hello world's 12345\n\n  x!!"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", "123", "45", "\n\n", " ", " x", "!!"}));
  EXPECT_EQ(Pieces(*r, "HE'S"), (std::vector<std::string>{"HE", "'S"}));  // (?i:...) over the contractions
  // Unicode classes: a Cyrillic word with its space, CJK, and U+3000 as whitespace.
  EXPECT_EQ(Pieces(*r, "\xD0\x9F\xD1\x80\xD0\xB8 \xE6\x97\xA5\xE6\x9C\xAC\xE3\x80\x80x"),
            (std::vector<std::string>{"\xD0\x9F\xD1\x80\xD0\xB8", " \xE6\x97\xA5\xE6\x9C\xAC", "\xE3\x80\x80x"}));
  // Invalid UTF-8 never matches: it is a stretch of its own, and the pieces
  // still join to the input.
  const std::string bad = "ab\xFF" "cd \xC3";
  const auto pieces = Pieces(*r, bad);
  EXPECT_EQ(pieces, (std::vector<std::string>{"ab", "\xFF", "cd", " ", "\xC3"}));
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, bad);
  auto broken = RegexSplitter::Compile("(unclosed", "tokenizer.json: pre_tokenizer Split");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("tokenizer.json: pre_tokenizer Split: the pattern does not compile at offset"),
            std::string::npos)
      << broken.status().message();
  EXPECT_NE(RegexSplitter::EngineVersion().find("Unicode"), std::string::npos);
}

using test::ByteLevelSpelling;

// A Llama 3-style file: 256 byte tokens, merges "h e", "l l", "he ll",
// "hell o", "Ġ w"; a token "xyz" no merge reaches; the added tokens
// <|begin_of_text|> (300) and <|eot_id|> (301), special, and <think> (302),
// not special; BOS before every sequence.
Json ByteLevelFile() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelSpelling(std::string(1, char(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  Json m = Json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[ByteLevelSpelling(a + b)] = id++;
    m.push_back(Json::array({ByteLevelSpelling(a), ByteLevelSpelling(b)}));
  }
  vocab["xyz"] = id++;
  Json j;
  j["added_tokens"] = Json::array({{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
                                   {{"id", 301}, {"content", "<|eot_id|>"}, {"special", true}},
                                   {{"id", 302}, {"content", "<think>"}, {"special", false}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}},
                                                        {"behavior", "Isolated"}, {"invert", false}},
                                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {300}}}}}}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", m}};
  return j;
}

Result<BpeTokenizer> Read(const Json& j) { return BpeTokenizer::FromTokenizerJsonText(j.dump(), "tokenizer.json"); }

TEST(HfTokenizerJson, ByteLevelWithSplitAddedTokensAndTemplate) {
  auto t = Read(ByteLevelFile());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->vocab_size(), 303);
  EXPECT_EQ(t->DocumentStart(), (Ids{300}));
  EXPECT_EQ(t->eot(), -1);
  EXPECT_FALSE(t->gpt2_pretokenizer());
  // "hello" merges to 259; " world" is " w" (260) then bytes.
  EXPECT_EQ(t->Encode("hello world"), (Ids{259, 260, 'o', 'r', 'l', 'd'}));
  // ignore_merges: a word that is a token is that token, merges or not.
  EXPECT_EQ(t->Encode("xyz"), (Ids{261}));
  // Special tokens only where allowed; a non-special added token always.
  const std::string text = "<|eot_id|>hello<think>";
  EXPECT_EQ(t->Encode(text, /*special=*/true), (Ids{301, 259, 302}));
  const Ids ordinary = t->Encode(text);
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 301), 0);
  EXPECT_EQ(ordinary.back(), 302);
  EXPECT_EQ(*t->Decode(ordinary), text);
  EXPECT_EQ(*t->Decode(t->Encode(text, true)), text);
  EXPECT_EQ(t->TokenId("<|eot_id|>"), std::optional<int32_t>(301));
  // Any bytes round-trip.
  const std::string bytes = "\xFF\xFE caf\xC3\xA9 \x80";
  EXPECT_EQ(*t->Decode(t->Encode(bytes)), bytes);
  // Documents: BOS before each.
  EXPECT_EQ(EncodeDocuments(*t, {"hello", "xyz"}, 2), (Ids{300, 259, 300, 261}));
  // Without ignore_merges "xyz" is its bytes.
  Json j = ByteLevelFile();
  j["model"]["ignore_merges"] = false;
  auto plain = Read(j);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->Encode("xyz"), (Ids{'x', 'y', 'z'}));
  // lstrip/rstrip take the whitespace beside the token.
  j = ByteLevelFile();
  j["added_tokens"][2]["lstrip"] = true;
  j["added_tokens"][2]["rstrip"] = true;
  auto strip = Read(j);
  ASSERT_TRUE(strip.ok()) << strip.status().message();
  EXPECT_EQ(strip->Encode("hello  <think> \nhello"), (Ids{259, 302, 259}));
}

TEST(HfTokenizerJson, NfcNormalizerMakesEquivalentTextOneEncoding) {
  Json j = ByteLevelFile();
  j["normalizer"] = {{"type", "NFC"}};
  auto t = Read(j);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->Encode("caf" "e\xCC\x81"), t->Encode("caf\xC3\xA9"));
  EXPECT_FALSE(t->lossless());
  EXPECT_TRUE(Read(ByteLevelFile())->lossless());
  EXPECT_NE(Read(ByteLevelFile())->Encode("caf" "e\xCC\x81"), t->Encode("caf\xC3\xA9"));
}

// A SentencePiece-style file: <unk> <s> </s>, the 256 byte tokens, then
// "▁", letters and merges; Metaspace (prepend_scheme first) or the legacy
// normalizer, byte fallback, <s> before every sequence.
Json SentencePieceFile(bool legacy) {
  const std::string sp = "\xE2\x96\x81";
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const std::string& s : {sp, std::string("h"), std::string("e"), std::string("l"), std::string("o"),
                              std::string("w"), std::string("r"), std::string("d")}) {
    vocab[s] = id++;
  }
  Json merges = Json::array();
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {sp, "h"}, {"e", "l"}, {sp + "h", "el"}, {sp + "hel", "l"}, {sp + "hell", "o"}, {sp, "w"}, {"o", "r"}}) {
    vocab[a + b] = id++;
    merges.push_back(a + " " + b);
  }
  Json j;
  j["added_tokens"] = Json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                   {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 2}, {"content", "</s>"}, {"special", true}}});
  if (legacy) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", Json::array({{{"type", "Prepend"}, {"prepend", sp}},
                                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}};
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = {{"type", "Sequence"},
                    {"decoders", Json::array({{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                                              {{"type", "ByteFallback"}},
                                              {{"type", "Fuse"}},
                                              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  } else {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "first"}, {"split", false}};
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "first"}, {"split", false}};
  }
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}}}};
  j["model"] = {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
                {"vocab", vocab}, {"merges", merges}};
  return j;
}

TEST(HfTokenizerJson, SentencePieceStyleWithByteFallback) {
  for (bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "legacy normalizer" : "Metaspace");
    auto t = Read(SentencePieceFile(legacy));
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->DocumentStart(), (Ids{1}));
    EXPECT_EQ(t->eot(), 2);  // </s>
    EXPECT_FALSE(t->lossless());
    // "▁hello" merges whole (id 271); "▁w" (272) then "or" (273), "l", "d".
    EXPECT_EQ(t->Encode("hello world"), (Ids{271, 272, 273, 262, 266}));
    // "é" is not in the vocabulary: its two bytes' fallback tokens.
    EXPECT_EQ(t->Encode("h\xC3\xA9"), (Ids{267, 3 + 0xC3, 3 + 0xA9}));
    for (const char* text : {"hello world", "h\xC3\xA9  wor\nld", "x  two spaces"}) {
      EXPECT_EQ(*t->Decode(t->Encode(text)), text);
    }
    // Where the forms differ, as Hugging Face's tokenizers do: the legacy
    // normalizer prepends "▁" to every stretch, Metaspace (first) only to
    // the text's start, and not where the text starts with a space (whose
    // decoding then loses it).
    EXPECT_EQ(*t->Decode(t->Encode("<s>hello", true)), legacy ? "<s> hello" : "<s>hello");
    EXPECT_EQ(*t->Decode(t->Encode("  two")), legacy ? "  two" : " two");
  }
}

TEST(HfTokenizerJson, EveryUnsupportedPartIsOneLineNamingTheFile) {
  const auto expect_refused = [](Json j, const std::string& needle) {
    auto t = Read(j);
    ASSERT_FALSE(t.ok()) << needle;
    const std::string m = t.status().message();
    EXPECT_EQ(m.rfind("tokenizer.json: ", 0), 0u) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  Json j = ByteLevelFile();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_refused(j, "normalizer Lowercase is not supported");
  j = ByteLevelFile();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_refused(j, "only Isolated");
  j = ByteLevelFile();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(?<bad"}};
  expect_refused(j, "does not compile");
  j = ByteLevelFile();
  j["model"]["dropout"] = 0.1;
  expect_refused(j, "model.dropout");
  j = ByteLevelFile();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_refused(j, "model.continuing_subword_prefix");
  j = ByteLevelFile();
  j["decoder"] = {{"type", "Metaspace"}};
  expect_refused(j, "does not match the byte-level pre-tokenizer");
  j = ByteLevelFile();
  j["added_tokens"][0]["single_word"] = true;
  expect_refused(j, "single_word");
  j = ByteLevelFile();
  j["added_tokens"][1]["id"] = 5;
  expect_refused(j, "which the vocabulary gives another token");
  j = ByteLevelFile();
  j["post_processor"] = {{"type", "BertProcessing"}};
  expect_refused(j, "post_processor BertProcessing is not supported");
  j = ByteLevelFile();
  j["post_processor"] = nullptr;
  expect_refused(j, "gives a token between documents");
  j = SentencePieceFile(false);
  j["model"]["byte_fallback"] = false;
  j["model"].erase("unk_token");
  expect_refused(j, "some text would not encode");
  j = SentencePieceFile(false);
  j["model"]["vocab"].erase("<0x41>");
  expect_refused(j, "no <0x41> token");
  j = SentencePieceFile(false);
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect_refused(j, "prepend_scheme 'sometimes'");
  j = SentencePieceFile(true);
  j["decoder"]["decoders"][3]["start"] = 2;
  expect_refused(j, "decoder step Strip is not supported");
}

}  // namespace
}  // namespace pstar
