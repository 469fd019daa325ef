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

using test::RelativeError;

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
  const ParamLayout& layout = store.layout();
  SafetensorsWriter weights;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    weights.Add(layout.spec(id).name, Dtype::kF32, layout.spec(id).visible_shape(),
                store.TensorData(StateKind::kParam, id));
  }
  ASSERT_TRUE(weights.Write(dir.path() + "/weights.safetensors").ok());
  auto loader = BatchLoader::Create(source, c.batch, c.seq);
  ASSERT_TRUE(loader.ok());
  const size_t n = size_t(c.batch * c.seq);
  std::vector<int32_t> tokens(size_t(c.steps) * n), targets(size_t(c.steps) * n);
  for (int64_t s = 0; s < c.steps; ++s) loader->Next(&tokens[size_t(s) * n], &targets[size_t(s) * n]);
  SafetensorsWriter batches;
  batches.Add("tokens", Dtype::kI32, {c.steps, c.batch, c.seq}, tokens.data());
  batches.Add("targets", Dtype::kI32, {c.steps, c.batch, c.seq}, targets.data());
  ASSERT_TRUE(batches.Write(dir.path() + "/batches.safetensors").ok());

  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() +
                          "/tests/fixtures/torch_gpt_reference.py " + dir.path();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "PyTorch reference failed: " << cmd;

  // Forward and backward on the first batch, from the same weights.
  Gpt& model = (*trainer)->model();
  store.ZeroGrads();
  std::vector<float> logits(n * size_t(c.vocab));
  model.TrainForward(tokens.data(), targets.data(), 1.0f, logits.data());
  const float loss = float(model.TakeLoss());
  model.Backward();

  // Tolerance per tensor: 1e-5 relative, or more for an ill-conditioned
  // tensor (cancellation in a sum, a near-constant LayerNorm row), measured by
  // how far PyTorch's own float32 result lies from its float64 one.
  auto ref64 = SafetensorsFile::Read(dir.path() + "/ref_float64.safetensors");
  auto ref32 = SafetensorsFile::Read(dir.path() + "/ref_float32.safetensors");
  ASSERT_TRUE(ref64.ok()) << ref64.status().message();
  ASSERT_TRUE(ref32.ok()) << ref32.status().message();
  auto tolerance = [&](const std::string& tensor) {
    const std::vector<double> exact = *ref64->ToDoubles(tensor);
    const std::vector<double> f32 = *ref32->ToDoubles(tensor);
    const std::vector<float> rounded(f32.begin(), f32.end());
    return std::max(1e-5, 4 * RelativeError(rounded.data(), exact));
  };
  for (const char* precision : {"float64", "float32"}) {
    SCOPED_TRACE(precision);
    const SafetensorsFile& ref = std::string(precision) == "float64" ? *ref64 : *ref32;
    double worst = RelativeError(logits.data(), *ref.ToDoubles("logits"));
    EXPECT_LE(worst, tolerance("logits")) << "logits";
    double ref_loss = (*ref.ToDoubles("loss"))[0];
    EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-5) << "loss " << loss << " vs " << ref_loss;
    for (TensorId id = 0; id < layout.num_tensors(); ++id) {
      const std::string& name = layout.spec(id).name;
      double err = RelativeError(store.TensorData(StateKind::kGrad, id), *ref.ToDoubles("grad." + name));
      EXPECT_LE(err, tolerance("grad." + name)) << "gradient of " << name;
      worst = std::max(worst, err);
    }
    std::printf("%s: worst relative error over logits and gradients %.3g\n", precision, worst);
  }

  // Ten AdamW steps (warmup, cosine, clipping, weight decay) from the same weights.
  auto fresh = Trainer::Create(*config, source);
  ASSERT_TRUE(fresh.ok());
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    std::copy_n(store.TensorData(StateKind::kParam, id), layout.spec(id).numel(),
                (*fresh)->store().TensorData(StateKind::kParam, id));
  }
  std::vector<float> losses;
  for (int64_t s = 0; s < c.steps; ++s) {
    auto st = (*fresh)->Step();
    ASSERT_TRUE(st.ok()) << st.status().message();
    losses.push_back(st->loss);
  }
  for (const char* precision : {"float64", "float32"}) {
    SCOPED_TRACE(precision);
    auto ref = SafetensorsFile::Read(dir.path() + "/ref_" + precision + ".safetensors");
    ASSERT_TRUE(ref.ok());
    auto ref_losses = *ref->ToDoubles("losses");
    ASSERT_EQ(ref_losses.size(), losses.size());
    double worst = 0;
    for (size_t s = 0; s < losses.size(); ++s) {
      double rel = std::abs(losses[s] - ref_losses[s]) / std::abs(ref_losses[s]);
      EXPECT_LE(rel, 1e-4) << "loss at step " << s + 1 << ": " << losses[s] << " vs " << ref_losses[s];
      worst = std::max(worst, rel);
    }
    std::printf("%s: worst relative loss error over %lld AdamW steps %.3g\n", precision,
                (long long)c.steps, worst);
  }
}

}  // namespace
}  // namespace pstar
