// Hugging Face import (model.init_from): a model directory's weights
// (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, GPT2LMHeadModel;
// one model.safetensors or the shards of model.safetensors.index.json; BF16,
// F16 or F32) into the run's parameters. Streamed: each rank reads only the
// element ranges it owns, F32 straight into its shards and 16-bit types
// through one bounded staging buffer, so no process holds the model's file
// data, and any world size and chunk layout work.
//
// The family's tensors carry pstar's own names. GPT-2's come with the
// `transformer.` prefix (as transformers and `pstar export` write) or
// without it (the published GPT-2 weights); its Conv1D weights are stored
// (in, out) there and transposed here, and its attention mask buffers
// (`attn.bias`, `attn.masked_bias`) are ignored. So are the family's
// `rotary_emb.inv_freq` buffers (computed from config.json) and, for a tied
// model, an `lm_head.weight` equal to the token embedding.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"
#include "worker/model/gpt_config.h"
#include "worker/model/param_store.h"

namespace pstar {

struct HfImportOptions {
  // 16-bit elements staged at once: the import's bounded buffer is twice
  // this many bytes (plus as many floats again for a tied lm_head's check).
  int64_t staging_elements = int64_t(4) << 20;
};

// The bytes ImportHuggingFace holds beyond the store's own memory, at most.
int64_t HfImportBufferBytes(const HfImportOptions& options = {});

// Fills `store`'s params from `dir` for a model described by `config` (as
// ReadHfConfig reads it: another description is InvalidArgument). A
// missing, unknown or misshapen tensor, or a damaged file, is an error naming
// the file and the tensor.
Status ImportHuggingFace(const std::string& dir, const GptConfig& config, ParamStore& store,
                         const HfImportOptions& options = {});

}  // namespace pstar
