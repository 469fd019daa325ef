// model.init_from for the Llama family: random Llama (grouped-query heads,
// Llama 3's RoPE scaling, untied, rotary buffers in the files), Qwen2 (q/k/v
// biases, one key/value head, tied with the head in the files) and Mistral
// (a vocabulary in row parts) directories written by PyTorch, sharded with
// an index, in BF16, F16 and F32. Their config.json describes the model;
// imported, the weights are the files' exactly at any world size, the first
// step's logits, loss and gradients and the AdamW losses equal the float64
// reference's; the import's memory stays within its buffer; a key that
// contradicts the directory and every bad tensor are one-line errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/model/torch_match.h"
#include "worker/ckpt/hf_config.h"
#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/hf_import.h"
#include "worker/ckpt/hf_weights.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  std::string name;
  nlohmann::json spec;
};

// The three directories: each architecture, dtype and file layout once.
std::vector<Fixture> Fixtures() {
  return {
      {"llama", {{"architecture", "llama"}, {"seed", 3}, {"n_layer", 2}, {"n_head", 4}, {"n_kv_head", 2},
                 {"hidden", 32}, {"head_dim", 16}, {"intermediate", 48}, {"vocab", 90}, {"max_positions", 64},
                 {"theta", 500000.0}, {"eps", 1e-5}, {"tied", false}, {"scaling", true}, {"dtype", "BF16"},
                 {"shards", 3}, {"inv_freq", true}}},
      {"qwen2", {{"architecture", "qwen2"}, {"seed", 4}, {"n_layer", 2}, {"n_head", 3}, {"n_kv_head", 1},
                 {"hidden", 24}, {"head_dim", 8}, {"intermediate", 40}, {"vocab", 70}, {"max_positions", 32},
                 {"theta", 1000000.0}, {"eps", 1e-6}, {"tied", true}, {"scaling", false}, {"dtype", "F16"},
                 {"shards", 2}, {"lm_head_in_file", true}}},
      {"mistral", {{"architecture", "mistral"}, {"seed", 5}, {"n_layer", 1}, {"n_head", 4}, {"n_kv_head", 2},
                   {"hidden", 32}, {"head_dim", 8}, {"intermediate", 48}, {"vocab", 300}, {"max_positions", 48},
                   {"theta", 1000000.0}, {"eps", 1e-5}, {"tied", false}, {"scaling", false}, {"dtype", "F32"},
                   {"shards", 1}}},
  };
}

constexpr int64_t kBatch = 2, kSeq = 11, kSteps = 4;

class HfFamilyImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new test::TempDir("hf_family");
    for (const Fixture& f : Fixtures()) Write(f.spec, Dir(f.name), Reference(f.name));
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static void Write(const nlohmann::json& spec, const std::string& dir, const std::string& reference) {
    const std::string spec_path = dir + ".spec.json";
    std::ofstream(spec_path) << spec.dump();
    const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/hf_llama_write.py " +
                            spec_path + " " + dir + " " + reference;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static std::string Dir(const std::string& name) { return root_->path() + "/" + name; }
  static std::string Reference(const std::string& name) { return root_->path() + "/" + name + ".reference.safetensors"; }

  static std::string Yaml(const std::string& dir, const std::string& more = "") {
    return "model: {init_from: " + dir + more + "}\n"
           "optimizer: {type: AdamW, params: {lr: 0.003, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}}\n"
           "train: {batch_size: 2, seq_len: 11, steps: 4, warmup_steps: 2, min_lr: 0.0003, grad_clip: 1.0, seed: 3}\n";
  }
  static Result<Config> Parse(const std::string& dir, const std::vector<std::string>& overrides = {},
                              const std::string& more = "") {
    return ParseConfig(Yaml(dir, more), "test", overrides);
  }

  static test::TempDir* root_;
};
test::TempDir* HfFamilyImportTest::root_ = nullptr;

std::vector<int32_t> Tokens(size_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + 11) % size_t(vocab));
  return t;
}

