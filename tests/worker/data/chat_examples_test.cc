// Chat and instruction examples on a small byte-level tokenizer made here:
// each hostile JSONL line gets one line naming it, each chat format renders
// the template's text with the answers (and their end tokens) counted, an
// answer's first word counts even where it begins inside the prompt's last
// pre-token, and examples pack into rows by a pure function. The real
// templates against @huggingface/jinja are tests/worker/data/chat_format_test.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/worker/data/byte_level_spelling.h"
#include "worker/data/batch_loader.h"
#include "worker/data/chat_examples.h"
#include "worker/data/packed_rows.h"

namespace pstar {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// 256 byte tokens, merges "h e", "\n \n" and " y", and the chat formats' added tokens, from
// id 300 in `specials`' order; <think> and </think> are not special (as in
// Qwen3's file).
BpeTokenizer ChatTokenizer(const std::vector<std::string>& specials) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[test::ByteLevelSpelling(std::string(1, char(b)))] = b;
  vocab["he"] = 256;
  vocab[test::ByteLevelSpelling("\n\n")] = 257;
  vocab[test::ByteLevelSpelling(" y")] = 258;
  Json added = Json::array();
  int id = 300;
  for (const std::string& s : specials) {
    added.push_back({{"id", id++}, {"content", s}, {"special", s != "<think>" && s != "</think>"}});
  }
  Json j;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  const char* pattern =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "Split"}, {"pattern", {{"Regex", pattern}}},
                                                        {"behavior", "Isolated"}, {"invert", false}},
                                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  if (specials.front() == "<|begin_of_text|>") {  // Llama 3's post-processor: BOS before each document
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", Json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                   {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                           {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {300}}}}}}};
  }
  const auto merge = [](const char* a, const char* b) {
    return Json::array({test::ByteLevelSpelling(a), test::ByteLevelSpelling(b)});
  };
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({merge("h", "e"), merge("\n", "\n"), merge(" ", "y")})}};
  auto t = BpeTokenizer::FromTokenizerJsonText(j.dump(), "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) std::abort();
  return std::move(t).value();
}

const std::vector<std::string> kLlama3 = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                          "<|end_header_id|>", "<|eot_id|>"};
const std::vector<std::string> kQwen3 = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};

std::string ParseError(const std::string& text) {
  auto r = ParseJsonlExamples(text, "chat.jsonl");
  EXPECT_FALSE(r.ok()) << "accepted: " << text.substr(0, 200);
  return r.ok() ? "" : r.status().message();
}

TEST(JsonlExamples, EachHostileLineIsRefusedInOneLineNamingIt) {
  const std::string good = R"({"prompt": "a", "completion": "b"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good + "\n" + "{\"prompt\": \"caf\xC3\", \"completion\": \"b\"}", "chat.jsonl line 2: not valid UTF-8"},
      {good + "\n\n" + R"({"prompt": "a", "compl)", "chat.jsonl line 3: not a JSON object (a syntax error at byte"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}]})",
       "line 1: message 2 has role \"tool\" (system, user or assistant)"},
      {R"({"prompt": "a", "completion": ""})", "line 1: an empty completion"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]})",
       "line 1: message 2 is an empty answer"},
      {R"({"messages": [{"role": "user", "content": "q"}]})", "line 1: no assistant message"},
      {R"({"prompt": "a"})", "line 1: \"completion\" must be a string"},
      {R"({"prompt": "a", "completion": 7})", "line 1: \"completion\" must be a string"},
      {R"({"text": "a"})", "line 1: has neither \"messages\" nor \"prompt\" and \"completion\""},
      {R"({"messages": [{"role": "user", "content": "q"}], "prompt": "a"})", "has both"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "message 1 must be an object"},
      {R"({"messages": []})", "\"messages\" must be a non-empty array"},
      {R"(["prompt", "completion"])", "line 1: not a JSON object"},
      {R"({"prompt": "\ud800", "completion": "b"})", "line 1: an unpaired UTF-16 surrogate escape"},
      // A number past a double's range (found by the jsonl_examples fuzz target).
      {R"({"prompt": "a", "completion": "b", "n": 1e999})", "line 1: not a JSON object pstar reads (a number too large"},
      {"", "chat.jsonl: no examples"},
      {"\n  \n", "chat.jsonl: no examples"},
  };
  for (const auto& [text, want] : cases) {
    const std::string got = ParseError(text);
    EXPECT_NE(got.find(want), std::string::npos) << "got: " << got << "\nwant: " << want;
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
  // A 10 MB line is refused by its size, before anything parses it.
  const std::string huge = R"({"prompt": ")" + std::string(10 << 20, 'x') + R"(", "completion": "b"})";
  const std::string got = ParseError(good + "\n" + huge);
  EXPECT_NE(got.find("chat.jsonl line 2: " + std::to_string(huge.size()) + " bytes, over the 4 MiB an example line may hold"),
            std::string::npos)
      << got;
}

