#include "worker/model/gpt_config.h"

namespace pstar {

int64_t GptConfig::NumParameters() const {
  const int64_t C = n_embd;
  int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                      (4 * C * C + C);
  return vocab_size * C + max_seq_len * C + n_layer * per_layer + 2 * C;
}

double GptConfig::NumParametersApprox() const {
  const double C = double(n_embd);
  return double(vocab_size + max_seq_len) * C + double(n_layer) * (12 * C * C + 13 * C) + 2 * C;
}

const std::vector<GptPreset>& GptPresets() {
  // {n_layer, n_head, n_embd, vocab_size, max_seq_len}
  static const std::vector<GptPreset> kPresets = {
      {"tiny", {4, 4, 128, 512, 256}},
      {"gpt2-124m", {12, 12, 768, 50257, 1024}},
      {"gpt2-350m", {24, 16, 1024, 50257, 1024}},
      {"gpt2-774m", {36, 20, 1280, 50257, 1024}},
      {"gpt2-1.5b", {48, 25, 1600, 50257, 1024}},
      // Hidden-4096 shapes in the style of PatrickStar's scaling runs.
      {"gpt3-4b", {20, 32, 4096, 50257, 1024}},
      {"gpt3-6.7b", {32, 32, 4096, 50257, 2048}},
      {"gpt3-10b", {50, 32, 4096, 50257, 1024}},
      {"gpt3-13b", {40, 40, 5120, 50257, 2048}},
      {"gpt3-20b", {100, 32, 4096, 50257, 1024}},
      {"gpt3-175b", {96, 96, 12288, 50257, 2048}},
  };
  return kPresets;
}

std::optional<GptConfig> FindGptPreset(std::string_view name) {
  for (const auto& p : GptPresets()) {
    if (p.name == name) return p.config;
  }
  return std::nullopt;
}

int64_t ClassifierRows(const GptConfig& config, int64_t tokens) {
  const double L = double(config.n_layer), C = double(config.n_embd), Vp = double(config.padded_vocab_size());
  if (47.0 * Vp >= 36.0 * L * C) return tokens;
  return (tokens + 15) / 16;
}

}  // namespace pstar
