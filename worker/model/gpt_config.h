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

// The rows of a micro-batch's `tokens` the classifier (logits, loss and
// their gradients) runs over at once. All of them where the GEMM that row
// blocks would recompute is at least 2% of a step's FLOPs (2 T C Vp against
// 6 T (12 L C^2 + C Vp): 47 Vp >= 36 L C, small and mid-size models such as
// GPT-2 up to 774M): the logits of the whole micro-batch are kept from
// forward to backward, the loss and dlogits are one pass, and backward is
// two GEMMs (dwte one GEMM over every row). Otherwise blocks of 1/16 (large
// models, whose activations are what limits them and whose classifier is a
// small part of the step): forward computes each block's loss, backward its
// logits again. A function of the shapes alone, so any device budget and
// activation checkpointing give the same bits.
int64_t ClassifierRows(const GptConfig& config, int64_t tokens);
// Whether ClassifierRows keeps the whole micro-batch's logits (and so the
// dlogits, from which backward takes dwte at its end, Gpt::Backward).
inline bool ClassifierKeepsLogits(const GptConfig& config, int64_t tokens) {
  return ClassifierRows(config, tokens) >= tokens;
}

struct GptPreset {
  std::string_view name;
  GptConfig config;
};

// Named shapes from tiny test models to GPT-3 175B.
const std::vector<GptPreset>& GptPresets();
std::optional<GptConfig> FindGptPreset(std::string_view name);

}  // namespace pstar
