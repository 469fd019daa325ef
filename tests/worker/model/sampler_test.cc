// The sampler against float64 PyTorch (greedy decoding and the logits it
// decides on), and its determinism.
#include "worker/model/sampler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/counter_rng.h"

namespace pstar {
namespace {

GptConfig SmallConfig() {
  GptConfig g;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 16;
  g.vocab_size = 70;  // padded to 128 inside
  g.max_seq_len = 12;
  return g;
}

// Weights far from the default init, so the logits spread and argmaxes are clear.
std::vector<std::vector<float>> RandomParams(const GptConfig& g, uint64_t seed) {
  std::vector<std::vector<float>> params;
  for (const TensorSpec& s : GptVisibleTensorSpecs(g)) {
    std::vector<float> p(size_t(s.numel()));
    FillNormal(p.data(), s.numel(), 0.5f, seed, StableKey(s.name), 0);
    if (s.role == TensorRole::kNormWeight) {
      for (float& x : p) x += 1.0f;
    }
    params.push_back(std::move(p));
  }
  return params;
}

TEST(Sampler, GreedyEqualsFloat64PyTorch) {
  const GptConfig g = SmallConfig();
  const uint64_t seed = test::RunSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  const auto params = RandomParams(g, seed);
  auto sampler = Sampler::Create(g, params);
  ASSERT_TRUE(sampler.ok()) << sampler.status().message();
  // A prompt of 5, and 12 new tokens: the window slides past max_seq_len.
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> prompt(5);
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(g.vocab_size));
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.tokens = 12;
  auto ours = (*sampler)->Generate(prompt, greedy);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  auto first = (*sampler)->NextLogits(prompt);
  ASSERT_TRUE(first.ok());

  test::TempDir dir("sampler");
  nlohmann::json c = {{"n_layer", g.n_layer}, {"n_head", g.n_head}, {"n_embd", g.n_embd},
                      {"max_seq_len", g.max_seq_len}, {"prompt", prompt}, {"tokens", greedy.tokens}};
  std::ofstream(dir.path() + "/case.json") << c.dump();
  SafetensorsWriter weights;
  const std::vector<TensorSpec> specs = GptVisibleTensorSpecs(g);
  for (size_t i = 0; i < specs.size(); ++i) weights.Add(specs[i].name, Dtype::kF32, specs[i].shape, params[i].data());
  ASSERT_TRUE(weights.Write(dir.path() + "/weights.safetensors").ok());
  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/torch_greedy.py " + dir.path();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  const nlohmann::json ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << "PyTorch reference failed: " << cmd << "\n" << out;
  const std::vector<double> ref_logits = ref["first_logits"].get<std::vector<double>>();
  ASSERT_EQ(ref_logits.size(), size_t(g.vocab_size));
  double num = 0, den = 0;
  for (size_t i = 0; i < ref_logits.size(); ++i) {
    num += ((*first)[i] - ref_logits[i]) * ((*first)[i] - ref_logits[i]);
    den += ref_logits[i] * ref_logits[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
  EXPECT_EQ(*ours, ref["greedy"].get<std::vector<int32_t>>());
}

TEST(Sampler, ASeedGivesTheSameTokensAndTopOneIsGreedy) {
  const GptConfig g = SmallConfig();
  auto sampler = Sampler::Create(g, RandomParams(g, 5));
  ASSERT_TRUE(sampler.ok());
  const std::vector<int32_t> prompt = {3, 1, 4};
  SampleOptions o;
  o.tokens = 20;
  o.temperature = 1.0;
  o.seed = 42;
  auto a = (*sampler)->Generate(prompt, o), b = (*sampler)->Generate(prompt, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->size(), 20u);
  o.seed = 43;
  EXPECT_NE(*(*sampler)->Generate(prompt, o), *a);
  o.top_k = 1;
  SampleOptions greedy;
  greedy.tokens = 20;
  greedy.temperature = 0;
  EXPECT_EQ(*(*sampler)->Generate(prompt, o), *(*sampler)->Generate(prompt, greedy));
  // Only ids below the limit, and the stop token ends it.
  o.top_k = 0;
  o.vocab_limit = 10;
  auto limited = (*sampler)->Generate(prompt, o);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->size(), 20u);
  for (int32_t t : *limited) EXPECT_LT(t, 10);
  o.stop_token = (*a)[0];
  o.vocab_limit = 0;
  o.seed = 42;
  EXPECT_TRUE((*sampler)->Generate(prompt, o)->empty());
}

TEST(Sampler, BadRequestsAreErrors) {
  const GptConfig g = SmallConfig();
  auto sampler = Sampler::Create(g, RandomParams(g, 6));
  ASSERT_TRUE(sampler.ok());
  SampleOptions o;
  EXPECT_FALSE((*sampler)->Generate({}, o).ok());
  o.temperature = -1;
  EXPECT_FALSE((*sampler)->Generate({1}, o).ok());
  o.temperature = 1;
  EXPECT_FALSE((*sampler)->Generate({int32_t(g.vocab_size)}, o).ok());
  auto params = RandomParams(g, 6);
  params.pop_back();
  EXPECT_FALSE(Sampler::Create(g, params).ok());
}

}  // namespace
}  // namespace pstar
