// A Hugging Face model directory's config.json as pstar's decoder
// description: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM and
// GPT2LMHeadModel, with the keys each architecture's config class reads and
// its defaults where a key is absent. What pstar's decoder cannot compute
// the same way (another rope_scaling type, biases or an activation the
// architecture does not have, GPT-2's per-layer attention scaling) is
// refused in one line naming the file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/ckpt/checkpoint.h"
#include "worker/core/status.h"
#include "worker/model/gpt_config.h"

namespace pstar {

// The most bytes pstar reads of a directory's JSON files (config.json, the
// index): a 70B model's index is some 60 KB.
inline constexpr int64_t kMaxHfJsonBytes = int64_t(64) << 20;

struct HfModelConfig {
  std::string path;  // DIR/config.json
  GptConfig model;   // the description and shape (vocab_multiple is pstar's default)
  // The attention window in force on some layer (Mistral's sliding_window;
  // Qwen2's only with use_sliding_window and a layer at or past
  // max_window_layers); 0: none. pstar's attention sees the whole sequence,
  // so a run's sequence must fit in it (worker/config checks).
  int64_t sliding_window = 0;
};

// The files of `dir` that travel with the run's checkpoints into its exports
// (CarriedModelFileNames: config.json, generation_config.json, the
// tokenizer's), those present, read whole (each at most kMaxHfFileBytes).
inline constexpr int64_t kMaxHfFileBytes = int64_t(64) << 20;
Result<std::vector<NamedFile>> ReadHfCarriedFiles(const std::string& dir);

// Reads DIR/config.json. NotFound names a missing file; InvalidArgument names
// the file and the key that pstar cannot take.
Result<HfModelConfig> ReadHfConfig(const std::string& dir);
// The same for config.json's text, `path` naming it in errors.
Result<HfModelConfig> ParseHfConfig(std::string_view text, const std::string& path);

}  // namespace pstar
