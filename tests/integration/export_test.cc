// pstar export: a checkpoint as a Hugging Face GPT-2 model. PyTorch (Debian's
// python3-torch) reads the exported files in GPT-2's own layout and must give
// the logits pstar's model computes from the same weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "tests/test_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/arena.h"
#include "worker/core/file_util.h"
#include "worker/model/gpt.h"

namespace pstar {
namespace {

namespace fs = std::filesystem;

const GptConfig kModel{2, 2, 16, 40, 8};

// The tensors as checkpoints hold them: no vocabulary padding.
struct Weights {
  std::vector<TensorSpec> specs = GptVisibleTensorSpecs(kModel);
  std::vector<std::vector<float>> values;
};

// Far from the default init, so biases and norm weights matter too.
Weights RandomWeights(uint64_t seed) {
  Weights w;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const TensorSpec& s : w.specs) {
    std::vector<float> v(size_t(s.numel()));
    for (float& x : v) x = normal(rng) + (s.role == TensorRole::kNormWeight ? 1.0f : 0.0f);
    w.values.push_back(std::move(v));
  }
  return w;
}

TrainingState State(int64_t step) {
  TrainingState s;
  s.step = step;
  s.layout_fingerprint = LayoutFingerprint(GptTensorSpecs(kModel));
  s.model = kModel;
  return s;
}

// Whole parameters (and, to be ignored by export, Adam moments).
std::vector<OwnedRange> WholeRanges(Weights& w, std::vector<std::vector<float>>* moments) {
  std::vector<OwnedRange> ranges;
  for (size_t i = 0; i < w.specs.size(); ++i) {
    ranges.push_back({StateKind::kParam, w.specs[i].name, 0, w.specs[i].numel(), w.values[i].data()});
    moments->emplace_back(w.values[i].size(), 0.5f);
    ranges.push_back({StateKind::kExpAvg, w.specs[i].name, 0, w.specs[i].numel(), moments->back().data()});
  }
  return ranges;
}

// The same weights as 3 ranks of a ZeRO world would save them: every tensor
// cut into three consecutive pieces (some empty).
void SaveAsThreeRanks(const std::string& root, Weights& w, int64_t step) {
  ASSERT_TRUE(PrepareStagingDir(root, step).ok());
  for (int r = 0; r < 3; ++r) {
    std::vector<OwnedRange> ranges;
    for (size_t i = 0; i < w.specs.size(); ++i) {
      const int64_t n = w.specs[i].numel();
      const int64_t b = n * r / 3, e = n * (r + 1) / 3;
      ranges.push_back({StateKind::kParam, w.specs[i].name, b, e, w.values[i].data() + b});
    }
    ASSERT_TRUE(WriteRankFile(StagingDir(root, step), r, 3, step, ranges).ok());
  }
  ASSERT_TRUE(PublishCheckpoint(root, 3, State(step), 0).ok());
}

std::vector<float> PstarLogits(Weights& w, const std::vector<int32_t>& tokens) {
  // The model's layout pads the vocabulary; the padding rows are zero.
  ParamStore store(*ParamLayout::Build(GptTensorSpecs(kModel), 0));
  for (TensorId id = 0; id < store.layout().num_tensors(); ++id) {
    float* p = store.TensorData(StateKind::kParam, id);
    std::fill_n(p, store.layout().spec(id).numel(), 0.0f);
    std::copy(w.values[size_t(id)].begin(), w.values[size_t(id)].end(), p);
  }
  const int64_t T = int64_t(tokens.size());
  Arena arena("activations", size_t(Gpt::ActivationBytes(kModel, 1, T, false)));
  auto gpt = Gpt::Create(kModel, store, arena, 1, T, false);
  EXPECT_TRUE(gpt.ok()) << gpt.status().message();
  if (!gpt.ok()) return {};
  std::vector<int32_t> targets(tokens.size(), 0);
  std::vector<float> logits(size_t(T * kModel.vocab_size));
  gpt->Forward({tokens.data(), targets.data()}, logits.data());
  return logits;
}

std::vector<double> ParseNumbers(const std::string& text) {
  std::istringstream in(text);
  std::vector<double> out;
  double v;
  while (in >> v) out.push_back(v);
  return out;
}

void ExpectOneLineError(const test::ProcessResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

TEST(Export, PyTorchReadsTheHuggingFaceLayoutAndGetsPstarsLogits) {
  const uint64_t seed = test::RunSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  test::TempDir dir("export");
  const std::string root = dir.path() + "/ckpt", out = dir.path() + "/hf";
  Weights w = RandomWeights(seed);
  std::vector<std::vector<float>> moments;
  auto comm = MakeSingleRankCommunicator();
  ASSERT_TRUE(SaveCheckpoint(root, 2, WholeRanges(w, &moments), State(7), *comm).ok());

  auto r = test::RunProcess({test::PstarBinary(), "export", "--checkpoint", root, "--output", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("exported step 7"), std::string::npos) << r.out;
  auto config = ReadFile(out + "/config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_NE(config->find("\"model_type\": \"gpt2\""), std::string::npos) << *config;
  EXPECT_NE(config->find("\"n_positions\": 8"), std::string::npos) << *config;
  // bos/eos inside the vocabulary (transformers' default, 50256, is not).
  const std::string last_id = std::to_string(kModel.vocab_size - 1);
  EXPECT_NE(config->find("\"eos_token_id\": " + last_id), std::string::npos) << *config;
  auto generation = ReadFile(out + "/generation_config.json");
  ASSERT_TRUE(generation.ok()) << generation.status().message();
  EXPECT_NE(generation->find("\"bos_token_id\": " + last_id), std::string::npos) << *generation;
  EXPECT_NE(generation->find("\"eos_token_id\": " + last_id), std::string::npos) << *generation;

  std::mt19937_64 rng(seed + 1);
  std::vector<int32_t> tokens(size_t(kModel.max_seq_len));
  std::string csv;
  for (auto& t : tokens) {
    t = int32_t(std::uniform_int_distribution<int64_t>(0, kModel.vocab_size - 1)(rng));
    csv += (csv.empty() ? "" : ",") + std::to_string(t);
  }
  auto py = test::RunProcess({"/usr/bin/python3", test::SourceDir() + "/tests/fixtures/hf_gpt2_logits.py", out, csv});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  const std::vector<double> ref = ParseNumbers(py.out);
  const std::vector<float> ours = PstarLogits(w, tokens);
  ASSERT_EQ(ref.size(), ours.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(ours[i]) - ref[i]) * (double(ours[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  const double rel = std::sqrt(num / den);
  std::printf("relative L2 error of pstar's logits vs the exported model in PyTorch: %.3g\n", rel);
  EXPECT_LE(rel, 1e-5);

  // The same weights saved by three ranks export to the same bytes.
  const std::string root3 = dir.path() + "/ckpt3", out3 = dir.path() + "/hf3";
  SaveAsThreeRanks(root3, w, 9);
  auto r3 = test::RunProcess({test::PstarBinary(), "export", "--checkpoint", root3, "--step", "9", "--output", out3});
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  EXPECT_EQ(*ReadFile(out + "/model.safetensors"), *ReadFile(out3 + "/model.safetensors"));
}

TEST(Export, BadInputGetsOneLineAndExitTwo) {
  test::TempDir dir("export");
  const std::string bin = test::PstarBinary(), root = dir.path() + "/ckpt";
  ExpectOneLineError(test::RunProcess({bin, "export", "--checkpoint", root}), "export needs --checkpoint and --output");
  ExpectOneLineError(test::RunProcess({bin, "export", "--checkpoint", root, "--output", dir.path() + "/o"}),
                     "no checkpoint");
  Weights w = RandomWeights(1);
  std::vector<std::vector<float>> moments;
  auto comm = MakeSingleRankCommunicator();
  ASSERT_TRUE(SaveCheckpoint(root, 2, WholeRanges(w, &moments), State(3), *comm).ok());
  ExpectOneLineError(test::RunProcess({bin, "export", "--checkpoint", root, "--step", "4", "--output", dir.path() + "/o"}),
                     "step-00000004: no such checkpoint");
  ExpectOneLineError(test::RunProcess({bin, "export", "--checkpoint", root, "--step", "x", "--output", dir.path() + "/o"}),
                     "--step: expected a step number");
  const std::string file = root + "/step-00000003/rank-00000.safetensors";
  fs::resize_file(file, fs::file_size(file) - 8);
  ExpectOneLineError(test::RunProcess({bin, "export", "--checkpoint", root, "--output", dir.path() + "/o"}),
                     "rank-00000.safetensors");
}

}  // namespace
}  // namespace pstar