// Every rank's owned elements against the reference file; returns how many
// it compared, or fails naming the first difference.
int64_t ExpectOwnedSlicesAre(ParamStore& store, const SafetensorsFile& ref) {
  const ParamLayout& layout = store.layout();
  int64_t compared = 0;
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    const float* shard = store.HostShard(StateKind::kParam, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const TensorSpec& spec = layout.spec(id);
      const std::vector<float> want = *ref.ToFloats(spec.tensor());
      const ParamStore::Slice s = store.OwnedSlice(id);
      for (int64_t i = s.begin; i < s.end; ++i) {
        const float expect = i < spec.visible_numel() ? want[size_t(spec.tensor_offset() + i)] : 0.0f;
        if (shard[s.shard_offset + i - s.begin] != expect) {
          ADD_FAILURE() << spec.name << " element " << i;
          return compared;
        }
        ++compared;
      }
    }
  }
  return compared;
}

// case.json for tests/fixtures/torch_llama_reference.py, from the fixture's
// own description (not pstar's reading of it).
std::string CaseJson(const nlohmann::json& spec) {
  nlohmann::json rope = {{"theta", spec["theta"]}};
  if (spec["scaling"].get<bool>()) {
    rope.update({{"factor", 8}, {"low_freq_factor", 1}, {"high_freq_factor", 4}, {"original_max", 16}});
  }
  const nlohmann::json j = {{"n_layer", spec["n_layer"]}, {"n_head", spec["n_head"]}, {"n_kv_head", spec["n_kv_head"]},
                            {"head_dim", spec["head_dim"]}, {"norm_eps", spec["eps"]}, {"tied", spec["tied"]},
                            {"rope", rope}, {"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 2},
                            {"steps", kSteps}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8},
                            {"weight_decay", 0.1}, {"grad_clip", 1.0}};
  return j.dump() + "\n";
}

TEST_F(HfFamilyImportTest, ConfigJsonDescribesTheModel) {
  for (const Fixture& f : Fixtures()) {
    SCOPED_TRACE(f.name);
    auto c = Parse(Dir(f.name));
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto hf = ReadHfConfig(Dir(f.name));
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_TRUE(SameDescription(c->model.gpt, hf->model));
    EXPECT_EQ(c->model.gpt.n_layer, f.spec["n_layer"].get<int64_t>());
    EXPECT_EQ(c->model.gpt.kv_heads(), f.spec["n_kv_head"].get<int64_t>());
    EXPECT_EQ(c->model.gpt.tied_embeddings, f.spec["tied"].get<bool>());
    // What --print-config writes reads back as the same config.
    auto again = ParseConfig(ConfigToYaml(*c), "printed");
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_TRUE(SameDescription(again->model.gpt, c->model.gpt));
  }
  // A key that agrees is taken; one that contradicts, or a preset of
  // another model, is refused in one line.
  EXPECT_TRUE(Parse(Dir("llama"), {"model.n_layer=2", "model.architecture=llama", "model.n_kv_head=2"}).ok());
  const auto refused = [&](const std::vector<std::string>& overrides, const std::string& needle) {
    auto c = Parse(Dir("llama"), overrides);
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
    EXPECT_EQ(c.status().message().find('\n'), std::string::npos);
  };
  refused({"model.n_layer=3"}, "test: model.n_layer: is 3 but " + Dir("llama") +
                                   "/config.json has 2 (model.init_from describes the model: leave model.n_layer unset)");
  refused({"model.n_kv_head=4"}, "model.n_kv_head: is 4 but");
  refused({"model.rope_theta=10000"}, "model.rope_theta: is 10000 but");
  refused({"model.architecture=qwen2"}, "model.architecture: is qwen2 but");
  refused({"model.preset=llama-tiny"}, "model.preset: llama-tiny is not the model");
  refused({"model.init_from=" + root_->path() + "/nowhere"}, "model.init_from: " + root_->path() + "/nowhere/config.json");
  // Where the directory is not at hand (the operator), the config must
  // describe the model itself.
  auto blind = ParseConfig(Yaml(Dir("llama")), "spec.config", {}, ConfigOptions{.read_init_from = false});
  ASSERT_FALSE(blind.ok());
  EXPECT_NE(blind.status().message().find("model.init_from: needs model.preset or the model's shape"), std::string::npos)
      << blind.status().message();
}

