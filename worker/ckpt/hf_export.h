// Hugging Face GPT-2 export: a checkpoint's parameters, assembled from any
// number of rank files, as DIR/model.safetensors in GPT-2's names and layout
// (Conv1D weights stored (in, out); no lm_head, which is tied to wte) plus
// DIR/config.json (GPT2Config) and DIR/generation_config.json, as
// transformers GPT2LMHeadModel and its generate() expect them.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"
#include "worker/model/gpt_config.h"

namespace pstar {

struct HfExportSummary {
  int64_t step = 0;
  int64_t parameters = 0;
  std::string model_path;   // DIR/model.safetensors
  std::string config_path;  // DIR/config.json
  std::string generation_config_path;  // DIR/generation_config.json
};

// Exports checkpoint directory `step_dir` (root/step-...) into `output_dir`,
// creating it. DataLoss / NotFound name a damaged or missing checkpoint.
Result<HfExportSummary> ExportHuggingFaceGpt2(const std::string& step_dir, const std::string& output_dir);

// Whether our tensor `name` is one of GPT-2's Conv1D weights, which Hugging
// Face stores transposed: (in, out) where we store (out, in).
bool IsHfConv1DWeight(const std::string& name);

// GPT2Config for `config`, as JSON text, with bos/eos ids in its vocabulary.
std::string HfGpt2ConfigJson(const GptConfig& config);
// generation_config.json: the same bos/eos ids, for generate().
std::string HfGenerationConfigJson(const GptConfig& config);
// The end-of-text (and beginning) id of an exported model: the last id of the
// vocabulary, which is GPT-2's <|endoftext|> in GPT-2's own vocabulary.
int64_t EndOfTextId(const GptConfig& config);

}  // namespace pstar
