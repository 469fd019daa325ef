// GPT-2's pre-tokenization and the byte-level BPE on small vocabularies made
// here. The real GPT-2 vocabulary against tiktoken is tests/data/
// gpt2_tokenizer_test.py.
#include "worker/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>

#include "tests/test_util.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace pstar {
namespace {

using Words = std::vector<std::string_view>;

TEST(Gpt2Words, FollowGpt2sPattern) {
  EXPECT_EQ(Gpt2Words("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(Gpt2Words("it's don't we'll I've you're I'm he'd"),
            (Words{"it", "'s", " don", "'t", " we", "'ll", " I", "'ve", " you", "'re", " I", "'m", " he", "'d"}));
  // Contractions are lower-case only; otherwise the apostrophe is punctuation.
  EXPECT_EQ(Gpt2Words("IT'S"), (Words{"IT", "'", "S"}));
  EXPECT_EQ(Gpt2Words("''s"), (Words{"''", "s"}));
  EXPECT_EQ(Gpt2Words("abc123 456!!  ?"), (Words{"abc", "123", " 456", "!!", " ", " ?"}));
  // A whitespace run gives its last space to the next word, unless that is all it has.
  EXPECT_EQ(Gpt2Words("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(Gpt2Words("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Gpt2Words("a \nb"), (Words{"a", " ", "\n", "b"}));
  EXPECT_EQ(Gpt2Words("a\tb"), (Words{"a", "\t", "b"}));
  EXPECT_EQ(Gpt2Words("end  "), (Words{"end", "  "}));
  EXPECT_EQ(Gpt2Words(" "), (Words{" "}));
  // Unicode letters, numbers (Nd, No) and spaces (U+00A0, U+3000).
  EXPECT_EQ(Gpt2Words("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC"), (Words{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"}));
  EXPECT_EQ(Gpt2Words("x\xC2\xB2\xD9\xA3"), (Words{"x", "\xC2\xB2\xD9\xA3"}));
  EXPECT_EQ(Gpt2Words("a\xC2\xA0\xE3\x80\x80z"), (Words{"a", "\xC2\xA0", "\xE3\x80\x80", "z"}));
  // Emoji are "other", and join punctuation next to them.
  EXPECT_EQ(Gpt2Words("ok \xF0\x9F\x8E\x89!"), (Words{"ok", " \xF0\x9F\x8E\x89!"}));
}

TEST(Gpt2Words, InvalidUtf8BytesAreOtherCharacters) {
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate.
  EXPECT_EQ(Gpt2Words("a\x80\x80 b"), (Words{"a", "\x80\x80", " b"}));
  EXPECT_EQ(Gpt2Words("\xE6\x97"), (Words{"\xE6\x97"}));
  EXPECT_EQ(Gpt2Words("x\xC0\xAF"), (Words{"x", "\xC0\xAF"}));
  EXPECT_EQ(Gpt2Words("\xED\xA0\x80y"), (Words{"\xED\xA0\x80", "y"}));
}

std::string RandomText(std::mt19937& rng, size_t n, bool bytes) {
  static const char* const kPieces[] = {" ", "  ", "\n", "\t", "a", "Z", "7", "'s", "'", "!", ".",
                                        "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x8E\x89", "\xC2\xA0", "\xD9\xA3"};
  std::string s;
  while (s.size() < n) {
    if (bytes) s.push_back(char(rng() & 0xFF));
    else s += kPieces[rng() % (sizeof kPieces / sizeof kPieces[0])];
  }
  return s;
}

TEST(Gpt2Words, ConcatenateToTheInputForAnyBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::string text = RandomText(rng, 1 + rng() % 300, trial % 2 == 0);
    std::string joined;
    for (std::string_view w : Gpt2Words(text)) {
      ASSERT_FALSE(w.empty());
      joined += w;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(Gpt2SafeCuts, PiecesSplitIntoTheSameWordsAsTheWhole) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const std::string text = RandomText(rng, 2000, trial % 4 == 0);
    const std::vector<size_t> cuts = Gpt2SafeCuts(text, 64);
    std::vector<std::string_view> pieced;
    size_t begin = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
      const size_t end = i < cuts.size() ? cuts[i] : text.size();
      ASSERT_LT(begin, end);
      for (std::string_view w : Gpt2Words(std::string_view(text).substr(begin, end - begin))) pieced.push_back(w);
      begin = end;
    }
    EXPECT_EQ(pieced, Gpt2Words(text)) << "trial " << trial;
    if (trial % 4 != 0) {
      EXPECT_GT(cuts.size(), 10u);
    }
  }
}

// GPT-2's byte-to-unicode form of a byte string (printable bytes stand for
// themselves, the others for 256 + n).
std::string Printable(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int code = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
      int n = 0;
      for (int x = 0; x < b; ++x) {
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
      }
      code = 256 + n;
    }
    if (code < 0x80) out.push_back(char(code));
    else out += {char(0xC0 | (code >> 6)), char(0x80 | (code & 0x3F))};
  }
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// A vocabulary: the 256 bytes, then the merges' results, then <|endoftext|>.
struct TinyVocab {
  std::vector<std::pair<std::string, std::string>> merges;  // byte strings
  std::string EncoderJson() const {
    std::string j = "{";
    int id = 0;
    for (int b = 0; b < 256; ++b, ++id) {
      j += (id ? "," : "") + JsonString(Printable(std::string(1, char(b)))) + ":" + std::to_string(id);
    }
    for (const auto& [l, r] : merges) {
      j += "," + JsonString(Printable(l + r)) + ":" + std::to_string(id);
      ++id;
    }
    return j + ",\"<|endoftext|>\":" + std::to_string(id) + "}";
  }
  std::string VocabBpe() const {
    std::string s = "#version: 0.2\n";
    for (const auto& [l, r] : merges) s += Printable(l) + " " + Printable(r) + "\n";
    return s;
  }
};

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class BpeTokenizerTest : public ::testing::Test {
 protected:
  BpeTokenizerTest() : dir_("bpe") {
    // Ranks: "h e" first, then "l l", "he ll", " w", "o !" ... "ll" before "he" would give other ids.
    vocab_.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}, {"hell", "o"}, {"o", "r"}, {" w", "or"},
                     {"a", "a"}, {"aa", "a"}, {"\xE6", "\x97"}};
  }
  Result<BpeTokenizer> Load(const TinyVocab& v) {
    Write(dir_.path() + "/encoder.json", v.EncoderJson());
    Write(dir_.path() + "/vocab.bpe", v.VocabBpe());
    return BpeTokenizer::FromGpt2Files(dir_.path() + "/encoder.json", dir_.path() + "/vocab.bpe");
  }
  test::TempDir dir_;
  TinyVocab vocab_;
};

TEST_F(BpeTokenizerTest, MergesByRank) {
  auto t = Load(vocab_);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->vocab_size(), 256 + 10 + 1);
  EXPECT_EQ(t->eot(), 266);
  // "hello" -> he, l, l, o -> he, ll, o -> hell, o -> hello (ids 256 + rank).
  EXPECT_EQ(t->Encode("hello"), (std::vector<int32_t>{260}));
  // " world": " w" + "or" -> " wor", then l, d stay bytes.
  EXPECT_EQ(t->Encode("hello world"), (std::vector<int32_t>{260, 262, 'l', 'd'}));
  // "aaaa": "a a" merges leftmost pairs first: aa, aa; "aa a" never applies to (aa, aa).
  EXPECT_EQ(t->Encode("aaaa"), (std::vector<int32_t>{263, 263}));
  EXPECT_EQ(t->Encode("aaa"), (std::vector<int32_t>{264}));
  // Words never merge across their boundary.
  EXPECT_EQ(t->Encode("he'll"), (std::vector<int32_t>{256, '\'', 257}));
  EXPECT_EQ(*t->Decode(t->Encode("hello world")), "hello world");
  EXPECT_EQ(*t->Decode(std::vector<int32_t>{266}), "<|endoftext|>");
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{267}).ok());
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{-1}).ok());
}