TEST_F(HfFamilyImportTest, ASlidingWindowShorterThanTheSequenceIsRefused) {
  const std::string dir = root_->path() + "/mistral-window";
  fs::create_directories(dir);
  fs::copy_file(Dir("mistral") + "/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(Dir("mistral") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["sliding_window"] = 8;
  std::ofstream(dir + "/config.json") << j.dump();
  auto c = Parse(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train.seq_len: 11 exceeds the sliding_window 8 that " + dir + "/config.json"),
            std::string::npos)
      << c.status().message();
  EXPECT_TRUE(Parse(dir, {"train.seq_len=8"}).ok()) << "a window the sequence fits in changes nothing";
}

TEST_F(HfFamilyImportTest, ImportsExactlyAndGivesTheFloat64ReferencesLogitsAndLosses) {
  std::vector<VectorTokenSource> sources;
  sources.reserve(3);
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<Config> configs;
  std::vector<std::vector<int32_t>> tokens(3), targets(3);
  std::string dirs;
  const std::vector<Fixture> fixtures = Fixtures();
  for (size_t i = 0; i < fixtures.size(); ++i) {
    const Fixture& f = fixtures[i];
    auto c = Parse(Dir(f.name));
    ASSERT_TRUE(c.ok()) << c.status().message();
    configs.push_back(*c);
    sources.emplace_back(Tokens(size_t(kSteps * kBatch * kSeq + 1), f.spec["vocab"].get<int64_t>()));
    auto t = Trainer::Create(*c, sources.back());
    ASSERT_TRUE(t.ok()) << f.name << ": " << t.status().message();
    auto ref = SafetensorsFile::Read(Reference(f.name));
    ASSERT_TRUE(ref.ok());
    const std::vector<test::WholeTensor> whole = test::WholeTensors((*t)->store(), StateKind::kParam);
    EXPECT_EQ(whole.size(), ref->tensors().size()) << f.name;
    for (const test::WholeTensor& w : whole) {
      ASSERT_TRUE(ref->Has(w.name)) << f.name << ": " << w.name;
      ASSERT_EQ(w.values, *ref->ToFloats(w.name)) << f.name << ": " << w.name << " imported inexactly";
    }
    const std::string dir = root_->path() + "/case-" + f.name;
    fs::create_directories(dir);
    std::ofstream(dir + "/case.json") << CaseJson(f.spec);
    test::WriteTorchCase((*t)->store(), sources.back(), kSteps, kBatch, kSeq, dir, &tokens[i], &targets[i]);
    // The reference reads the fixture's own values, not pstar's import.
    fs::copy_file(Reference(f.name), dir + "/weights.safetensors", fs::copy_options::overwrite_existing);
    dirs += " " + dir;
    trainers.push_back(std::move(*t));
  }
  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/torch_llama_reference.py" + dirs;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (size_t i = 0; i < fixtures.size(); ++i) {
    const Fixture& f = fixtures[i];
    SCOPED_TRACE(f.name);
    auto ref = test::ReadTorchReference(root_->path() + "/case-" + f.name);
    ASSERT_TRUE(ref.has_value());
    ParamStore& store = trainers[i]->store();
    Gpt& model = trainers[i]->model();
    store.ZeroGrads();
    std::vector<float> logits(size_t(kBatch * kSeq * f.spec["vocab"].get<int64_t>()));
    model.TrainForward({tokens[i].data(), targets[i].data()}, 1.0f / float(kBatch * kSeq), logits.data());
    const float loss = float(model.TakeLoss());
    model.Backward();
    auto floor = [](const std::string& name) { return name.find("k_proj.bias") != std::string::npos ? 2e-4 : 1e-5; };
    const double worst = test::ExpectMatchesTorch(*ref, store, logits, loss, floor);
    const std::vector<float> losses = test::TrainFromWeights(configs[i], sources[i], store, kSteps);
    const double trajectory = test::ExpectTrajectoryMatchesTorch(*ref, losses, /*as_float32_is=*/true);
    std::printf("%s (%s, %lld file(s)): float64 worst relative error %.3g (logits and gradients), %.3g (%lld AdamW "
                "losses)\n",
                f.name.c_str(), f.spec["dtype"].get<std::string>().c_str(), (long long)f.spec["shards"].get<int64_t>(),
                worst, trajectory, (long long)kSteps);
  }
}

