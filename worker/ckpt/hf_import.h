// Hugging Face GPT-2 import (model.init_from): DIR/model.safetensors and
// DIR/config.json, as transformers saves GPT2LMHeadModel, into the run's
// parameters. Each rank fills only the slices it owns, so any world size
// works, and the chunk layout does not matter.
//
// Both naming variants occur in real files: with the `transformer.` prefix
// (as transformers and `pstar export` write) and without it (`h.0.attn.
// c_attn.weight`, `wte.weight`: the published GPT-2 weights). The attention
// mask buffers (`attn.bias`, `attn.masked_bias`) are ignored, as is a
// `lm_head.weight` equal to wte (the head is tied). Conv1D weights are
// stored (in, out) there and transposed here. F32, F16 and BF16 are read.
#pragma once

#include <string>

#include "worker/core/status.h"
#include "worker/model/gpt_config.h"
#include "worker/model/param_store.h"

namespace pstar {

// Fills `store`'s params from `dir` for a model of shape `config`: a shape in
// config.json or the safetensors that differs from it, a missing tensor or
// an unknown one is InvalidArgument naming it.
Status ImportHuggingFaceGpt2(const std::string& dir, const GptConfig& config, ParamStore& store);

}  // namespace pstar
