// The CPU GPT against PyTorch (Debian's python3-torch), in float64 and float32,
// on a fresh random model shape, weights and batch every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "tests/test_util.h"
#include "tests/worker/model/torch_match.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/counter_rng.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

struct Case {
  int64_t n_layer, n_head, n_embd, vocab, max_seq, batch, seq;
  float lr, min_lr, weight_decay, grad_clip;
  int64_t warmup, steps;
};

Case RandomCase(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Case c{};
  c.n_layer = pick(1, 3);
  c.n_head = int64_t(1) << pick(0, 2);
  c.n_embd = c.n_head * (int64_t(4) << pick(0, 2));
  c.vocab = pick(16, 96);
  c.max_seq = pick(8, 24);
  c.seq = pick(4, c.max_seq);
  c.batch = pick(1, 3);
  c.lr = 0.003f;
  c.min_lr = 0.0003f;
  c.weight_decay = 0.1f;
  c.grad_clip = pick(0, 1) ? 0.5f : 0.0f;
  c.warmup = 3;
  c.steps = 10;
  return c;
}

std::string CaseYaml(const Case& c) {
  std::ostringstream y;
  y << "model: {n_layer: " << c.n_layer << ", n_head: " << c.n_head << ", n_embd: " << c.n_embd
    << ", vocab_size: " << c.vocab << ", max_seq_len: " << c.max_seq << "}\n"
    << "optimizer: {type: AdamW, params: {lr: " << c.lr << ", betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: "
    << c.weight_decay << "}}\n"
    << "train: {batch_size: " << c.batch << ", seq_len: " << c.seq << ", steps: " << c.steps
    << ", warmup_steps: " << c.warmup << ", min_lr: " << c.min_lr << ", grad_clip: " << c.grad_clip
    << ", seed: 7}\n";
  return y.str();
}

TEST(GptTorchMatch, LogitsLossGradientsAndAdamWTrajectory) {
  const uint64_t seed = test::RunSeed();
  std::mt19937_64 rng(seed);
  const Case c = RandomCase(rng);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  auto config = ParseConfig(CaseYaml(c), "case");
  ASSERT_TRUE(config.ok()) << config.status().message();
  // The classifier's logits whole or in row blocks, as the shape decides.
  const int64_t classifier_rows = ClassifierRows(config->model.gpt, c.batch * c.seq);
  std::printf("case: seed=%llu L=%lld NH=%lld C=%lld V=%lld T=%lld B=%lld clip=%g classifier rows %lld of %lld\n",
              (unsigned long long)seed, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd,
              (long long)c.vocab, (long long)c.seq, (long long)c.batch, double(c.grad_clip),
              (long long)classifier_rows, (long long)(c.batch * c.seq));
  std::vector<int32_t> stream(size_t(c.steps * c.batch * c.seq + 1));
  for (auto& t : stream) t = int32_t(std::uniform_int_distribution<int64_t>(0, c.vocab - 1)(rng));
  VectorTokenSource source(stream);

  auto trainer = Trainer::Create(*config, source);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  ParamStore& store = (*trainer)->store();
  test::RandomizeWeights(store, seed);

  // The case for PyTorch: shapes, weights, batches.
  test::TempDir dir("torch_match");
  {
    std::ofstream json(dir.path() + "/case.json");
    json << "{\"n_layer\": " << c.n_layer << ", \"n_head\": " << c.n_head << ", \"n_embd\": " << c.n_embd
         << ", \"lr\": " << c.lr << ", \"min_lr\": " << c.min_lr << ", \"warmup_steps\": " << c.warmup
         << ", \"steps\": " << c.steps << ", \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8"
         << ", \"weight_decay\": " << c.weight_decay << ", \"grad_clip\": " << c.grad_clip << "}\n";
  }
  std::vector<int32_t> tokens, targets;
  test::WriteTorchCase(store, source, c.steps, c.batch, c.seq, dir.path(), &tokens, &targets);
  const size_t n = size_t(c.batch * c.seq);

  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() +
                          "/tests/fixtures/torch_gpt_reference.py " + dir.path();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "PyTorch reference failed: " << cmd;

  // Forward and backward on the first batch, from the same weights.
  Gpt& model = (*trainer)->model();
  store.ZeroGrads();
  std::vector<float> logits(n * size_t(c.vocab));
  model.TrainForward({tokens.data(), targets.data()}, 1.0f / float(n), logits.data());
  const float loss = float(model.TakeLoss());
  model.Backward();

  auto ref = test::ReadTorchReference(dir.path());
  ASSERT_TRUE(ref.has_value());
  const double worst = test::ExpectMatchesTorch(*ref, store, logits, loss);
  std::printf("float64: worst relative error over logits and gradients %.3g\n", worst);

  // Ten AdamW steps (warmup, cosine, clipping, weight decay) from the same weights.
  const std::vector<float> losses = test::TrainFromWeights(*config, source, store, c.steps);
  const double trajectory = test::ExpectTrajectoryMatchesTorch(*ref, losses);
  std::printf("float64: worst relative loss error over %lld AdamW steps %.3g\n", (long long)c.steps, trajectory);
}

}  // namespace
}  // namespace pstar