TEST_F(HfFamilyImportTest, EveryWorldSizeImportsTheSameModel) {
  for (const std::string name : {"llama", "mistral"}) {
    SCOPED_TRACE(name);
    auto ref = SafetensorsFile::Read(Reference(name));
    ASSERT_TRUE(ref.ok());
    auto config = Parse(Dir(name), {"train.batch_size=1"});
    ASSERT_TRUE(config.ok()) << config.status().message();
    VectorTokenSource data(Tokens(500, 64));
    int64_t elements = 0;
    for (int world = 1; world <= 3; ++world) {
      auto comms = test::MakeThreadGroupCommunicators(world);
      std::vector<std::string> errors(static_cast<size_t>(world));
      std::vector<int64_t> checked(static_cast<size_t>(world), 0);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world; ++rank) {
        threads.emplace_back([&, rank] {
          auto t = Trainer::Create(*config, data, comms[size_t(rank)].get());
          if (!t.ok()) {
            errors[size_t(rank)] = t.status().message();
            return;
          }
          checked[size_t(rank)] = ExpectOwnedSlicesAre((*t)->store(), *ref);
          if (rank == 0 && world == 1) {
            for (TensorId id = 0; id < (*t)->store().layout().num_tensors(); ++id) {
              elements += (*t)->store().layout().spec(id).numel();
            }
          }
        });
      }
      for (auto& th : threads) th.join();
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[size_t(r)], "") << "world " << world << " rank " << r;
        EXPECT_GT(checked[size_t(r)], 0) << "world " << world << " rank " << r;
        total += checked[size_t(r)];
      }
      EXPECT_GE(total, elements) << "world " << world << ": every element is some rank's";
    }
  }
}

int64_t StatusKib(const char* field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field)));
  }
  return -1;
}

