// The tokenizers on arbitrary bytes. The first byte picks the case: even,
// the input is text for small tokenizers made here (GPT-2's form; Llama 3's
// form, a Split pattern on PCRE2 with added tokens; the same with NFC), and
// the words must join back into it, Decode(Encode(text)) must equal it (its
// NFC form with NFC), with special tokens found or not; 5 modulo 8, the rest
// is a tiktoken rank file, refused with a Status or loaded, used on its own
// bytes (which must round-trip: a rank file is byte-level) and its
// tokenizer.json form read back; other odd, the rest is a Hugging Face
// tokenizer.json, refused with a Status or loaded and then used on its own
// bytes (which must round-trip where the tokenizer is lossless).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input_file.h"
#include "tests/fuzz/fuzz_tokenizers.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/gpt2_pretokenizer.h"
#include "worker/data/unicode_nfc.h"

namespace {

using pstar::fuzz::Load;
using pstar::fuzz::SplitForm;

const pstar::BpeTokenizer& Gpt2Form() {
  static const pstar::BpeTokenizer t = Load(
      "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":" +
          pstar::fuzz::ByteVocab() + ",\"<|endoftext|>\":260}" + pstar::fuzz::kMerges + "}",
      "gpt2.json");
  return t;
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
  if (data[0] % 8 == 5) {
    auto ranks = pstar::BpeTokenizer::FromTiktokenText(rest, "tokenizer.model");
    if (!ranks.ok()) return 0;
    for (bool special : {false, true}) {
      auto back = ranks->Decode(ranks->Encode(rest, special));
      if (!back.ok() || *back != rest) std::abort();
    }
    if (ranks->SavedText() != rest) std::abort();
    auto json = pstar::BpeTokenizer::FromTokenizerJsonText(ranks->ToTokenizerJson(), "tokenizer.json");
    if (!json.ok() || json->vocab_size() != ranks->vocab_size()) std::abort();
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
