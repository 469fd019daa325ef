// The built-in corpus: a seeded Markov chain in which every token has four
// possible successors (probabilities 1/2, 1/4, 3/20, 1/10). It needs no
// download, is identical on every machine, and has a known floor: the best
// possible loss is the chain's entropy, about 1.208 nats per token.
#pragma once

#include <cstdint>
#include <vector>

namespace pstar {

inline constexpr double kGeneratedCorpusEntropy = 1.2080;  // nats per token

std::vector<int32_t> GenerateCorpus(int64_t vocab_size, int64_t num_tokens, uint64_t seed);

}  // namespace pstar