TEST_F(HfFamilyImportTest, PeakMemoryStaysWithinTheBufferForAModelFarLargerThanIt) {
  // 10.4M parameters: a 21 MB BF16 file, 8 MB of it in one tensor.
  const nlohmann::json spec = {{"architecture", "llama"}, {"seed", 9}, {"n_layer", 6}, {"n_head", 4}, {"n_kv_head", 2},
                               {"hidden", 256}, {"head_dim", 64}, {"intermediate", 1024}, {"vocab", 8192},
                               {"max_positions", 64}, {"theta", 500000.0}, {"eps", 1e-5}, {"tied", false},
                               {"scaling", false}, {"dtype", "BF16"}, {"shards", 1}};
  const std::string dir = root_->path() + "/large", reference = root_->path() + "/large.reference.safetensors";
  Write(spec, dir, reference);
  const int64_t file_bytes = int64_t(fs::file_size(dir + "/model.safetensors"));
  const std::string ckpt = root_->path() + "/large-ckpt";
  auto config = Parse(dir, {"train.batch_size=1", "train.seq_len=8", "checkpoint.dir=" + ckpt});
  ASSERT_TRUE(config.ok()) << config.status().message();
  VectorTokenSource data(Tokens(100, 8192));
  auto t = Trainer::Create(*config, data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ParamStore& store = (*t)->store();
  // Again, measured alone: the store's memory is resident already, so what
  // the peak gains over it is the import's own.
  HfImportOptions options;
  options.staging_elements = 32 << 10;
  const int64_t rss_kib = StatusKib("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak restarts at the current RSS
  ASSERT_LE(StatusKib("VmHWM:") - rss_kib, 256) << "the peak did not restart (clear_refs)";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(ImportHuggingFace(dir, config->model.gpt, store, options).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t growth = (StatusKib("VmHWM:") - rss_kib) << 10;
  std::printf("import of a %.1f MB BF16 file: %.3f s, peak RSS grew %.2f MB (buffer %.2f MB)\n", file_bytes / 1e6,
              seconds, growth / 1e6, HfImportBufferBytes(options) / 1e6);
  EXPECT_LT(growth, HfImportBufferBytes(options) + (int64_t(2) << 20)) << "of a " << file_bytes << "-byte file";
  auto ref = SafetensorsFile::Read(reference);
  ASSERT_TRUE(ref.ok());
  EXPECT_GT(ExpectOwnedSlicesAre(store, *ref), 10000000);

  // The export of its checkpoint, in F32 (42 MB of weights), holds only the
  // writer's block and the checksum pass's.
  ASSERT_TRUE((*t)->SaveCheckpoint().ok());
  HfExportOptions export_options;
  export_options.dtype = Dtype::kF32;
  export_options.max_shard_bytes = 16 << 20;
  const int64_t before_kib = StatusKib("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";
  const auto export_start = std::chrono::steady_clock::now();
  auto e = ExportHuggingFace(ckpt + "/step-00000000", root_->path() + "/large-export", export_options);
  const double export_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - export_start).count();
  ASSERT_TRUE(e.ok()) << e.status().message();
  const int64_t export_growth = (StatusKib("VmHWM:") - before_kib) << 10;
  int64_t written = 0;
  for (const std::string& path : e->weight_paths) written += int64_t(fs::file_size(path));
  std::printf("export of it in F32: %.1f MB in %zu shards, %.3f s, peak RSS grew %.2f MB (buffer %.2f MB)\n",
              written / 1e6, e->weight_paths.size(), export_seconds, export_growth / 1e6, HfExportBufferBytes() / 1e6);
  EXPECT_LT(export_growth, HfExportBufferBytes() + (int64_t(4) << 20)) << "exporting " << written << " bytes";
  EXPECT_GT(written, 40000000);
}

TEST_F(HfFamilyImportTest, MissingUnknownMisshapenAndUntiedTensorsAreOneLineErrors) {
  auto in = SafetensorsFile::Read(Dir("mistral") + "/model.safetensors");
  ASSERT_TRUE(in.ok());
  std::ifstream config_in(Dir("mistral") + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_in);
  int n = 0;
  // A copy of the Mistral directory with one change.
  auto variant = [&](const std::string& drop, const std::string& add, const std::string& reshape, bool tie) {
    const std::string dir = root_->path() + "/bad-" + std::to_string(n++);
    fs::create_directories(dir);
    std::vector<std::vector<float>> keep;
    SafetensorsWriter w;
    for (const auto& [name, tensor] : in->tensors()) {
      if (name == drop) continue;
      keep.push_back(*in->ToFloats(name));
      std::vector<int64_t> shape = tensor.shape;
      if (name == reshape) std::swap(shape[0], shape[1]);
      w.Add(name, Dtype::kF32, shape, keep.back().data());
    }
    std::vector<float> extra(4, 1.0f);
    if (!add.empty()) w.Add(add, Dtype::kF32, {4}, extra.data());
    EXPECT_TRUE(w.Write(dir + "/model.safetensors").ok());
    nlohmann::json c = config;
    if (tie) c["tie_word_embeddings"] = true;
    std::ofstream(dir + "/config.json") << c.dump();
    return dir;
  };
  VectorTokenSource data(Tokens(500, 300));
  const auto refused = [&](const std::string& dir, const std::string& needle) {
    auto c = Parse(dir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto t = Trainer::Create(*c, data);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("model.init_from: ", 0), 0u) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  };
  std::string dir = variant("model.layers.0.mlp.up_proj.weight", "", "", false);
  refused(dir, "model.init_from: " + dir + ": no tensor model.layers.0.mlp.up_proj.weight in the model's files");
  dir = variant("", "model.layers.0.self_attn.rotary.weight", "", false);
  refused(dir, dir + "/model.safetensors: unknown tensor model.layers.0.self_attn.rotary.weight (not part of mistral");
  dir = variant("", "", "model.layers.0.mlp.down_proj.weight", false);
  refused(dir, dir + "/model.safetensors: tensor model.layers.0.mlp.down_proj.weight has shape [48, 32], the model "
                     "needs [32, 48]");
  // Tied in config.json, but the file's head is another tensor.
  dir = variant("", "", "", true);
  refused(dir, "lm_head.weight differs from model.embed_tokens.weight but config.json ties them");
}


// Every tensor of directory `got` holds the same bits as `want`'s.
void ExpectSameWeights(const std::string& got, const std::string& want, size_t tensors) {
  auto a = HfWeights::Open(got);
  auto b = HfWeights::Open(want);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->tensors().size(), tensors);
  std::vector<uint16_t> staging(1000);
  for (const auto& [name, t] : a->tensors()) {
    const HfWeights::Tensor* u = b->Find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(t.dtype, u->dtype) << name;
    ASSERT_EQ(t.shape, u->shape) << name;
    std::vector<float> x(size_t(t.numel)), y(size_t(t.numel));
    ASSERT_TRUE(a->ReadFloats(name, 0, t.numel, x.data(), staging).ok());
    ASSERT_TRUE(b->ReadFloats(name, 0, t.numel, y.data(), staging).ok());
    // The 16-bit values widen exactly: equal bits as floats are equal bits.
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name;
  }
}

TEST_F(HfFamilyImportTest, ImportThenExportInTheSameDtypeIsBitExactInShardsOfTheSizeAsked) {
  for (const Fixture& f : Fixtures()) {
    SCOPED_TRACE(f.name);
    const std::string ckpt = root_->path() + "/roundtrip-ckpt-" + f.name, out = root_->path() + "/roundtrip-" + f.name;
    auto c = Parse(Dir(f.name), {"checkpoint.dir=" + ckpt});
    ASSERT_TRUE(c.ok()) << c.status().message();
    VectorTokenSource data(Tokens(500, f.spec["vocab"].get<int64_t>()));
    auto t = Trainer::Create(*c, data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE((*t)->SaveCheckpoint().ok());
    const std::string dtype = f.spec["dtype"].get<std::string>();
    HfExportOptions options;
    options.dtype = dtype == "BF16" ? Dtype::kBF16 : dtype == "F16" ? Dtype::kF16 : Dtype::kF32;
    options.max_shard_bytes = 6000;
    // A previous export's shards that this one does not name go.
    fs::create_directories(out);
    std::ofstream(out + "/model-00042-of-00099.safetensors") << "stale";
    auto e = ExportHuggingFace(ckpt + "/step-00000000", out, options);
    ASSERT_TRUE(e.ok()) << e.status().message();
    const size_t tensors = GptVisibleTensorSpecs(c->model.gpt).size();
    ExpectSameWeights(out, Dir(f.name), tensors);
    EXPECT_FALSE(fs::exists(out + "/model-00042-of-00099.safetensors"));
    EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
    ASSERT_GT(e->weight_paths.size(), 2u);
    std::ifstream index_in(e->index_path);
    const nlohmann::json index = nlohmann::json::parse(index_in);
    EXPECT_EQ(index["weight_map"].size(), tensors);
    std::set<std::string> files;
    std::map<std::string, int> tensors_in;
    for (const auto& [name, file] : index["weight_map"].items()) {
      files.insert(file.get<std::string>());
      ++tensors_in[file.get<std::string>()];
    }
    EXPECT_EQ(files.size(), e->weight_paths.size());
    for (const std::string& path : e->weight_paths) {
      const std::string name = fs::path(path).filename().string();
      EXPECT_TRUE(files.count(name)) << name;
      // Only a tensor larger than the shard size has a larger shard, alone.
      if (tensors_in[name] > 1) {
        EXPECT_LE(int64_t(fs::file_size(path)), 6000 + 4096) << name << ": over the shard size (with its header)";
      }
      char of[32];
      std::snprintf(of, sizeof(of), "-of-%05zu.safetensors", files.size());
      EXPECT_EQ(name.substr(name.size() - std::strlen(of)), of) << name;
    }
    // Its config.json describes the same model, in the dtype written.
    auto hf = ReadHfConfig(out);
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_TRUE(SameDescription(hf->model, c->model.gpt));
    std::ifstream config_in(out + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(config_in)["torch_dtype"],
              dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32");
    // One shard when the size allows: model.safetensors alone, the index gone.
    options.max_shard_bytes = int64_t(1) << 30;
    auto one = ExportHuggingFace(ckpt + "/step-00000000", out, options);
    ASSERT_TRUE(one.ok()) << one.status().message();
    EXPECT_EQ(one->weight_paths, std::vector<std::string>{out + "/model.safetensors"});
    EXPECT_TRUE(one->index_path.empty());
    EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(e->weight_paths[0]));
    ExpectSameWeights(out, Dir(f.name), tensors);
  }
}

TEST_F(HfFamilyImportTest, ATrainedExportGivesPstarsLogitsInTheReference) {
  const std::string ckpt = root_->path() + "/trained-ckpt";
  VectorTokenSource data(Tokens(500, 90));
  std::vector<float> logits;
  std::vector<int32_t> tokens, targets;
  const std::string batches = root_->path() + "/trained-batches";
  fs::create_directories(batches);
  {
    auto c = Parse(Dir("llama"), {"checkpoint.dir=" + ckpt, "train.steps=3"});
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto t = Trainer::Create(*c, data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    for (int s = 0; s < 3; ++s) ASSERT_TRUE((*t)->Step().ok());
    ASSERT_TRUE((*t)->SaveCheckpoint().ok());
    test::WriteTorchCase((*t)->store(), data, 1, kBatch, kSeq, batches, &tokens, &targets);
    logits.resize(size_t(kBatch * kSeq * 90));
    (*t)->model().Forward({tokens.data(), targets.data()}, logits.data());
    (void)(*t)->model().TakeLoss();
  }
  HfExportOptions options;
  options.dtype = Dtype::kF32;
  options.max_shard_bytes = 20000;
  const std::string out = root_->path() + "/trained";
  auto e = ExportHuggingFace(ckpt + "/step-00000003", out, options);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_GE(e->weight_paths.size(), 3u);
  const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/tests/fixtures/hf_dir_logits.py " + out + " " +
                          batches + "/batches.safetensors " + batches + "/logits.safetensors";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ref = SafetensorsFile::Read(batches + "/logits.safetensors");
  ASSERT_TRUE(ref.ok());
  const double error = test::RelativeError(logits.data(), *ref->ToDoubles("logits"));
  std::printf("Llama trained 3 steps, exported in %zu F32 shards, read back by the float64 reference: logits "
              "relative error %.3g\n", e->weight_paths.size(), error);
  EXPECT_LT(error, 1e-5);
}

TEST_F(HfFamilyImportTest, ACheckpointOfAnyWorldSizeExportsTheSameFiles) {
  VectorTokenSource data(Tokens(500, 300));
  std::vector<std::vector<std::string>> exported;
  for (int world = 1; world <= 3; world += 2) {
    const std::string ckpt = root_->path() + "/world-ckpt-" + std::to_string(world);
    auto c = Parse(Dir("mistral"), {"checkpoint.dir=" + ckpt, "train.batch_size=1"});
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto comms = test::MakeThreadGroupCommunicators(world);
    std::vector<std::string> errors(static_cast<size_t>(world));
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        auto t = Trainer::Create(*c, data, comms[size_t(r)].get());
        Status s = t.ok() ? (*t)->SaveCheckpoint() : t.status();
        if (!s.ok()) errors[size_t(r)] = s.message();
      });
    }
    for (auto& th : ranks) th.join();
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world))) << "world " << world;
    HfExportOptions options;
    options.max_shard_bytes = 10000;  // BF16, the family's default
    auto e = ExportHuggingFace(ckpt + "/step-00000000", root_->path() + "/world-" + std::to_string(world), options);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ(e->dtype, Dtype::kBF16);
    exported.emplace_back();
    for (const std::string& path : e->weight_paths) exported.back().push_back(*ReadFile(path));
    exported.back().push_back(*ReadFile(e->index_path));
    exported.back().push_back(*ReadFile(e->config_path));
  }
  ASSERT_EQ(exported[0].size(), exported[1].size());
  for (size_t i = 0; i < exported[0].size(); ++i) {
    EXPECT_TRUE(exported[0][i] == exported[1][i]) << "file " << i << " differs between 1 and 3 ranks";
  }
}

