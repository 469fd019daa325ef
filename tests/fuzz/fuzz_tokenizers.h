// Small tokenizer.json files the fuzz targets build their tokenizers from:
// 256 byte tokens in GPT-2's byte-to-unicode names, four merges, and Llama
// 3's form (a Split pattern on PCRE2, added tokens, BOS from the
// post-processor), with NFC Qwen's.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/data/bpe_tokenizer.h"

namespace pstar::fuzz {

// The 256 bytes' names in GPT-2's byte-to-unicode form (printable bytes as
// themselves, the others as 256 + n), escaped for JSON.
inline std::string ByteVocab() {
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

inline pstar::BpeTokenizer Load(const std::string& json, const char* name) {
  auto t = pstar::BpeTokenizer::FromTokenizerJson(
      WriteInput(name, reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  if (!t.ok()) std::abort();
  return std::move(*t);
}

inline const std::string kMerges = ",\"merges\":[\"t h\",\"th e\",\"\xC4\xA0 t\",\"e e\"]}";

// Llama 3's form; with `nfc`, Qwen's. `added`: more added tokens (JSON
// objects, each after a comma), from id 263.
inline std::string SplitForm(bool nfc, const std::string& added = "") {
  return std::string("{\"added_tokens\":[{\"id\":260,\"content\":\"<|begin_of_text|>\",\"special\":true},"
                     "{\"id\":261,\"content\":\"<|eot_id|>\",\"special\":true},"
                     "{\"id\":262,\"content\":\"<think>\",\"special\":false}") + added + "]," +
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

}  // namespace pstar::fuzz
