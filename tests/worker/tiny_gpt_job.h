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

inline Config TinyGptConfig(const std::vector<std::string>& overrides) {
  auto c = ParseConfig(kTinyGptJob, "test", overrides);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

inline VectorTokenSource RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return VectorTokenSource(std::move(t));
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
