#include "worker/data/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace pstar {

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string Pcre2Message(int error) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error, buffer, sizeof buffer);
  return n < 0 ? "PCRE2 error " + std::to_string(error) : std::string(reinterpret_cast<const char*>(buffer));
}

// One match's data and, for the JIT, a stack larger than PCRE2's 32 KiB
// default (long runs of one class recurse deeply in lookaheads).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  explicit MatchState(const pcre2_code* code, bool jit) {
    data = pcre2_match_data_create_from_pattern(code, nullptr);
    if (jit) {
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

}  // namespace

Result<RegexSplitter> RegexSplitter::Compile(const std::string& pattern, const std::string& source) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code->code == nullptr) {
    return Status::InvalidArgument(source + ": the pattern does not compile at offset " + std::to_string(offset) +
                                   ": " + Pcre2Message(error));
  }
  // Without the JIT (a platform PCRE2 lacks it for) the interpreter gives
  // the same matches, slower.
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  RegexSplitter s;
  s.pattern_ = pattern;
  s.code_ = std::move(code);
  return s;
}

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>& pieces) const {
  MatchState state(code_->code, code_->jit);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap = 0;  // the next match starts at or after pos; text[gap, match) is unmatched
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, 0, state.data, state.context);
    if (rc < 0) break;  // no match (or a resource limit): the rest is one stretch
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ov[0], end = ov[1];
    if (begin > gap) pieces.push_back(text.substr(gap, begin - gap));
    if (end > begin) {
      pieces.push_back(text.substr(begin, end - begin));
      pos = gap = end;
    } else {
      // An empty match: step one character on (PCRE2 keeps to characters in
      // UTF mode; an invalid byte is one step).
      gap = begin;
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
}

std::string RegexSplitter::EngineVersion() {
  char version[64] = {}, unicode[64] = {};
  pcre2_config(PCRE2_CONFIG_VERSION, version);
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, unicode);
  return std::string(version) + " (Unicode " + unicode + ")";
}

}  // namespace pstar
