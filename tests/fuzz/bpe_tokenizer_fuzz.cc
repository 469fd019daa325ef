// The GPT-2 tokenizer on arbitrary bytes. The first byte picks the case:
// even, the input is text for a small byte-level BPE vocabulary, and its
// words must join back into it and Decode(Encode(text)) must equal it; odd,
// the rest is a Hugging Face tokenizer.json, refused with a Status or loaded
// and then used on its own bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace {

// A vocabulary of the 256 bytes (written as themselves where printable,
// else as 256 + n, GPT-2's byte-to-unicode form), a few merges and
// <|endoftext|>, in tokenizer.json form.
const pstar::BpeTokenizer& SmallTokenizer() {
  static const pstar::BpeTokenizer tokenizer = [] {
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    std::string names[256];
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const int code = printable(b) ? b : next++;
      std::string s;
      if (code < 0x80) s.push_back(char(code));
      else s += {char(0xC0 | (code >> 6)), char(0x80 | (code & 0x3F))};
      names[b] = (s == "\"" || s == "\\") ? "\\" + s : s;
    }
    std::string vocab = "{";
    for (int b = 0; b < 256; ++b) vocab += (b ? ",\"" : "\"") + names[b] + "\":" + std::to_string(b);
    // Merges: "t h", "th e", "\u0120 t" (" t"), "e e".
    vocab += ",\"th\":256,\"the\":257,\"\xC4\xA0t\":258,\"ee\":259,\"<|endoftext|>\":260}";
    const std::string json =
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":" + vocab +
        ",\"merges\":[\"t h\",\"th e\",\"\xC4\xA0 t\",\"e e\"]}}";
    auto t = pstar::BpeTokenizer::FromTokenizerJson(
        pstar::fuzz::WriteInput("small.json", reinterpret_cast<const uint8_t*>(json.data()), json.size()));
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    std::string joined;
    for (std::string_view w : pstar::Gpt2Words(rest)) {
      if (w.empty()) std::abort();
      joined += w;
    }
    if (joined != rest) std::abort();
    auto back = SmallTokenizer().Decode(SmallTokenizer().Encode(rest));
    if (!back.ok() || *back != rest) std::abort();
    return 0;
  }
  auto t = pstar::BpeTokenizer::FromTokenizerJson(pstar::fuzz::WriteInput("tokenizer.json", data + 1, size - 1));
  if (t.ok()) {
    auto back = t->Decode(t->Encode(rest));
    if (!back.ok() || *back != rest) std::abort();
  }
  return 0;
}
