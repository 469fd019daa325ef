// Validation (data.val_path, train.eval_every): the loss over the same
// batches every time, equal to float64 PyTorch on those batches, the same bits
// for every device budget, and invisible to training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>

#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"
#include "worker/config/config.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

constexpr int64_t kVocab = 61, kBatch = 2, kSeq = 12, kEvalBatches = 3;

Config MakeConfig(const std::string& extra = "") {
  const std::string yaml =
      "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 61, max_seq_len: 16}\n"
      "optimizer: {type: AdamW, params: {lr: 0.01}}\n"
      "train: {batch_size: 2, seq_len: 12, steps: 6, eval_batches: 3, seed: 3}\n"
      "default_chunk_size: 1024\n" + extra;
  auto c = ParseConfig(yaml, "test");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % kVocab);
  return t;
}

std::vector<float> Params(Trainer& t) {
  std::vector<float> all;
  const ParamLayout& layout = t.store().layout();
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    const float* p = t.store().TensorData(StateKind::kParam, id);
    all.insert(all.end(), p, p + layout.spec(id).numel());
  }
  return all;
}

TEST(Validation, SameBatchesEveryTimeAndTrainingUntouched) {
  VectorTokenSource train(RandomTokens(2000, 1)), val(RandomTokens(500, 2));
  auto with = Trainer::Create(MakeConfig(), train);
  auto without = Trainer::Create(MakeConfig(), train);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_FALSE((*with)->Evaluate().ok());  // no validation data yet
  ASSERT_TRUE((*with)->SetValidationData(val).ok());
  std::vector<double> val_losses;
  for (int s = 0; s < 6; ++s) {
    auto a = (*with)->Step();
    auto b = (*without)->Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << s;
    EXPECT_EQ(a->grad_norm, b->grad_norm) << "step " << s;
    auto v1 = (*with)->Evaluate();
    auto v2 = (*with)->Evaluate();
    ASSERT_TRUE(v1.ok() && v2.ok());
    EXPECT_EQ(*v1, *v2) << "the same batches, the same parameters";
    val_losses.push_back(*v1);
  }
  EXPECT_EQ(Params(**with), Params(**without));
  EXPECT_LT(val_losses.back(), val_losses.front());  // it learns (the data is random, but small)
  // Too little validation data for one batch is refused.
  VectorTokenSource tiny(RandomTokens(size_t(kBatch * kSeq), 3));
  Status s = (*with)->SetValidationData(tiny);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("data.val_path"), std::string::npos) << s.message();
}

TEST(Validation, BitIdenticalForEveryDeviceBudget) {
  VectorTokenSource train(RandomTokens(2000, 4)), val(RandomTokens(400, 5));
  std::vector<double> reference;
  auto plan = PlanMemory(MakeConfig(), 1);
  ASSERT_TRUE(plan.ok());
  for (const std::string& budget : {std::string(""), "runtime: {device_memory: " + std::to_string(plan->min_device_bytes) + "}\n",
                                    "runtime: {device_memory: " + std::to_string(plan->min_device_bytes) +
                                        ", prefetch_depth: 0, eviction: lru}\n"}) {
    SCOPED_TRACE(budget);
    auto t = Trainer::Create(MakeConfig(budget), train);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE((*t)->SetValidationData(val).ok());
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE((*t)->Step().ok());
      auto v = (*t)->Evaluate();
      ASSERT_TRUE(v.ok());
      losses.push_back(*v);
    }
    if (reference.empty()) {
      reference = losses;
    } else {
      int64_t evictions = 0;
      for (const auto& e : (*t)->store().chunks().counters().evictions) evictions += e;
      EXPECT_GT(evictions, 0) << "chunks must move at this budget";
    }
    EXPECT_EQ(losses, reference);
  }
}

TEST(Validation, EqualsFloat64PyTorchOnTheSameBatches) {
  VectorTokenSource train(RandomTokens(2000, 6)), val(RandomTokens(300, 7));
  auto t = Trainer::Create(MakeConfig(), train);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->SetValidationData(val).ok());
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*t)->Step().ok());
  auto loss = (*t)->Evaluate();
  ASSERT_TRUE(loss.ok());

  test::TempDir dir("val_loss");
  std::ofstream(dir.path() + "/case.json") << "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 16}\n";
  const ParamLayout& layout = (*t)->store().layout();
  SafetensorsWriter weights;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    weights.Add(layout.spec(id).name, Dtype::kF32, layout.spec(id).visible_shape(),
                (*t)->store().TensorData(StateKind::kParam, id));
  }
  ASSERT_TRUE(weights.Write(dir.path() + "/weights.safetensors").ok());
  // The batches the validation reads: the first eval_batches of the source.
  auto loader = BatchLoader::Create(val, kBatch, kSeq);
  ASSERT_TRUE(loader.ok());
  const size_t n = size_t(kBatch * kSeq);
  std::vector<int32_t> tokens(kEvalBatches * n), targets(kEvalBatches * n);
  for (int64_t b = 0; b < kEvalBatches; ++b) loader->Next(&tokens[size_t(b) * n], &targets[size_t(b) * n]);
  SafetensorsWriter batches;
  batches.Add("tokens", Dtype::kI32, {kEvalBatches, kBatch, kSeq}, tokens.data());
  batches.Add("targets", Dtype::kI32, {kEvalBatches, kBatch, kSeq}, targets.data());
  ASSERT_TRUE(batches.Write(dir.path() + "/batches.safetensors").ok());

  const std::string cmd =
      "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/torch_val_loss.py " + dir.path();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  ASSERT_NE(pipe, nullptr);
  char line[128] = {};
  ASSERT_NE(std::fgets(line, sizeof line, pipe.get()), nullptr) << "PyTorch reference failed: " << cmd;
  const double ref = std::strtod(line, nullptr);
  std::printf("val loss: pstar %.9g, PyTorch float64 %.9g\n", *loss, ref);
  EXPECT_LE(std::abs(*loss - ref) / std::abs(ref), 1e-5);
}

}  // namespace
}  // namespace pstar
