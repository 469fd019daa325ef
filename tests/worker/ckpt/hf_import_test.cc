// model.init_from: Hugging Face GPT-2 weights written by PyTorch (both naming
// variants, buffers, BF16) import exactly, at any world size; import then
// export is bit-identical; the imported model gives float64 PyTorch's logits
// and trains as PyTorch does; bad directories are one-line errors.
#include "worker/ckpt/hf_import.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/safetensors.h"
#include "worker/runtime/half_format.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kEmbd = 16, kVocab = 70, kPositions = 12, kBatch = 2, kSeq = 10;

class HfImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("hf_import");
    const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/hf_gpt2_write.py " +
                            dir_->path() + " 7 " + std::to_string(kLayers) + " " + std::to_string(kHeads) + " " +
                            std::to_string(kEmbd) + " " + std::to_string(kVocab) + " " + std::to_string(kPositions);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Dir(const std::string& variant) { return dir_->path() + "/" + variant; }

  static Config MakeConfig(const std::string& init_from, const std::vector<std::string>& overrides = {}) {
    const std::string yaml =
        "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 70, max_seq_len: 12, init_from: " + init_from + "}\n"
        "optimizer: {type: AdamW, params: {lr: 0.003, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}}\n"
        "train: {batch_size: 2, seq_len: 10, steps: 5, warmup_steps: 2, min_lr: 0.0003, grad_clip: 1.0, seed: 3}\n"
        "default_chunk_size: 2048\n";
    auto c = ParseConfig(yaml, "test", overrides);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return *c;
  }

  static test::TempDir* dir_;
};
test::TempDir* HfImportTest::dir_ = nullptr;

std::vector<int32_t> Tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + 11) % kVocab);
  return t;
}

