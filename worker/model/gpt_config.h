// GPT-2 family shapes: learned positions, pre-LN blocks, GELU MLP (4x), tied
// input/output embeddings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pstar {

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;  // rows of the position embedding
  // The token embedding (and the classifier's GEMM) has vocab_size rounded up
  // to a multiple of this many rows, so the GEMMs run on aligned shapes; the
  // padding rows stay zero and users never see them. 1 pads nothing.
  int64_t vocab_multiple = 64;

  int64_t head_size() const { return n_embd / n_head; }
  int64_t padded_vocab_size() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  // Parameters, counting the tied embedding once.
  int64_t NumParameters() const;
  // The same count in floating point: it cannot overflow, whatever the sizes
  // (for checking sizes before anything is counted exactly).
  double NumParametersApprox() const;
};

// The classifier (logits, loss and their gradients) runs over blocks of this
// many of a micro-batch's `tokens` rows: at most 16 blocks, so the logits
// buffer holds 1/16 of the (tokens, padded vocab) matrix. Forward computes
// each block's loss; backward recomputes its logits (one more GEMM, about a
// third of the classifier's FLOPs) instead of keeping them all.
inline int64_t ClassifierBlockRows(int64_t tokens) { return (tokens + 15) / 16; }

struct GptPreset {
  std::string_view name;
  GptConfig config;
};

// Named shapes from tiny test models to GPT-3 175B.
const std::vector<GptPreset>& GptPresets();
std::optional<GptConfig> FindGptPreset(std::string_view name);

}  // namespace pstar