TEST_F(HfFamilyImportTest, TheDirectorysTokenizerAndConfigTravelThroughCheckpointsIntoTheExport) {
  // A Mistral v0.1-style directory: a sliding window the run's sequences fit
  // in, token ids, a chat template, SentencePiece's model.
  const std::string dir = root_->path() + "/mistral-tokenizer";
  fs::create_directories(dir);
  fs::copy_file(Dir("mistral") + "/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(Dir("mistral") + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["sliding_window"] = 4096;
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  config["transformers_version"] = "4.44.0";
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": []})"},
      {"tokenizer_config.json", R"({"chat_template": "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}", "eos_token": "</s>"})"},
      {"generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 32768], "do_sample": true})"},
      {"tokenizer.model", std::string("\x0a\x05\x0a\x01\x61\x15\x00\x00\x80\x3f\x00binary", 17)},
      {"special_tokens_map.json", R"({"bos_token": "<s>", "eos_token": "</s>"})"}};
  for (const auto& [name, text] : files) std::ofstream(dir + "/" + name, std::ios::binary) << text;
  // A file that does not travel.
  std::ofstream(dir + "/README.md") << "# a model card\n";

  const std::string ckpt = root_->path() + "/tokenizer-ckpt";
  auto c = Parse(dir, {"checkpoint.dir=" + ckpt});
  ASSERT_TRUE(c.ok()) << c.status().message();
  VectorTokenSource data(Tokens(500, 300));
  {
    auto t = Trainer::Create(*c, data);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE((*t)->Step().ok());
    ASSERT_TRUE((*t)->SaveCheckpoint().ok());
  }
  const std::string out = root_->path() + "/tokenizer-export";
  auto e = ExportHuggingFace(ckpt + "/step-00000001", out);
  ASSERT_TRUE(e.ok()) << e.status().message();
  for (const auto& [name, text] : files) {
    auto got = ReadFile(out + "/" + name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_TRUE(*got == text) << name << " did not travel as it was";
  }
  EXPECT_EQ(e->carried_paths.size(), files.size() - 1) << "generation_config.json is counted apart";
  EXPECT_FALSE(fs::exists(out + "/README.md"));
  std::ifstream exported_in(out + "/config.json");
  const nlohmann::json exported = nlohmann::json::parse(exported_in);
  EXPECT_EQ(exported["sliding_window"], 4096) << "what pstar does not describe stays the publisher's";
  EXPECT_EQ(exported["eos_token_id"], 2);
  EXPECT_EQ(exported["transformers_version"], "4.44.0");
  EXPECT_EQ(exported["torch_dtype"], "bfloat16") << "what pstar wrote is the run's";
  EXPECT_EQ(exported["num_key_value_heads"], 2);
  // A carried file damaged in the checkpoint fails the export, naming it.
  std::ofstream(ckpt + "/step-00000001/hf.tokenizer.json", std::ios::app) << " ";
  auto damaged = ExportHuggingFace(ckpt + "/step-00000001", root_->path() + "/tokenizer-export-2");
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("hf.tokenizer.json: size or checksum differs from the manifest's"),
            std::string::npos)
      << damaged.status().message();
}

}  // namespace
}  // namespace pstar
