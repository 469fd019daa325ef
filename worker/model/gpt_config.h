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

  int64_t head_size() const { return n_embd / n_head; }
  // Parameters, counting the tied embedding once.
  int64_t NumParameters() const;
};

struct GptPreset {
  std::string_view name;
  GptConfig config;
};

// Named shapes from tiny test models to GPT-3 175B.
const std::vector<GptPreset>& GptPresets();
std::optional<GptConfig> FindGptPreset(std::string_view name);

}  // namespace pstar
