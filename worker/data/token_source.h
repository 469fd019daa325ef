// TokenSource: a read-only sequence of token ids, from memory or from mapped
// token-shard files, validated against the model's vocabulary when opened.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // out[i] = token at pos + i, for i < n; pos + n <= size().
  virtual void Read(int64_t pos, int64_t n, int32_t* out) const = 0;
};

// Tokens held in memory (byte-level text, the generated corpus).
class VectorTokenSource final : public TokenSource {
 public:
  explicit VectorTokenSource(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return int64_t(tokens_.size()); }
  void Read(int64_t pos, int64_t n, int32_t* out) const override;

 private:
  std::vector<int32_t> tokens_;
};

// The shard files `path` names, in read order: a file; a glob (`*`, `?`,
// `[...]`; matches in name order); or a directory's *.bin files in name
// order, refused when it holds both llm.c-style training (`*_train_*`) and
// validation (`*_val_*`) shards, so validation data never leaks into training.
Result<std::vector<std::string>> ListTokenShards(const std::string& path);

// Opens the shards ListTokenShards(path) names, in pstar's or llm.c's format,
// as one sequence. Every token must be < vocab_size.
Result<std::unique_ptr<TokenSource>> OpenTokenShards(const std::string& path, int64_t vocab_size);

// The byte-level tokenizer: one token per byte, ids 0..255.
std::vector<int32_t> ByteTokenize(std::string_view text);
// Its reverse: each id's low byte.
std::string ByteDetokenize(std::span<const int32_t> ids);

// Reads `path` as raw bytes, one token per byte (ids 0..255).
Result<std::unique_ptr<TokenSource>> OpenByteText(const std::string& path, int64_t vocab_size);

}  // namespace pstar
