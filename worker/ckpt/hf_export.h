// Hugging Face export: a checkpoint's parameters, from any number of rank
// files, as a model directory transformers, vLLM and llama.cpp's converters
// read: config.json (the architecture's own keys and torch_dtype),
// generation_config.json, the files of the directory the run imported
// (tokenizer.json, tokenizer_config.json with its chat template, ...: what
// the checkpoint carried), and the weights in one model.safetensors or, past
// the shard size, model-0000K-of-0000N.safetensors shards with
// model.safetensors.index.json, as save_pretrained writes them. The
// weights stream: each tensor is read by element range from the checkpoint
// and converted through one bounded buffer (CheckpointParamReader), so a
// model far larger than memory exports; every file is written under a
// temporary name, fsynced and renamed, and shards a previous export left
// that the new index does not name are removed.
//
// The Llama family's tensors keep pstar's (Hugging Face's) names. GPT-2's
// take the `transformer.` prefix, its Conv1D weights stored (in, out), no
// lm_head (tied); with GPT-2's tokenizer recorded, its files come too, as
// GPT2Tokenizer and GPT2TokenizerFast (AutoTokenizer) read them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/ckpt/safetensors.h"
#include "worker/core/status.h"
#include "worker/model/gpt_config.h"

namespace pstar {

struct HfExportOptions {
  // F32, BF16 or F16; none: GPT-2's F32, the Llama family's BF16 (what their
  // published checkpoints hold).
  std::optional<Dtype> dtype;
  // Most bytes of weights a shard holds (a larger tensor gets a shard of its
  // own): transformers' default "5GB".
  int64_t max_shard_bytes = 5000000000;
};

// The bytes ExportHuggingFace holds beyond its index, at most: the writer's
// staging block and the floats it is converted from.
int64_t HfExportBufferBytes();

struct HfExportSummary {
  int64_t step = 0;
  int64_t parameters = 0;
  Dtype dtype = Dtype::kF32;
  std::vector<std::string> weight_paths;  // DIR/model.safetensors, or the shards in order
  std::string index_path;                 // DIR/model.safetensors.index.json; empty for one file
  std::string config_path;                // DIR/config.json
  std::string generation_config_path;     // DIR/generation_config.json
  // With GPT-2's tokenizer recorded: tokenizer.json, vocab.json, merges.txt
  // and tokenizer_config.json in DIR; empty otherwise.
  std::vector<std::string> tokenizer_paths;
  // The imported directory's files the checkpoint carried (the tokenizer's,
  // its chat template), copied as they were.
  std::vector<std::string> carried_paths;
};

// Exports checkpoint directory `step_dir` (root/step-...) into `output_dir`,
// creating it. DataLoss / NotFound name a damaged or missing checkpoint;
// InvalidArgument a dtype or shard size that cannot be written.
Result<HfExportSummary> ExportHuggingFace(const std::string& step_dir, const std::string& output_dir,
                                          const HfExportOptions& options = {});

// Whether our tensor `name` is one of GPT-2's Conv1D weights, which Hugging
// Face stores transposed: (in, out) where we store (out, in).
bool IsHfConv1DWeight(const std::string& name);

// GPT2Config for `config`, as JSON text, with bos/eos id `eot` (-1:
// EndOfTextId).
std::string HfGpt2ConfigJson(const GptConfig& config, int64_t eot = -1);
// LlamaConfig, Qwen2Config or MistralConfig for `config`, as JSON text, its
// weights in `dtype`.
std::string HfLlamaFamilyConfigJson(const GptConfig& config, Dtype dtype);
// generation_config.json: the same bos/eos ids, for generate().
std::string HfGenerationConfigJson(const GptConfig& config, int64_t eot = -1);
// The end-of-text (and beginning) id of an exported model without a recorded
// tokenizer: the last id of the vocabulary, which is GPT-2's <|endoftext|> in
// GPT-2's own vocabulary (with one, the tokenizer's).
int64_t EndOfTextId(const GptConfig& config);

}  // namespace pstar
