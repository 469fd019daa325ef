// The decoder's description: GPT-2 and the Llama family (Llama 3.x, Qwen2,
// Mistral) are one pre-norm decoder that differs in its norm, its positions,
// its MLP, its attention heads, its linear biases and whether the classifier
// is the token embedding. The model, the planner and the checkpoints follow
// this description, never the architecture's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/rope.h"

namespace pstar {

// Whose decoder this is: its Hugging Face model class, and so its tensor
// names and the kinds below.
enum class Architecture { kGpt2, kLlama, kQwen2, kMistral };
const char* ArchitectureName(Architecture a);  // "gpt2", "llama", "qwen2", "mistral"

enum class NormKind { kLayerNorm, kRmsNorm };       // LayerNorm with biases, or RMSNorm without
enum class PositionKind { kLearned, kRotary };      // a learned table added to the tokens, or RoPE on q and k
enum class MlpKind { kGelu, kSwiGlu };              // fc -> GELU -> proj, or down(silu(gate) * up)
enum class LinearBias { kAll, kQkv, kNone };        // biases on every linear layer, on q/k/v only, or none
const char* NormKindName(NormKind k);               // "layernorm", "rmsnorm"
const char* PositionKindName(PositionKind k);       // "learned", "rope"
const char* MlpKindName(MlpKind k);                 // "gelu", "swiglu"
const char* LinearBiasName(LinearBias b);           // "all", "qkv", "none"

struct GptConfig {
  // The shape (the first five fields keep GPT-2's aggregate order).
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;  // learned positions: rows of their table; rotary: the longest sequence
  // The token embedding (and the classifier's GEMM) has vocab_size rounded up
  // to a multiple of this many rows, so the GEMMs run on aligned shapes; the
  // padding rows stay zero and users never see them. 1 pads nothing.
  int64_t vocab_multiple = 64;
  // 0 in the three below means GPT-2's value: n_head key/value heads
  // (multi-head attention), n_embd / n_head columns per head, 4 n_embd MLP
  // columns.
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;

  // The description; the defaults are GPT-2's.
  Architecture architecture = Architecture::kGpt2;
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  PositionKind positions = PositionKind::kLearned;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;  // Llama 3's frequency scaling, or none
  MlpKind mlp = MlpKind::kGelu;
  LinearBias linear_bias = LinearBias::kAll;
  bool tied_embeddings = true;  // the classifier is the token embedding (else lm_head.weight)

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t mlp_size() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // Columns of the attention's output (query heads times head size) and of
  // one position's q|k|v.
  int64_t attn_width() const { return n_head * head_size(); }
  int64_t qkv_width() const { return (n_head + 2 * kv_heads()) * head_size(); }
  // Columns of the MLP's first GEMM: fc, or gate|up.
  int64_t mlp_in_width() const { return mlp == MlpKind::kSwiGlu ? 2 * mlp_size() : mlp_size(); }
  bool qkv_bias() const { return linear_bias != LinearBias::kNone; }
  bool other_bias() const { return linear_bias == LinearBias::kAll; }
  int64_t padded_vocab_size() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  // Parameters, counting a tied embedding once.
  int64_t NumParameters() const;
  // The same count in floating point: it cannot overflow, whatever the sizes
  // (for checking sizes before anything is counted exactly).
  double NumParametersApprox() const;
};

// The description an architecture has (its kinds, and its Hugging Face
// config's defaults for the rest), with no shape.
GptConfig ArchitectureDefaults(Architecture a);

// The first rule a description breaks, as the field (its key under model.)
// and why ("n_kv_head", "3 does not divide n_head 8"); none when it holds
// together: its kinds are its architecture's, its heads divide, RoPE has
// pairs to rotate. Sizes' bounds are the config's (worker/config).
struct DescriptionProblem {
  std::string field, why;
};
std::optional<DescriptionProblem> CheckDescription(const GptConfig& g);
// Whether two descriptions give the same model (shape and math).
bool SameDescription(const GptConfig& a, const GptConfig& b);

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
// dlogits, from which backward takes the classifier's weight gradient at its
// end, Gpt::Backward).
inline bool ClassifierKeepsLogits(const GptConfig& config, int64_t tokens) {
  return ClassifierRows(config, tokens) >= tokens;
}

struct GptPreset {
  std::string_view name;
  GptConfig config;
};

// Named shapes: tiny test models, GPT-2 to GPT-3 175B, and the published
// Llama 3.x, Qwen2.5 and Mistral shapes.
const std::vector<GptPreset>& GptPresets();
std::optional<GptConfig> FindGptPreset(std::string_view name);

}  // namespace pstar