TEST_F(BpeTokenizerTest, AnyBytesRoundTrip) {
  auto t = Load(vocab_);
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const std::string text = RandomText(rng, 1 + rng() % 500, trial % 2 == 0);
    auto back = t->Decode(t->Encode(text));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
}

// The textbook merge loop on byte strings: the lowest-ranked adjacent pair
// (leftmost of equals) merges until none is ranked.
std::vector<std::string> NaiveBpe(const std::string& word, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> parts;
  for (char c : word) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    size_t best = parts.size();
    size_t best_rank = merges.size();
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      for (size_t r = 0; r < best_rank; ++r) {
        if (merges[r].first == parts[i] && merges[r].second == parts[i + 1]) {
          best = i;
          best_rank = r;
          break;
        }
      }
    }
    if (best == parts.size()) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + std::ptrdiff_t(best) + 1);
  }
  return parts;
}

TEST_F(BpeTokenizerTest, LongWordsMergeAsTheTextbookLoopDoes) {
  // Long words take the O(n log n) path; the textbook loop is the reference.
  vocab_.merges.insert(vocab_.merges.end(), {{"l", "o"}, {"lo", "w"}, {"e", "r"}, {"w", "er"}, {"he", "he"},
                                             {"o", "o"}, {"oo", "oo"}, {"r", "r"}});
  auto t = Load(vocab_);
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of[std::string(1, char(b))] = b;
  for (size_t r = 0; r < vocab_.merges.size(); ++r) id_of[vocab_.merges[r].first + vocab_.merges[r].second] = int32_t(256 + r);
  std::mt19937 rng(17);
  const std::string letters = "helowraa";
  for (int trial = 0; trial < 200; ++trial) {
    std::string word;
    const size_t n = 65 + rng() % 600;
    while (word.size() < n) word.push_back(letters[rng() % letters.size()]);
    std::vector<int32_t> want;
    for (const std::string& part : NaiveBpe(word, vocab_.merges)) want.push_back(id_of.at(part));
    ASSERT_EQ(t->Encode(word), want) << word;
  }
  // A megabyte-long word stays fast (the simple loop would take minutes).
  const std::string huge(size_t(1) << 20, 'o');
  const std::vector<int32_t> ids = t->Encode(huge);
  EXPECT_EQ(ids.size(), huge.size() / 4);
  EXPECT_EQ(*t->Decode(ids), huge);
}

