#include "worker/data/generated_corpus.h"

#include "worker/core/counter_rng.h"

namespace pstar {

std::vector<int32_t> GenerateCorpus(int64_t vocab_size, int64_t num_tokens, uint64_t seed) {
  constexpr int kSuccessors = 4;
  constexpr double kCumulative[kSuccessors] = {0.5, 0.75, 0.9, 1.0};
  const uint64_t succ_stream = StableKey("corpus.successors");
  const uint64_t walk_stream = StableKey("corpus.walk");
  std::vector<int32_t> successors(size_t(vocab_size * kSuccessors));
  for (int64_t i = 0; i < vocab_size * kSuccessors; ++i) {
    successors[size_t(i)] = int32_t(CounterUniform(seed, succ_stream, uint64_t(i)) * double(vocab_size));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(num_tokens));
  int32_t current = 0;
  for (int64_t i = 0; i < num_tokens; ++i) {
    tokens[size_t(i)] = current;
    double u = CounterUniform(seed, walk_stream, uint64_t(i));
    int pick = 0;
    while (u >= kCumulative[pick]) ++pick;
    current = successors[size_t(current) * kSuccessors + size_t(pick)];
  }
  return tokens;
}

}  // namespace pstar
