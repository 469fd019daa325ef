// The small GPT job the training tests share: a two-layer model that trains in
// milliseconds, and random token data.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/data/token_source.h"
#include "worker/model/param_store.h"

namespace pstar::test {

inline constexpr const char* kTinyGptJob =
    "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, max_seq_len: 12}\n"
    "optimizer: {type: AdamW, params: {lr: 0.01, weight_decay: 0.1}}\n"
    "train: {batch_size: 4, seq_len: 8, steps: 4, warmup_steps: 1, grad_clip: 1.0}\n";

inline Config ParseTinyJob(const char* yaml, const std::vector<std::string>& overrides) {
  auto c = ParseConfig(yaml, "test", overrides);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

inline Config TinyGptConfig(const std::vector<std::string>& overrides) { return ParseTinyJob(kTinyGptJob, overrides); }

// The same job with the Llama family's decoder: grouped-query attention (2
// query heads per kv head), RoPE with Llama 3's scaling, SwiGLU, RMSNorm and
// an untied classifier; its vocabulary (192 rows padded) is larger than a
// block's tensors, so the token table and the classifier are in row parts
// (3 of 64 rows, the last with the padding).
inline constexpr const char* kTinyLlamaJob =
    "model: {architecture: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 16, head_dim: 8, "
    "intermediate_size: 24, vocab_size: 150, max_seq_len: 12, tie_word_embeddings: false, "
    "rope_scaling: {type: llama3, factor: 4, low_freq_factor: 1, high_freq_factor: 4, "
    "original_max_position_embeddings: 8}}\n"
    "optimizer: {type: AdamW, params: {lr: 0.01, weight_decay: 0.1}}\n"
    "train: {batch_size: 4, seq_len: 8, steps: 4, warmup_steps: 1, grad_clip: 1.0}\n";

inline Config TinyLlamaConfig(const std::vector<std::string>& overrides) {
  return ParseTinyJob(kTinyLlamaJob, overrides);
}

// The tiny job of either decoder, for the invariants every architecture
// keeps (parameterized tests run each on both).
using TinyJob = Config (*)(const std::vector<std::string>& overrides);
struct TinyFamily {
  const char* name;
  TinyJob job;
  // Overrides under which the classifier runs in row blocks (ClassifierRows):
  // blocks wider than the vocabulary's share of the step.
  std::vector<std::string> classifier_blocks;
};
inline std::vector<TinyFamily> TinyFamilies() {
  return {{"gpt2", TinyGptConfig, {"model.n_embd=64", "model.n_head=4"}},
          {"llama", TinyLlamaConfig, {"model.n_layer=12", "model.intermediate_size=64"}}};
}
inline std::string TinyFamilyName(const testing::TestParamInfo<TinyFamily>& info) { return info.param.name; }
// The fixture of a suite run on each decoder: Job() is the family's tiny job.
class TinyFamilyTest : public testing::TestWithParam<TinyFamily> {
 protected:
  Config Job(const std::vector<std::string>& overrides) const { return GetParam().job(overrides); }
  // n random tokens over the family's vocabulary (every row part's tokens).
  VectorTokenSource Tokens(int64_t n, uint64_t seed) const;
};

inline VectorTokenSource RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return VectorTokenSource(std::move(t));
}

inline VectorTokenSource TinyFamilyTest::Tokens(int64_t n, uint64_t seed) const {
  return RandomTokens(n, Job({}).model.gpt.vocab_size, seed);
}

// A copy of every tensor of `kind` (one rank), in tensor order.
inline std::vector<std::vector<float>> TensorCopies(ParamStore& store, StateKind kind) {
  std::vector<std::vector<float>> out;
  for (TensorId id = 0; id < store.layout().num_tensors(); ++id) {
    const float* p = store.Peek(kind, id);  // read in place, or copied to the host (a GPU's)
    out.emplace_back(p, p + store.layout().spec(id).numel());
  }
  return out;
}

}  // namespace pstar::test
