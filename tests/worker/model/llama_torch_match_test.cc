// The CPU decoder with the Llama family's description (Llama, Qwen2,
// Mistral) against PyTorch (Debian's python3-torch) written from the Hugging
// Face models' math, in float64 and float32: one case per query-head group
// (1, 2, 3, 4, 7 and 8 query heads per kv head), each with a fresh random
// shape, weights and batch every run, together covering tied and untied
// embeddings, Qwen2's q/k/v biases, Llama 3's RoPE scaling on and off, head
// sizes 32 to 128, odd sequence lengths and vocabularies in row parts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tests/test_util.h"
#include "tests/worker/model/torch_match.h"
#include "worker/model/gpt.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

struct LlamaCase {
  std::string architecture;
  int64_t n_layer, n_head, n_kv_head, n_embd, head_dim, intermediate, vocab, max_seq, batch, seq;
  bool tied, scaling;
  double theta, eps;
  float grad_clip;
  int64_t steps = 10;
};

// Case i of six: its group, architecture, tying and scaling fixed so that the
// six cover every form; the sizes drawn.
LlamaCase DrawCase(int i, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  static constexpr int64_t kGroups[6] = {1, 2, 3, 4, 7, 8};
  static constexpr const char* kArchitectures[6] = {"llama", "qwen2", "llama", "mistral", "qwen2", "llama"};
  static constexpr int64_t kHeadDims[5] = {32, 48, 64, 96, 128};
  LlamaCase c{};
  c.architecture = kArchitectures[i];
  c.n_kv_head = kGroups[i] >= 7 ? 1 : pick(1, 2);
  c.n_head = kGroups[i] * c.n_kv_head;
  c.head_dim = i == 0 ? 32 : i == 5 ? 128 : kHeadDims[pick(0, 4)];
  c.n_layer = pick(1, 2);
  c.n_embd = 16 * pick(2, 5);
  c.intermediate = 16 * pick(2, 6);
  c.vocab = pick(16, 96);
  c.seq = 2 * pick(2, 11) + 1;  // odd
  c.max_seq = pick(c.seq, 32);
  c.batch = pick(1, 2);
  c.tied = i % 2 == 0;
  c.scaling = i == 0 || i == 5;
  c.theta = std::vector<double>{10000.0, 500000.0, 1000000.0}[size_t(pick(0, 2))];
  c.eps = pick(0, 1) ? 1e-5 : 1e-6;
  c.grad_clip = pick(0, 1) ? 0.5f : 0.0f;
  return c;
}

// Llama 3's scaling with a 16-position original context: at these head
// sizes its three frequency bands (kept, smoothed, divided) all occur.
constexpr const char* kScaling =
    "{type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 16}";

std::string CaseYaml(const LlamaCase& c) {
  std::ostringstream y;
  y << "model: {architecture: " << c.architecture << ", n_layer: " << c.n_layer << ", n_head: " << c.n_head
    << ", n_kv_head: " << c.n_kv_head << ", n_embd: " << c.n_embd << ", head_dim: " << c.head_dim
    << ", intermediate_size: " << c.intermediate << ", vocab_size: " << c.vocab << ", max_seq_len: " << c.max_seq
    << ", norm_eps: " << c.eps << ", rope_theta: " << c.theta
    << ", tie_word_embeddings: " << (c.tied ? "true" : "false");
  if (c.scaling) y << ", rope_scaling: " << kScaling;
  y << "}\n"
    << "optimizer: {type: AdamW, params: {lr: 0.003, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}}\n"
    << "train: {batch_size: " << c.batch << ", seq_len: " << c.seq << ", steps: " << c.steps
    << ", warmup_steps: 3, min_lr: 0.0003, grad_clip: " << c.grad_clip << ", seed: 7}\n";
  return y.str();
}

std::string CaseJson(const LlamaCase& c) {
  std::ostringstream j;
  j.precision(17);
  j << "{\"n_layer\": " << c.n_layer << ", \"n_head\": " << c.n_head << ", \"n_kv_head\": " << c.n_kv_head
    << ", \"head_dim\": " << c.head_dim << ", \"norm_eps\": " << c.eps << ", \"tied\": " << (c.tied ? "true" : "false")
    << ", \"rope\": {\"theta\": " << c.theta;
  if (c.scaling) {
    j << ", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max\": 16";
  }
  j << "}, \"lr\": 0.003, \"min_lr\": 0.0003, \"warmup_steps\": 3, \"steps\": " << c.steps
    << ", \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1, \"grad_clip\": " << c.grad_clip
    << "}\n";
  return j.str();
}

