// Sampler: text generation from a trained GPT on the CPU, one token at a
// time. Each new token runs the model over the whole context (no key/value
// cache: sampling is for looking at what a model learned, not for serving);
// the model is built for the smallest power-of-two length that holds the
// context, so short prompts stay cheap, and causal attention makes the
// positions past the context irrelevant.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "worker/core/arena.h"
#include "worker/core/status.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_config.h"
#include "worker/model/param_store.h"

namespace pstar {

struct SampleOptions {
  int64_t tokens = 64;       // new tokens at most
  double temperature = 1.0;  // 0: greedy (the most likely token; the lowest id among equals)
  int64_t top_k = 0;         // keep the k most likely before sampling; 0: all
  uint64_t seed = 0;         // the same seed, model and prompt give the same tokens
  int32_t stop_token = -1;   // ends generation when produced (not returned); -1: none
  int64_t vocab_limit = 0;   // only ids below this are produced (the tokenizer's size); 0: the model's
};

// The next token from `logits` (the first `vocab` of them matter), as
// `options` say: the argmax at temperature 0 (lowest id among equals), else a
// draw from the softmax of the top_k most likely at that temperature, from
// 53 bits of `rng`.
int32_t PickToken(const float* logits, int64_t vocab, const SampleOptions& options, std::mt19937_64& rng);

class Sampler {
 public:
  // `params` holds every tensor of GptVisibleTensorSpecs(config), in order,
  // in the shapes users see (no vocabulary padding).
  static Result<std::unique_ptr<Sampler>> Create(const GptConfig& config,
                                                 const std::vector<std::vector<float>>& params);

  // The tokens that follow `prompt` (not empty; only its last max_seq_len
  // tokens are seen, and the window slides as tokens are added).
  Result<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt, const SampleOptions& options);

  // The logits (vocab_size floats) the model gives for the token after
  // `context` (1..max_seq_len tokens).
  Result<std::vector<float>> NextLogits(const std::vector<int32_t>& context);

 private:
  Sampler(const GptConfig& config, std::unique_ptr<ParamStore> store) : config_(config), store_(std::move(store)) {}
  // Builds the model for `length` positions if the current one is shorter.
  Status EnsureLength(int64_t length);

  GptConfig config_;
  std::unique_ptr<ParamStore> store_;
  int64_t length_ = 0;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Gpt> model_;
};

}  // namespace pstar