TEST_F(HfImportTest, BothNamingVariantsAndBf16ImportExactly) {
  auto ref = SafetensorsFile::Read(dir_->path() + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  VectorTokenSource data(Tokens(500));
  for (const std::string variant : {"prefixed", "bare", "bf16"}) {
    SCOPED_TRACE(variant);
    auto t = Trainer::Create(MakeConfig(Dir(variant)), data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    const ParamLayout& layout = (*t)->store().layout();
    for (TensorId id = 0; id < layout.num_tensors(); ++id) {
      const TensorSpec& spec = layout.spec(id);
      std::vector<float> want = *ref->ToFloats(spec.name);
      if (variant == "bf16") {  // the reference rounded to bf16
        std::vector<uint16_t> h(want.size());
        NarrowToHalf(h.data(), want.data(), int64_t(want.size()), HalfFormat::kBf16);
        WidenFromHalf(want.data(), h.data(), int64_t(want.size()), HalfFormat::kBf16);
      }
      const float* got = (*t)->store().TensorData(StateKind::kParam, id);
      ASSERT_EQ(std::vector<float>(got, got + spec.visible_numel()), want) << spec.name;
      for (int64_t i = spec.visible_numel(); i < spec.numel(); ++i) ASSERT_EQ(got[i], 0.0f) << "padding of " << spec.name;
    }
  }
}

TEST_F(HfImportTest, AnyWorldSizeFillsEachRanksSlices) {
  auto ref = SafetensorsFile::Read(dir_->path() + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  VectorTokenSource data(Tokens(500));
  constexpr int kWorld = 3;
  auto comms = test::MakeThreadGroupCommunicators(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<int64_t> checked(kWorld, 0);
  auto run = [&](int rank) {
    auto t = Trainer::Create(MakeConfig(Dir("bare"), {"train.batch_size=1"}), data,
                             comms[size_t(rank)].get());
    if (!t.ok()) {
      errors[size_t(rank)] = t.status().message();
      return;
    }
    ParamStore& store = (*t)->store();
    const ParamLayout& layout = store.layout();
    for (int32_t c = 0; c < layout.num_chunks(); ++c) {
      const float* shard = store.HostShard(StateKind::kParam, c);
      for (TensorId id : layout.chunk_tensors(c)) {
        const TensorSpec& spec = layout.spec(id);
        const std::vector<float> want = *ref->ToFloats(spec.name);
        const ParamStore::Slice s = store.OwnedSlice(id);
        for (int64_t i = s.begin; i < s.end; ++i) {
          const float expect = i < spec.visible_numel() ? want[size_t(i)] : 0.0f;
          if (shard[s.shard_offset + i - s.begin] != expect) {
            errors[size_t(rank)] = spec.name + " element " + std::to_string(i);
            return;
          }
          ++checked[size_t(rank)];
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (auto& th : threads) th.join();
  int64_t total = 0;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_GT(checked[size_t(r)], 0) << "rank " << r;
    total += checked[size_t(r)];
  }
  auto one = Trainer::Create(MakeConfig(Dir("bare")), data);
  ASSERT_TRUE(one.ok());
  int64_t elements = 0;
  for (TensorId id = 0; id < (*one)->store().layout().num_tensors(); ++id) elements += (*one)->store().layout().spec(id).numel();
  EXPECT_GE(total, elements) << "every element is some rank's";
}

TEST_F(HfImportTest, ImportThenExportIsBitIdentical) {
  VectorTokenSource data(Tokens(500));
  test::TempDir out("hf_roundtrip");
  auto t = Trainer::Create(MakeConfig(Dir("prefixed"), {"checkpoint.dir=" + out.path() + "/ckpt"}), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_TRUE((*t)->SaveCheckpoint().ok());
  auto exported = ExportHuggingFace(out.path() + "/ckpt/step-00000000", out.path() + "/hf");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  auto in = SafetensorsFile::Read(Dir("prefixed") + "/model.safetensors");
  auto back = SafetensorsFile::Read(exported->weight_paths.at(0));
  ASSERT_TRUE(in.ok() && back.ok());
  int compared = 0;
  for (const auto& [name, tensor] : back->tensors()) {
    ASSERT_TRUE(in->Has(name)) << name;
    EXPECT_EQ(tensor.shape, in->tensors().at(name).shape) << name;
    EXPECT_EQ(*back->ToFloats(name), *in->ToFloats(name)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 + 12 * kLayers + 2);
  // And the export imports again to the same parameters.
  auto again = Trainer::Create(MakeConfig(out.path() + "/hf"), data);
  ASSERT_TRUE(again.ok()) << again.status().message();
  for (TensorId id = 0; id < (*t)->store().layout().num_tensors(); ++id) {
    const int64_t n = (*t)->store().layout().spec(id).numel();
    const float* a = (*t)->store().TensorData(StateKind::kParam, id);
    const float* b = (*again)->store().TensorData(StateKind::kParam, id);
    EXPECT_EQ(std::vector<float>(a, a + n), std::vector<float>(b, b + n));
  }
}

TEST_F(HfImportTest, GivesPyTorchsLogitsAndTrainsAsPyTorchDoes) {
  const int64_t steps = 5;
  VectorTokenSource data(Tokens(size_t(steps * kBatch * kSeq + 1)));
  auto t = Trainer::Create(MakeConfig(Dir("bare")), data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  test::TempDir c("hf_import_torch");
  std::ofstream(c.path() + "/case.json")
      << "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 16, \"lr\": 0.003, \"min_lr\": 0.0003, \"warmup_steps\": 2, "
         "\"steps\": 5, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1, \"grad_clip\": 1.0}\n";
  std::filesystem::copy_file(dir_->path() + "/reference.safetensors", c.path() + "/weights.safetensors");
  auto loader = BatchLoader::Create(data, kBatch, kSeq);
  ASSERT_TRUE(loader.ok());
  const size_t n = size_t(kBatch * kSeq);
  std::vector<int32_t> tokens(size_t(steps) * n), targets(size_t(steps) * n);
  for (int64_t s = 0; s < steps; ++s) loader->Next(&tokens[size_t(s) * n], &targets[size_t(s) * n]);
  SafetensorsWriter batches;
  batches.Add("tokens", Dtype::kI32, {steps, kBatch, kSeq}, tokens.data());
  batches.Add("targets", Dtype::kI32, {steps, kBatch, kSeq}, targets.data());
  ASSERT_TRUE(batches.Write(c.path() + "/batches.safetensors").ok());
  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/torch_gpt_reference.py " + c.path();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ref = SafetensorsFile::Read(c.path() + "/ref_float64.safetensors");
  ASSERT_TRUE(ref.ok());

  std::vector<float> logits(n * size_t(kVocab));
  (*t)->model().Forward({tokens.data(), targets.data()}, logits.data());
  (void)(*t)->model().TakeLoss();
  const std::vector<double> want = *ref->ToDoubles("logits");
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (logits[i] - want[i]) * (logits[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
  const std::vector<double> losses = *ref->ToDoubles("losses");
  for (int64_t s = 0; s < steps; ++s) {
    auto st = (*t)->Step();
    ASSERT_TRUE(st.ok()) << st.status().message();
    EXPECT_LE(std::abs(st->loss - losses[size_t(s)]) / losses[size_t(s)], 1e-4) << "step " << s;
  }
}

TEST_F(HfImportTest, BadDirectoriesAreOneLineErrors) {
  VectorTokenSource data(Tokens(500));
  const auto expect = [&](const Config& config, const std::string& needle) {
    auto t = Trainer::Create(config, data);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
    EXPECT_EQ(t.status().message().rfind("model.init_from: ", 0), 0u) << t.status().message();
  };
  // The model's shape differs from the file's, or there is no file: the
  // config is refused before any trainer exists.
  auto wide = ParseConfig("model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 70, max_seq_len: 12, init_from: " +
                              Dir("prefixed") + "}\ntrain: {batch_size: 2, seq_len: 10}\n",
                          "test");
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.status().message(), "test: model.n_embd: is 32 but " + Dir("prefixed") +
                                         "/config.json has 16 (model.init_from describes the model: leave "
                                         "model.n_embd unset)");
  auto nowhere = ParseConfig("model: {init_from: " + dir_->path() + "/nowhere}\n", "test");
  ASSERT_FALSE(nowhere.ok());
  EXPECT_EQ(nowhere.status().message(), "test: model.init_from: " + dir_->path() + "/nowhere/config.json: no such file");
  // A tensor missing, an unknown one, a shape that lies, an untied head.
  test::TempDir bad("hf_bad");
  auto in = SafetensorsFile::Read(Dir("prefixed") + "/model.safetensors");
  ASSERT_TRUE(in.ok());
  const auto write_variant = [&](const std::string& drop, const std::string& add, bool wrong_shape, bool untie) {
    std::vector<std::vector<float>> keep;
    SafetensorsWriter w;
    for (const auto& [name, tensor] : in->tensors()) {
      if (name == drop) continue;
      keep.push_back(*in->ToFloats(name));
      if (untie && name == "lm_head.weight") keep.back()[0] += 1.0f;
      std::vector<int64_t> shape = tensor.shape;
      if (wrong_shape && name == "transformer.h.0.mlp.c_fc.weight") std::swap(shape[0], shape[1]);
      w.Add(name, Dtype::kF32, shape, keep.back().data());
    }
    std::vector<float> extra(4, 1.0f);
    if (!add.empty()) w.Add(add, Dtype::kF32, {4}, extra.data());
    std::filesystem::copy_file(Dir("prefixed") + "/config.json", bad.path() + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    ASSERT_TRUE(w.Write(bad.path() + "/model.safetensors").ok());
  };
  write_variant("transformer.h.1.ln_2.bias", "", false, false);
  expect(MakeConfig(bad.path()), "no tensor transformer.h.1.ln_2.bias");
  write_variant("", "transformer.h.0.attn.rotary", false, false);
  expect(MakeConfig(bad.path()), "unknown tensor transformer.h.0.attn.rotary");
  write_variant("", "", true, false);
  expect(MakeConfig(bad.path()), "transformer.h.0.mlp.c_fc.weight has shape [64, 16], the model needs [16, 64]");
  write_variant("", "", false, true);
  expect(MakeConfig(bad.path()), "lm_head.weight differs from transformer.wte.weight");
}

}  // namespace
}  // namespace pstar
