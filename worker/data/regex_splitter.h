// RegexSplitter: a tokenizer's pre-tokenization pattern (tokenizer.json's
// Split with behavior "Isolated", tiktoken's pat_str) on PCRE2 with its JIT.
// Text is cut into pieces: every match, and every stretch between matches,
// in order, so the pieces' concatenation is the input byte for byte.
//
// Patterns are compiled in UTF and UCP mode (\p{L}, \s and case-insensitive
// groups over Unicode, as the regex engines of Hugging Face tokenizers and
// tiktoken read them). Bytes that are not valid UTF-8 never match
// (PCRE2_MATCH_INVALID_UTF): they fall into the stretches between matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

class RegexSplitter {
 public:
  // An error names `source` and PCRE2's message with the offset in `pattern`.
  static Result<RegexSplitter> Compile(const std::string& pattern, const std::string& source);

  // Appends the pieces of `text` to `pieces` (views into `text`).
  // Thread-safe: each call has its own match state.
  void Split(std::string_view text, std::vector<std::string_view>& pieces) const;

  const std::string& pattern() const { return pattern_; }
  // PCRE2's version and Unicode version, e.g. "10.42 (Unicode 14.0.0)".
  static std::string EngineVersion();

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;  // immutable once compiled; shared by copies
};

}  // namespace pstar
