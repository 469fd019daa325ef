// Hugging Face GPT-2 export: a checkpoint's parameters, assembled from any
// number of rank files, as DIR/model.safetensors in GPT-2's names and layout
// (Conv1D weights stored (in, out); no lm_head, which is tied to wte) plus
// DIR/config.json (GPT2Config), as transformers GPT2LMHeadModel expects them.
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
};

// Exports checkpoint directory `step_dir` (root/step-...) into `output_dir`,
// creating it. DataLoss / NotFound name a damaged or missing checkpoint.
Result<HfExportSummary> ExportHuggingFaceGpt2(const std::string& step_dir, const std::string& output_dir);

// Whether our tensor `name` is one of GPT-2's Conv1D weights, which Hugging
// Face stores transposed: (in, out) where we store (out, in).
bool IsHfConv1DWeight(const std::string& name);

// GPT2Config for `config`, as JSON text.
std::string HfGpt2ConfigJson(const GptConfig& config);

}  // namespace pstar