TEST_F(BpeTokenizerTest, TokenizerJsonGivesTheSameIds) {
  auto gpt2 = Load(vocab_);
  ASSERT_TRUE(gpt2.ok());
  // Hugging Face's form: the vocab, merges as strings (older files) or pairs (newer).
  std::string enc = vocab_.EncoderJson();
  const std::string eot_entry = ",\"<|endoftext|>\":266}";
  ASSERT_EQ(enc.substr(enc.size() - eot_entry.size()), eot_entry);
  enc = enc.substr(0, enc.size() - eot_entry.size()) + "}";
  for (bool pairs : {false, true}) {
    std::string merges = "[";
    for (size_t i = 0; i < vocab_.merges.size(); ++i) {
      const std::string l = JsonString(Printable(vocab_.merges[i].first));
      const std::string r = JsonString(Printable(vocab_.merges[i].second));
      merges += (i ? "," : "") + (pairs ? "[" + l + "," + r + "]"
                                        : JsonString(Printable(vocab_.merges[i].first) + " " +
                                                     Printable(vocab_.merges[i].second)));
    }
    merges += "]";
    Write(dir_.path() + "/tokenizer.json",
          "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":266,\"content\":\"<|endoftext|>\",\"special\":true}],"
          "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true},"
          "\"model\":{\"type\":\"BPE\",\"vocab\":" + enc + ",\"merges\":" + merges + "}}");
    auto hf = BpeTokenizer::FromTokenizerJson(dir_.path() + "/tokenizer.json");
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_EQ(hf->eot(), 266);
    for (const char* text : {"hello world", "aaaaa he'll", "\xE6\x97\xA5 x"}) {
      EXPECT_EQ(hf->Encode(text), gpt2->Encode(text)) << text;
    }
  }
}

