// Chat and instruction examples on arbitrary bytes: the JSONL reader refuses
// with a Status or gives examples, which every chat format renders with a
// counted flag for each id (an answer's end token at least counted), which
// pack into rows whose positions start each example at 0 and whose kept
// targets are the next id; and a marked encoding of the bytes is their
// plain encoding, its mark inside it. The first byte picks the row length.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_tokenizers.h"
#include "worker/data/chat_examples.h"
#include "worker/data/packed_rows.h"

namespace {

// Llama 3's form with every chat format's control tokens.
const pstar::BpeTokenizer& ChatTokenizer() {
  static const pstar::BpeTokenizer t = pstar::fuzz::Load(
      pstar::fuzz::SplitForm(false,
                             ",{\"id\":263,\"content\":\"<|start_header_id|>\",\"special\":true},"
                             "{\"id\":264,\"content\":\"<|end_header_id|>\",\"special\":true},"
                             "{\"id\":265,\"content\":\"<|end_of_text|>\",\"special\":true},"
                             "{\"id\":266,\"content\":\"<|im_start|>\",\"special\":true},"
                             "{\"id\":267,\"content\":\"<|im_end|>\",\"special\":true},"
                             "{\"id\":268,\"content\":\"</think>\",\"special\":false}"),
      "chat.json");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const pstar::BpeTokenizer& t = ChatTokenizer();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t mark = text.empty() ? 0 : data[0] % (text.size() + 1);
  std::vector<int32_t> marked;
  const size_t at = t.EncodeMarked(text, mark, marked);
  if (marked != t.Encode(text) || at > marked.size() || (mark < text.size() && at == marked.size())) std::abort();
  auto examples = pstar::ParseJsonlExamples(text, "fuzz.jsonl");
  if (!examples.ok()) return 0;
  std::vector<pstar::TokenizedExample> tokenized;
  for (const pstar::ChatExample& ex : *examples) {
    for (pstar::ChatFormat f : {pstar::ChatFormat::kNone, pstar::ChatFormat::kLlama3, pstar::ChatFormat::kLlama31,
                                pstar::ChatFormat::kChatml, pstar::ChatFormat::kQwen25, pstar::ChatFormat::kQwen3}) {
      auto e = pstar::TokenizeExample(ex, f, t);
      if (!e.ok()) {
        if (f != pstar::ChatFormat::kNone || ex.completion) std::abort();  // only messages under none are refused
        continue;
      }
      // Every format counts an answer's end token at least.
      if (e->ids.size() != e->counted.size() || std::count(e->counted.begin(), e->counted.end(), 1) == 0) {
        std::abort();
      }
      tokenized.push_back(std::move(*e));
    }
  }
  const int64_t seq = 1 + data[0] % 64;
  auto rows = pstar::PackedRows::Pack(tokenized, seq, pstar::OverlongPolicy::kTruncate, data[0], 0);
  if (!rows.ok()) std::abort();
  std::vector<int32_t> tokens(static_cast<size_t>(seq)), targets(tokens.size()), positions(tokens.size());
  for (int64_t r = 0; r < rows->rows(); ++r) {
    rows->Row(r, tokens.data(), targets.data(), positions.data());
    int64_t counted = 0;
    for (int64_t i = 0; i < seq; ++i) {
      if (positions[size_t(i)] < 0 || positions[size_t(i)] > i) std::abort();
      if (i > 0 && positions[size_t(i)] != 0 && positions[size_t(i)] != positions[size_t(i - 1)] + 1) std::abort();
      if (targets[size_t(i)] >= 0) {
        ++counted;
        if (i + 1 < seq && positions[size_t(i + 1)] != 0 && targets[size_t(i)] != tokens[size_t(i + 1)]) std::abort();
      }
    }
    if (counted != rows->Counted(r)) std::abort();
  }
  return 0;
}