TEST(LlamaTorchMatch, LogitsLossGradientsAndAdamWTrajectoryForEveryQueryHeadGroup) {
  const uint64_t seed = test::RunSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  test::TempDir dir("llama_torch_match");
  struct Prepared {
    LlamaCase c;
    Config config;
    std::unique_ptr<Trainer> trainer;
    std::vector<int32_t> tokens, targets;
    std::string dir;
  };
  std::vector<Prepared> cases;
  std::vector<VectorTokenSource> sources;
  sources.reserve(6);
  std::string dirs;
  for (int i = 0; i < 6; ++i) {
    Prepared p;
    p.c = DrawCase(i, rng);
    auto config = ParseConfig(CaseYaml(p.c), "case");
    ASSERT_TRUE(config.ok()) << config.status().message() << "\n" << CaseYaml(p.c);
    // Cases 2 (tied) and 3 (untied) take a vocabulary larger than a block's
    // tensors: their token table and classifier are in row parts.
    while ((i == 2 || i == 3) && VocabPartRows(config->model.gpt) >= config->model.gpt.padded_vocab_size()) {
      p.c.vocab += 64;
      config = ParseConfig(CaseYaml(p.c), "case");
      ASSERT_TRUE(config.ok()) << config.status().message();
    }
    p.config = *config;
    std::vector<int32_t> stream(size_t(p.c.steps * p.c.batch * p.c.seq + 1));
    for (auto& t : stream) t = int32_t(std::uniform_int_distribution<int64_t>(0, p.c.vocab - 1)(rng));
    sources.emplace_back(stream);
    auto trainer = Trainer::Create(p.config, sources.back());
    ASSERT_TRUE(trainer.ok()) << trainer.status().message();
    p.trainer = std::move(*trainer);
    // Half GPT-2's test's spread: heads of up to 128 columns would make
    // scores of std 6 at 0.3 (q and k widen with the head), a softmax so
    // peaked that fp32 rounding anywhere is amplified.
    test::RandomizeWeights(p.trainer->store(), seed + uint64_t(i), 0.15f);
    p.dir = dir.path() + "/case" + std::to_string(i);
    std::filesystem::create_directories(p.dir);
    std::ofstream(p.dir + "/case.json") << CaseJson(p.c);
    test::WriteTorchCase(p.trainer->store(), sources.back(), p.c.steps, p.c.batch, p.c.seq, p.dir, &p.tokens,
                         &p.targets);
    dirs += " " + p.dir;
    cases.push_back(std::move(p));
  }
  const std::string cmd =
      "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/torch_llama_reference.py" + dirs;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "PyTorch reference failed: " << cmd;

  for (size_t i = 0; i < cases.size(); ++i) {
    Prepared& p = cases[i];
    const LlamaCase& c = p.c;
    SCOPED_TRACE("case " + std::to_string(i) + ":\n" + CaseYaml(c));
    auto ref = test::ReadTorchReference(p.dir);
    ASSERT_TRUE(ref.has_value());
    ParamStore& store = p.trainer->store();
    Gpt& model = p.trainer->model();
    store.ZeroGrads();
    std::vector<float> logits(size_t(c.batch * c.seq * c.vocab));
    model.TrainForward({p.tokens.data(), p.targets.data()}, 1.0f / float(c.batch * c.seq), logits.data());
    const float loss = float(model.TakeLoss());
    model.Backward();
    // Qwen2's key bias is ill-conditioned: its gradient sums each position's
    // rotated dk, which nearly cancel (without RoPE they would cancel
    // exactly, a key bias shifting every score of a query alike), so float32
    // sums in two orders differ by more than elsewhere.
    auto floor = [](const std::string& name) {
      return name.find("k_proj.bias") != std::string::npos ? 2e-4 : 1e-5;
    };
    const double worst = test::ExpectMatchesTorch(*ref, store, logits, loss, floor);

    // Ten AdamW steps (warmup, cosine, clipping, weight decay) from the same weights.
    const std::vector<float> losses = test::TrainFromWeights(p.config, sources[i], store, c.steps);
    const double trajectory = test::ExpectTrajectoryMatchesTorch(*ref, losses, /*as_float32_is=*/true);
    const int64_t Vp = p.config.model.gpt.padded_vocab_size(), rows = VocabPartRows(p.config.model.gpt);
    const int64_t parts = (Vp + rows - 1) / rows;
    const std::string tables = parts > 1 ? " in " + std::to_string(parts) + " row parts" : "";
    std::printf("%s NH=%lld NKV=%lld hs=%lld C=%lld F=%lld V=%lld%s T=%lld B=%lld %s%s: float64 worst "
                "relative error %.3g (logits and gradients), %.3g (%lld AdamW losses)\n",
                c.architecture.c_str(), (long long)c.n_head, (long long)c.n_kv_head, (long long)c.head_dim,
                (long long)c.n_embd, (long long)c.intermediate, (long long)c.vocab, tables.c_str(),
                (long long)c.seq,
                (long long)c.batch, c.tied ? "tied" : "untied", c.scaling ? ", llama3 scaling" : "", worst,
                trajectory, (long long)c.steps);
  }
}

}  // namespace
}  // namespace pstar