TEST_F(BpeTokenizerTest, WritesFilesThatReadBackToTheSameTokenizer) {
  auto t = Load(vocab_);
  ASSERT_TRUE(t.ok());
  Write(dir_.path() + "/out.json", t->ToTokenizerJson());
  Write(dir_.path() + "/vocab.json", t->ToVocabJson());
  Write(dir_.path() + "/merges.txt", t->ToMergesTxt());
  auto from_json = BpeTokenizer::FromTokenizerJson(dir_.path() + "/out.json");
  auto from_files = BpeTokenizer::FromGpt2Files(dir_.path() + "/vocab.json", dir_.path() + "/merges.txt");
  ASSERT_TRUE(from_json.ok()) << from_json.status().message();
  ASSERT_TRUE(from_files.ok()) << from_files.status().message();
  for (const char* text : {"hello world", "aaaaa he'll \xE6\x97\xA5", "\x80\xFF bytes"}) {
    EXPECT_EQ(from_json->Encode(text), t->Encode(text)) << text;
    EXPECT_EQ(from_files->Encode(text), t->Encode(text)) << text;
  }
  EXPECT_EQ(from_json->eot(), t->eot());
  EXPECT_EQ(from_json->vocab_size(), t->vocab_size());
  EXPECT_EQ(from_json->ToTokenizerJson(), t->ToTokenizerJson());
}

TEST_F(BpeTokenizerTest, BadFilesAreOneLineErrors) {
  const std::string enc = dir_.path() + "/encoder.json", bpe = dir_.path() + "/vocab.bpe";
  const auto expect_error = [&](const std::string& enc_text, const std::string& bpe_text, const std::string& needle) {
    Write(enc, enc_text);
    Write(bpe, bpe_text);
    auto t = BpeTokenizer::FromGpt2Files(enc, bpe);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  };
  expect_error("{", vocab_.VocabBpe(), "not valid JSON");
  expect_error("[1,2]", vocab_.VocabBpe(), "expected a JSON object");
  expect_error("{\"a\":\"x\"}", "", "is not an integer");
  expect_error("{\"a\":99999999}", "", "outside 0..");
  expect_error("{\"a\":0,\"b\":0}", "", "used twice");
  expect_error("{\"a\":0,\"<|endoftext|>\":1}", "", "no token for byte 0x00");
  TinyVocab no_eot = vocab_;
  std::string j = no_eot.EncoderJson();
  j = j.substr(0, j.rfind(",\"<|endoftext|>\"")) + "}";
  expect_error(j, vocab_.VocabBpe(), "no <|endoftext|> token");
  expect_error(vocab_.EncoderJson(), "#version: 0.2\nh e\nq\n", "line 3 is not a merge");
  expect_error(vocab_.EncoderJson(), "#version: 0.2\nh e\nx y\n", "merge 2 ('x y') names a token");
  auto missing = BpeTokenizer::FromGpt2Files(dir_.path() + "/nope.json", bpe);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);

  Write(dir_.path() + "/tokenizer.json", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
  auto wp = BpeTokenizer::FromTokenizerJson(dir_.path() + "/tokenizer.json");
  ASSERT_FALSE(wp.ok());
  EXPECT_NE(wp.status().message().find("only BPE models are supported"), std::string::npos);
  Write(dir_.path() + "/tokenizer.json",
        "{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}");
  auto ws = BpeTokenizer::FromTokenizerJson(dir_.path() + "/tokenizer.json");
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.status().message().find("pre_tokenizer Whitespace is not supported"), std::string::npos);
}

}  // namespace
}  // namespace pstar
