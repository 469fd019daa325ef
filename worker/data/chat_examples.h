// Chat and instruction examples (data.source jsonl): one JSON object a line,
// {"prompt": ..., "completion": ...} or {"messages": [{"role", "content"},
// ...]}, rendered in a model family's chat format and tokenized with the
// ids the loss counts marked: every answer's tokens (the completion, each
// assistant turn) and the end token after each.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/core/status.h"
#include "worker/data/bpe_tokenizer.h"

namespace pstar {

// How examples become text, as the families' published chat templates
// render them (docs/data.md gives each): none (the prompt and completion
// as one document), llama3 (Llama 3's headers and <|eot_id|>), llama3.1
// (the same after Llama 3.1 to 3.3 Instruct's system block: its knowledge
// cutoff and date, then any system message), chatml (<|im_start|>role ...
// <|im_end|>, as many models use it), qwen2.5 (ChatML with Qwen2.5
// Instruct's default system message where an example has none), qwen3
// (ChatML with Qwen3's <think> block on the answers after the last
// question).
enum class ChatFormat { kNone, kLlama3, kLlama31, kChatml, kQwen25, kQwen3 };
const char* ChatFormatName(ChatFormat f);
// "auto" resolves through ChatFormatFor.
Result<ChatFormat> ParseChatFormat(std::string_view name);
// The format a tokenizer's special tokens name: llama3 with
// <|start_header_id|> and <|eot_id|>, qwen3 with <|im_start|>, <|im_end|>
// and <think>, chatml with the first two of those, none otherwise.
ChatFormat ChatFormatFor(const BpeTokenizer& tokenizer);

struct ChatMessage {
  enum class Role { kSystem, kUser, kAssistant };
  Role role = Role::kUser;
  std::string content;
};

struct ChatExample {
  int64_t line = 0;        // 1-based, in its file
  bool completion = false;  // a prompt/completion line: messages are the user's prompt and the answer
  std::vector<ChatMessage> messages;
};

// Every line of a JSONL file (`source` names it in errors). Blank lines are
// skipped; anything else that is not one example is refused, naming its
// line: not JSON or not UTF-8, a line over kMaxExampleLineBytes, neither
// form or both, a role other than system, user and assistant, a
// non-string content, an empty completion or answer, no answer at all.
inline constexpr size_t kMaxExampleLineBytes = size_t(4) << 20;
Result<std::vector<ChatExample>> ParseJsonlExamples(std::string_view text, const std::string& source);

// One example's ids and, per id, whether the loss counts it.
struct TokenizedExample {
  int64_t line = 0;
  std::vector<int32_t> ids;
  std::vector<uint8_t> counted;
};

// Renders `example` in `format` and tokenizes it as the template's text
// would be: the format's control tokens by id, everything between them
// through Encode (so a user's text cannot forge a control token), with the
// answers' tokens counted from the first token holding their first byte.
// Fails where the format lacks a token it needs or refuses the example
// (messages under none).
// `date` is llama3.1's "Today Date" (the template's own when none is given:
// kLlama31Date; transformers fills in the day it renders).
inline constexpr char kLlama31Date[] = "26 Jul 2024";
Result<TokenizedExample> TokenizeExample(const ChatExample& example, ChatFormat format,
                                         const BpeTokenizer& tokenizer, std::string_view date = kLlama31Date);

// Python's str.strip() (Jinja's trim in transformers): Unicode whitespace
// (White_Space, and U+001C..U+001F) at both ends of UTF-8 text.
std::string_view StripPythonWhitespace(std::string_view s);

}  // namespace pstar
