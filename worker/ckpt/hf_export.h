// Hugging Face GPT-2 export: a checkpoint's parameters, assembled from any
// number of rank files, as DIR/model.safetensors in GPT-2's names and layout
// (Conv1D weights stored (in, out); no lm_head, which is tied to wte) plus
// DIR/config.json (GPT2Config) and DIR/generation_config.json, as
// transformers GPT2LMHeadModel and its generate() expect them; and when the
// run recorded GPT-2's tokenizer, its files, as GPT2Tokenizer and
// GPT2TokenizerFast (AutoTokenizer) read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/core/status.h"
#include "worker/model/gpt_config.h"

namespace pstar {

struct HfExportSummary {
  int64_t step = 0;
  int64_t parameters = 0;
  std::string model_path;   // DIR/model.safetensors
  std::string config_path;  // DIR/config.json
  std::string generation_config_path;  // DIR/generation_config.json
  // With GPT-2's tokenizer recorded: tokenizer.json, vocab.json, merges.txt
  // and tokenizer_config.json in DIR; empty otherwise.
  std::vector<std::string> tokenizer_paths;
};

// Exports checkpoint directory `step_dir` (root/step-...) into `output_dir`,
// creating it. DataLoss / NotFound name a damaged or missing checkpoint.
Result<HfExportSummary> ExportHuggingFaceGpt2(const std::string& step_dir, const std::string& output_dir);

// Whether our tensor `name` is one of GPT-2's Conv1D weights, which Hugging
// Face stores transposed: (in, out) where we store (out, in).
bool IsHfConv1DWeight(const std::string& name);

// GPT2Config for `config`, as JSON text, with bos/eos id `eot` (-1:
// EndOfTextId).
std::string HfGpt2ConfigJson(const GptConfig& config, int64_t eot = -1);
// generation_config.json: the same bos/eos ids, for generate().
std::string HfGenerationConfigJson(const GptConfig& config, int64_t eot = -1);
// The end-of-text (and beginning) id of an exported model without a recorded
// tokenizer: the last id of the vocabulary, which is GPT-2's <|endoftext|> in
// GPT-2's own vocabulary (with one, the tokenizer's).
int64_t EndOfTextId(const GptConfig& config);

}  // namespace pstar
