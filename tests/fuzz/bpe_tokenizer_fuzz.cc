// The tokenizers on arbitrary bytes. The first byte picks the case: even,
// the input is text for small tokenizers made here (GPT-2's form; Llama 3's
// form, a Split pattern on PCRE2 with added tokens; the same with NFC), and
// the words must join back into it, Decode(Encode(text)) must equal it (its
// NFC form with NFC), with special tokens found or not; odd, the rest is a
// Hugging Face tokenizer.json, refused with a Status or loaded and then used
// on its own bytes (which must round-trip where the tokenizer is lossless).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/gpt2_pretokenizer.h"
#include "worker/data/unicode_nfc.h"

namespace {

// The 256 bytes' names in GPT-2's byte-to-unicode form (printable bytes as
// themselves, the others as 256 + n), escaped for JSON.
std::string ByteVocab() {
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  std::string vocab = "{";
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const int code = printable(b) ? b : next++;
    std::string s;
    if (code < 0x80) s.push_back(char(code));
    else s += {char(0xC0 | (code >> 6)), char(0x80 | (code & 0x3F))};
    if (s == "\"" || s == "\\") s = "\\" + s;
    vocab += (b ? ",\"" : "\"") + s + "\":" + std::to_string(b);
  }
  // Merges: "t h", "th e", "\u0120 t" (" t"), "e e".
  return vocab + ",\"th\":256,\"the\":257,\"\xC4\xA0t\":258,\"ee\":259";
}

pstar::BpeTokenizer Load(const std::string& json, const char* name) {
  auto t = pstar::BpeTokenizer::FromTokenizerJson(
      pstar::fuzz::WriteInput(name, reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  if (!t.ok()) std::abort();
  return std::move(*t);
}

const std::string kMerges = ",\"merges\":[\"t h\",\"th e\",\"\xC4\xA0 t\",\"e e\"]}";

const pstar::BpeTokenizer& Gpt2Form() {
  static const pstar::BpeTokenizer t = Load(
      "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":" + ByteVocab() +
          ",\"<|endoftext|>\":260}" + kMerges + "}",
      "gpt2.json");
  return t;
}

// Llama 3's form; with `nfc`, Qwen's.
std::string SplitForm(bool nfc) {
  return std::string("{\"added_tokens\":[{\"id\":260,\"content\":\"<|begin_of_text|>\",\"special\":true},"
                     "{\"id\":261,\"content\":\"<|eot_id|>\",\"special\":true},"
                     "{\"id\":262,\"content\":\"<think>\",\"special\":false}],") +
         (nfc ? "\"normalizer\":{\"type\":\"NFC\"}," : "") +
         "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
         "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
         "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"use_regex\":false}]},"
         "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\"}},"
         "{\"Sequence\":{\"id\":\"A\"}}]},\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":" +
         ByteVocab() + "}" + kMerges + "}";
}

const pstar::BpeTokenizer& Llama3Form() {
  static const pstar::BpeTokenizer t = Load(SplitForm(false), "llama3.json");
  return t;
}

const pstar::BpeTokenizer& QwenForm() {
  static const pstar::BpeTokenizer t = Load(SplitForm(true), "qwen.json");
  return t;
}

void CheckRoundTrip(const pstar::BpeTokenizer& t, const std::string& text, const std::string& want) {
  for (bool special : {false, true}) {
    auto back = t.Decode(t.Encode(text, special));
    if (!back.ok() || *back != want) std::abort();
  }
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
    CheckRoundTrip(Gpt2Form(), rest, rest);
    CheckRoundTrip(Llama3Form(), rest, rest);
    CheckRoundTrip(QwenForm(), rest, pstar::NfcNormalize(rest));
    return 0;
  }
  auto t = pstar::BpeTokenizer::FromTokenizerJson(pstar::fuzz::WriteInput("tokenizer.json", data + 1, size - 1));
  if (t.ok()) {
    for (bool special : {false, true}) {
      auto back = t->Decode(t->Encode(rest, special));
      if (!back.ok() || (t->lossless() && *back != rest)) std::abort();
    }
  }
  return 0;
}