TEST(JsonlExamples, ReadsBothFormsSkippingBlankLinesAndCarriageReturns) {
  const std::string text =
      "{\"prompt\": \"p\", \"completion\": \"c\", \"id\": 7}\r\n\n"
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},)"
      R"( {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]})";
  auto r = ParseJsonlExamples(text, "chat.jsonl");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_TRUE((*r)[0].completion);
  EXPECT_EQ((*r)[0].line, 1);
  EXPECT_EQ((*r)[0].messages[1].content, "c");
  EXPECT_FALSE((*r)[1].completion);
  EXPECT_EQ((*r)[1].line, 3);
  ASSERT_EQ((*r)[1].messages.size(), 4u);
  EXPECT_EQ((*r)[1].messages[0].role, ChatMessage::Role::kSystem);
  EXPECT_EQ((*r)[1].messages[3].content, "more");
}

// The counted ids' text and the whole example's.
struct Rendered {
  std::string text, counted;
};
Rendered Render(const BpeTokenizer& t, const std::string& line, ChatFormat f) {
  auto ex = ParseJsonlExamples(line, "chat.jsonl");
  EXPECT_TRUE(ex.ok()) << ex.status().message();
  if (!ex.ok()) return {};
  auto e = TokenizeExample((*ex)[0], f, t);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (!e.ok()) return {};
  EXPECT_EQ(e->ids.size(), e->counted.size());
  Ids counted;
  for (size_t i = 0; i < e->ids.size(); ++i) {
    if (e->counted[i]) counted.push_back(e->ids[i]);
  }
  return {*t.Decode(e->ids), *t.Decode(counted)};
}

const std::string kTwoTurns =
    R"({"messages": [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "hi <|eot_id|>"},)"
    R"( {"role": "assistant", "content": "\n hello\t"}, {"role": "user", "content": "and?"},)"
    R"( {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nbye"}]})";

TEST(ChatFormats, Llama3RendersHeadersTrimsContentAndCountsEachAnswerWithItsEnd) {
  const BpeTokenizer t = ChatTokenizer(kLlama3);
  EXPECT_EQ(ChatFormatFor(t), ChatFormat::kLlama3);
  const Rendered r = Render(t, kTwoTurns, ChatFormat::kLlama3);
  EXPECT_EQ(r.text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi <|eot_id|><|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nand?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nhmm\n</think>\n\nbye<|eot_id|>");
  EXPECT_EQ(r.counted, "hello<|eot_id|><think>\nhmm\n</think>\n\nbye<|eot_id|>");
  // The user's "<|eot_id|>" is text: the only eot ids are the template's.
  auto ex = ParseJsonlExamples(kTwoTurns, "chat.jsonl");
  auto e = TokenizeExample((*ex)[0], ChatFormat::kLlama3, t);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(std::count(e->ids.begin(), e->ids.end(), *t.TokenId("<|eot_id|>")), 5);
}

TEST(ChatFormats, Llama31OpensWithItsSystemBlockAndQwen25WithItsDefaultSystemMessage) {
  const BpeTokenizer llama = ChatTokenizer(kLlama3);
  const Rendered with_system = Render(llama, kTwoTurns, ChatFormat::kLlama31);
  EXPECT_EQ(with_system.text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi <|eot_id|><|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nand?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nhmm\n</think>\n\nbye<|eot_id|>");
  EXPECT_EQ(with_system.counted, "hello<|eot_id|><think>\nhmm\n</think>\n\nbye<|eot_id|>");
  // Without a system message the block is there, empty after the date;
  // the date is the caller's.
  const std::string pc = R"({"prompt": "2+2?", "completion": " 4"})";
  auto ex = ParseJsonlExamples(pc, "chat.jsonl");
  ASSERT_TRUE(ex.ok());
  auto e = TokenizeExample((*ex)[0], ChatFormat::kLlama31, llama, "03 Dec 2026");
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(*llama.Decode(e->ids),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 03 Dec 2026\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>");
  const BpeTokenizer qwen = ChatTokenizer(kQwen3);
  const Rendered q = Render(qwen, pc, ChatFormat::kQwen25);
  EXPECT_EQ(q.text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n 4<|im_end|>\n");
  EXPECT_EQ(q.counted, " 4<|im_end|>");
  // An example's own system message replaces the default: ChatML's text.
  EXPECT_EQ(Render(qwen, kTwoTurns, ChatFormat::kQwen25).text, Render(qwen, kTwoTurns, ChatFormat::kChatml).text);
  for (const char* name : {"llama3.1", "qwen2.5"}) {
    auto f = ParseChatFormat(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_STREQ(ChatFormatName(*f), name);
  }
  EXPECT_NE(ParseChatFormat("llama3.2").status().message().find("llama3.1, chatml, qwen2.5"), std::string::npos);
}

TEST(ChatFormats, ChatmlAndQwen3RenderTheirTurnsAndQwen3ThinksOnlyAfterTheLastQuestion) {
  const BpeTokenizer t = ChatTokenizer(kQwen3);
  EXPECT_EQ(ChatFormatFor(t), ChatFormat::kQwen3);
  EXPECT_EQ(ChatFormatFor(ChatTokenizer({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})), ChatFormat::kChatml);
  EXPECT_EQ(ChatFormatFor(ChatTokenizer({"<|endoftext|>"})), ChatFormat::kNone);
  const Rendered chatml = Render(t, kTwoTurns, ChatFormat::kChatml);
  EXPECT_EQ(chatml.text,
            "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\nhi <|eot_id|><|im_end|>\n"
            "<|im_start|>assistant\n\n hello\t<|im_end|>\n<|im_start|>user\nand?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nbye<|im_end|>\n");
  // The first answer's "\n" joins the header's in one token, which counts.
  EXPECT_EQ(chatml.counted, "\n\n hello\t<|im_end|><think>\nhmm\n</think>\n\nbye<|im_end|>");
  const Rendered qwen = Render(t, kTwoTurns, ChatFormat::kQwen3);
  EXPECT_EQ(qwen.text,
            "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\nhi <|eot_id|><|im_end|>\n"
            "<|im_start|>assistant\n\n hello\t<|im_end|>\n<|im_start|>user\nand?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nbye<|im_end|>\n");
  // An answer before the last question loses its thinking; the last one
  // gets an empty block when it has none.
  const std::string think_first =
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>x</think>a"},)"
      R"( {"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]})";
  const Rendered q2 = Render(t, think_first, ChatFormat::kQwen3);
  EXPECT_EQ(q2.text,
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nr<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n");
  EXPECT_EQ(q2.counted, "a<|im_end|><think>\n\n</think>\n\nb<|im_end|>");
}

TEST(ChatFormats, NoneIsOneDocumentWhoseCompletionCountsFromTheTokenHoldingItsFirstByte) {
  const BpeTokenizer t = ChatTokenizer(kLlama3);
  // "Answer: " + "yes": the whole text's pre-tokens are "Answer", ":" and
  // " yes", whose space is the prompt's; that token counts, as Hugging
  // Face's char_to_token of the completion's first byte gives it.
  const Rendered r = Render(t, R"({"prompt": "Answer: ", "completion": "yes"})", ChatFormat::kNone);
  EXPECT_EQ(r.text, "<|begin_of_text|>Answer: yes<|end_of_text|>");
  EXPECT_EQ(r.counted, " yes<|end_of_text|>");
  const Rendered split = Render(t, R"({"prompt": "Answer:", "completion": " yes"})", ChatFormat::kNone);
  EXPECT_EQ(split.counted, " yes<|end_of_text|>");
  // Inside a word: "he" is one token that "h" + "e" makes.
  const Rendered word = Render(t, R"({"prompt": "h", "completion": "ello"})", ChatFormat::kNone);
  EXPECT_EQ(word.counted, "hello<|end_of_text|>");
  auto ex = ParseJsonlExamples(kTwoTurns, "chat.jsonl");
  auto e = TokenizeExample((*ex)[0], ChatFormat::kNone, t);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("none takes prompt/completion lines"), std::string::npos);
  auto missing = TokenizeExample((*ex)[0], ChatFormat::kLlama3, ChatTokenizer(kQwen3));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no <|begin_of_text|> token"), std::string::npos)
      << missing.status().message();
}

TEST(ChatFormats, PythonsStripIsTheTrimOfLlama3sTemplate) {
  EXPECT_EQ(StripPythonWhitespace(" \t\n\x1C x y \xC2\x85\xE3\x80\x80"), "x y");
  EXPECT_EQ(StripPythonWhitespace("\xEF\xBB\xBFx"), "\xEF\xBB\xBFx");  // U+FEFF is not whitespace to Python
  EXPECT_EQ(StripPythonWhitespace("   "), "");
  EXPECT_EQ(StripPythonWhitespace("caf\xC3\xA9 "), "caf\xC3\xA9");
}

// An example of ids 0..n-1 with the last `answer` counted.
TokenizedExample Example(int64_t line, int32_t first, int64_t n, int64_t answer) {
  TokenizedExample e;
  e.line = line;
  for (int64_t i = 0; i < n; ++i) {
    e.ids.push_back(first + int32_t(i));
    e.counted.push_back(i >= n - answer ? 1 : 0);
  }
  return e;
}

struct RowView {
  Ids tokens, targets, positions;
};
RowView RowOf(const PackedRows& p, int64_t r) {
  RowView v{Ids(size_t(p.seq())), Ids(size_t(p.seq())), Ids(size_t(p.seq()))};
  p.Row(r, v.tokens.data(), v.targets.data(), v.positions.data());
  return v;
}

TEST(PackedRows, BestFitLongestFirstWithTargetsAndPositionsPerExample) {
  // Positions 6, 5, 4, 3 and 2 (of lines 1 to 5) into rows of 10: {6, 4}
  // and {5, 3, 2}.
  std::vector<TokenizedExample> ex = {Example(1, 10, 7, 3), Example(2, 20, 6, 6), Example(3, 30, 5, 1),
                                      Example(4, 40, 4, 2), Example(5, 50, 3, 1)};
  auto p = PackedRows::Pack(ex, 10, OverlongPolicy::kError, 1, /*pad=*/0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->rows(), 2);
  std::multiset<std::vector<int32_t>> starts;
  int64_t counted = 0;
  for (int64_t r = 0; r < p->rows(); ++r) {
    const RowView v = RowOf(*p, r);
    std::vector<int32_t> firsts;
    int64_t row_counted = 0;
    for (int64_t t = 0; t < 10; ++t) {
      if (v.positions[size_t(t)] == 0) firsts.push_back(v.tokens[size_t(t)]);
      // Within an example: position steps by one and the target, where kept, is the next id.
      if (t > 0 && v.positions[size_t(t)] != 0) {
        EXPECT_EQ(v.positions[size_t(t)], v.positions[size_t(t - 1)] + 1);
        EXPECT_EQ(v.tokens[size_t(t)], v.tokens[size_t(t - 1)] + 1);
      }
      if (v.targets[size_t(t)] >= 0) {
        EXPECT_EQ(v.targets[size_t(t)], v.tokens[size_t(t)] + 1);
        ++row_counted;
      }
    }
    EXPECT_EQ(row_counted, p->Counted(r));
    counted += row_counted;
    starts.insert(firsts);
  }
  EXPECT_EQ(starts, (std::multiset<std::vector<int32_t>>{{10, 30}, {20, 40, 50}}));
  // Each example's counted ids become targets: 3 + (6 - 1, the first id
  // predicts nothing) + 1 + 2 + 1.
  EXPECT_EQ(counted, 12);
  // A pure function: the same rows again; another seed orders them otherwise, same set.
  auto again = PackedRows::Pack(ex, 10, OverlongPolicy::kError, 1, 0);
  for (int64_t r = 0; r < p->rows(); ++r) EXPECT_EQ(RowOf(*p, r).tokens, RowOf(*again, r).tokens);
}

TEST(PackedRows, AnOverlongExampleIsCutOrRefusedAndOneLeftWithNothingCountedIsDropped) {
  std::vector<TokenizedExample> ex = {Example(4, 0, 12, 3), Example(9, 100, 12, 1), Example(11, 200, 3, 1)};
  auto refused = PackedRows::Pack(ex, 8, OverlongPolicy::kError, 1, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "line 4: 12 tokens, longer than a row of train.seq_len 8 + 1 (data.overlong: error; truncate cuts it)");
  ex[0] = Example(4, 0, 12, 9);  // its answer starts inside the first 9 ids
  auto cut = PackedRows::Pack(ex, 8, OverlongPolicy::kTruncate, 1, 99);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_EQ(cut->counts().truncated, 2);
  EXPECT_EQ(cut->counts().dropped, 1);  // line 9's one counted id was cut away
  EXPECT_EQ(cut->counts().examples, 2);
  ASSERT_EQ(cut->rows(), 2);
  int64_t padding = 0;
  for (int64_t r = 0; r < cut->rows(); ++r) {
    const RowView v = RowOf(*cut, r);
    for (int64_t t = 0; t < 8; ++t) {
      if (v.tokens[size_t(t)] == 99) {
        ++padding;
        EXPECT_EQ(v.targets[size_t(t)], -1);
        EXPECT_EQ(v.positions[size_t(t)], 0);  // each padding position its own example
      }
    }
  }
  EXPECT_EQ(padding, 8 - 2);  // the 3-id example fills 2 of its row
}

TEST(PackedRows, TheLoaderTakesEachRanksRowsAndCountsTheStepsTargetsAhead) {
  std::vector<TokenizedExample> ex;
  for (int i = 0; i < 6; ++i) ex.push_back(Example(i + 1, 100 * i, 9, 1 + i));
  auto p = PackedRows::Pack(ex, 8, OverlongPolicy::kError, 3, 0);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->rows(), 6);
  auto rank1 = BatchLoader::Create(*p, 1, 8, 1, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status().message();
  EXPECT_TRUE(rank1->packed());
  EXPECT_EQ(rank1->CountedAhead(2), p->Counted(0) + p->Counted(1) + p->Counted(2) + p->Counted(3));
  Ids tokens(8), targets(8), positions(8);
  rank1->Next(tokens.data(), targets.data(), positions.data());
  EXPECT_EQ(tokens, RowOf(*p, 1).tokens);
  EXPECT_EQ(positions, RowOf(*p, 1).positions);
  rank1->Next(tokens.data(), targets.data(), positions.data());
  rank1->Next(tokens.data(), targets.data(), positions.data());
  EXPECT_EQ(tokens, RowOf(*p, 5).tokens);
  rank1->Next(tokens.data(), targets.data(), positions.data());  // wraps
  EXPECT_EQ(tokens, RowOf(*p, 1).tokens);
  auto too_few = BatchLoader::Create(*p, 4, 8, 0, 2);
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.status().message().find("pack into 6 rows, fewer than one step needs (ranks*batch_size = 8)"),
            std::string::npos);
}

}  // namespace
}  // namespace pstar
