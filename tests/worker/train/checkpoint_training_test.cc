// Stop and resume through sharded checkpoints: bit-identical with one rank,
// across a change of world size within reduction-order rounding, and past a
// damaged newest checkpoint with a warning.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/safetensors.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

struct TrainRun {
  std::vector<float> losses;  // of the steps this run took
  std::vector<std::string> names;  // of the tensors, in tensor order
  // The last step's gradients (as the optimizer read them), and the state after it.
  std::vector<std::vector<float>> params, grads, exp_avg_sq;
};

TrainRun Collect(Trainer& t, std::vector<float> losses) {
  TrainRun r;
  r.losses = std::move(losses);
  for (TensorId id = 0; id < t.store().layout().num_tensors(); ++id) r.names.push_back(t.store().layout().spec(id).name);
  r.params = test::TensorCopies(t.store(), StateKind::kParam);
  r.grads = test::TensorCopies(t.store(), StateKind::kGrad);
  r.exp_avg_sq = test::TensorCopies(t.store(), StateKind::kExpAvgSq);
  return r;
}

// Trains one rank from `from` (resuming when > 0) up to `to` steps.
TrainRun TrainOneRank(const Config& c, const TokenSource& data, int64_t from, int64_t to, bool save) {
  auto t = Trainer::Create(c, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (from > 0) {
    std::vector<std::string> warnings;
    auto resumed = (*t)->Resume(&warnings);
    EXPECT_TRUE(resumed.ok()) << resumed.status().message();
    EXPECT_EQ(*resumed, from);
    EXPECT_TRUE(warnings.empty());
  }
  std::vector<float> losses;
  for (int64_t s = from; s < to; ++s) {
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok());
    losses.push_back(st->loss);
    if (save) {
      EXPECT_TRUE((*t)->SaveCheckpoint().ok());
    }
  }
  return Collect(**t, losses);
}

// The resumed steps 3..6 are those of the uninterrupted run, bit for bit.
void ExpectContinues(const TrainRun& resumed, const TrainRun& whole) {
  ASSERT_EQ(resumed.losses.size(), 3u);
  EXPECT_EQ(0, std::memcmp(resumed.losses.data(), whole.losses.data() + 3, 3 * sizeof(float)));
  for (size_t i = 0; i < whole.params.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(resumed.params[i].data(), whole.params[i].data(), whole.params[i].size() * 4)) << i;
    ASSERT_EQ(0, std::memcmp(resumed.exp_avg_sq[i].data(), whole.exp_avg_sq[i].data(),
                             whole.exp_avg_sq[i].size() * 4))
        << i;
  }
}

TEST(CheckpointTraining, StopAndResumeIsBitIdentical) {
  test::TempDir dir("resume");
  auto data = test::RandomTokens(4000, 40, 31);
  const Config plain = test::TinyGptConfig({"train.steps=6", "default_chunk_size=1024"});
  const Config saving = test::TinyGptConfig({"train.steps=6", "default_chunk_size=1024",
                                             "checkpoint.dir=" + dir.path()});
  const TrainRun whole = TrainOneRank(plain, data, 0, 6, false);
  // The first half saves under a tight device budget (chunks move), the
  // second half resumes with everything resident: neither changes the numbers.
  Config first = saving;
  first.runtime.device_memory = PlanMemory(saving)->min_device_bytes;
  TrainOneRank(first, data, 0, 3, true);
  ExpectContinues(TrainOneRank(saving, data, 3, 6, false), whole);
}

// Trains `job` for 6 steps in one run, then saves at step 3 under one device
// budget and resumes under another: with part of the chunks' optimizer state
// homed on the device (copied out through the checkpoint's device copier),
// and with none there, each way round. The resumed steps continue bit for bit.
void ExpectResumeUnderAnotherPlacement(const std::vector<std::string>& job, const TokenSource& data) {
  const TrainRun whole = TrainOneRank(test::TinyGptConfig(job), data, 0, 6, false);
  auto plan = PlanMemory(test::TinyGptConfig(job));
  ASSERT_TRUE(plan.ok());
  const int64_t mixed = plan->activation_bytes + plan->model_bytes / 2;
  const int64_t minimum = plan->min_device_bytes;
  for (auto [save_budget, resume_budget] : {std::pair{mixed, minimum}, std::pair{minimum, mixed}}) {
    test::TempDir dir("placement");
    std::vector<std::string> o = job;
    o.push_back("checkpoint.dir=" + dir.path());
    Config first = test::TinyGptConfig(o);
    Config second = first;
    first.runtime.device_memory = save_budget;
    second.runtime.device_memory = resume_budget;
    auto homed = PlanMemory(save_budget == mixed ? first : second);
    ASSERT_TRUE(homed.ok());
    ASSERT_GT(homed->device_adam_chunks, 0);
    ASSERT_LT(homed->device_adam_chunks, homed->num_chunks);
    TrainOneRank(first, data, 0, 3, true);
    ExpectContinues(TrainOneRank(second, data, 3, 6, false), whole);
  }
}

TEST(CheckpointTraining, MomentsHomedOnTheDeviceSaveAndResumeUnderAnotherPlacement) {
  // Part of the moments live only on the device, then every moment is homed
  // on the host, and the reverse: the same numbers as one run.
  ExpectResumeUnderAnotherPlacement({"train.steps=6", "default_chunk_size=1024"},
                                    test::RandomTokens(4000, 40, 32));
}

TEST(CheckpointTraining, SixteenBitParamChunksSaveTheirFp32MastersAndResumeUnderAnotherPlacement) {
  // bf16 with 16-bit gradient homes: params stream in 16 bits, the masters
  // (some homed on the device beside their moments) are what is saved.
  const std::vector<std::string> job = {"train.steps=6", "default_chunk_size=1024", "train.precision=bf16",
                                        "train.grad_precision=16bit"};
  auto plan = PlanMemory(test::TinyGptConfig(job));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->param_device, "bf16");
  ExpectResumeUnderAnotherPlacement(job, test::RandomTokens(4000, 40, 33));
}

// The invariants every decoder keeps, on the tiny GPT-2 and Llama jobs.
using CheckpointTrainingFamilies = test::TinyFamilyTest;
INSTANTIATE_TEST_SUITE_P(Decoders, CheckpointTrainingFamilies, testing::ValuesIn(test::TinyFamilies()),
                         test::TinyFamilyName);

TEST_P(CheckpointTrainingFamilies, ResumesWithAnotherWorldSize) {
  test::TempDir dir("reshard");
  auto data = Tokens(4000, 32);
  const TrainRun whole = TrainOneRank(Job({"train.steps=6", "train.batch_size=4"}), data, 0, 6, false);
  // Two ranks (batch 2 each) train three steps and save ...
  const Config two = Job({"train.steps=6", "train.batch_size=2", "checkpoint.dir=" + dir.path()});
  auto comms = test::MakeThreadGroupCommunicators(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto t = Trainer::Create(two, data, comms[size_t(r)].get());
      ASSERT_TRUE(t.ok()) << t.status().message();
      for (int s = 0; s < 3; ++s) ASSERT_TRUE((*t)->Step().ok());
      Status saved = (*t)->SaveCheckpoint();
      EXPECT_TRUE(saved.ok()) << saved.message();
    });
  }
  for (auto& th : ranks) th.join();
  // ... and one rank (batch 4) finishes the run.
  const Config one = Job({"train.steps=6", "train.batch_size=4", "checkpoint.dir=" + dir.path()});
  const TrainRun resumed = TrainOneRank(one, data, 3, 6, false);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(resumed.losses[size_t(s)], whole.losses[size_t(3 + s)], 1e-4) << s;
}

// A Llama checkpoint resumes only into the model that wrote it: another
// rope_theta (no tensor shape shows it) is refused in one line; the manifest
// records the description, and `pstar sample` builds the model from it.
TEST(CheckpointTraining, ALlamaCheckpointRecordsItsDescriptionAndRefusesAnother) {
  test::TempDir dir("llama-ckpt");
  auto data = test::RandomTokens(4000, 40, 33);
  const Config c = test::TinyLlamaConfig({"train.steps=2", "checkpoint.dir=" + dir.path()});
  TrainOneRank(c, data, 0, 2, true);
  auto manifest = ReadManifest(dir.path() + "/" + StepDirName(2));
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  EXPECT_TRUE(SameDescription(manifest->state.model, c.model.gpt));
  EXPECT_EQ(manifest->state.model.architecture, Architecture::kLlama);
  EXPECT_TRUE(manifest->state.model.rope_scaling.llama3);
  const Config other = test::TinyLlamaConfig({"train.steps=3", "model.rope_theta=20000", "checkpoint.dir=" + dir.path()});
  auto t = Trainer::Create(other, data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto resumed = (*t)->Resume(nullptr);
  ASSERT_FALSE(resumed.ok());
  EXPECT_NE(resumed.status().message().find("written for a different model"), std::string::npos)
      << resumed.status().message();
  EXPECT_EQ(resumed.status().message().find('\n'), std::string::npos);
}

TEST(CheckpointTraining, ADamagedNewestCheckpointFallsBackToThePreviousOne) {
  test::TempDir dir("damaged");
  auto data = test::RandomTokens(4000, 40, 33);
  const Config c = test::TinyGptConfig({"train.steps=6", "checkpoint.dir=" + dir.path()});
  TrainOneRank(c, data, 0, 3, true);  // checkpoints of steps 1, 2, 3
  // Flip one byte in the middle of the newest checkpoint's tensor data.
  const std::string file = dir.path() + "/step-00000003/rank-00000.safetensors";
  ASSERT_TRUE(std::filesystem::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = f.tellg();
    f.seekg(size / 2);
    char b = 0;
    f.read(&b, 1);
    b = char(b ^ 0x10);
    f.seekp(size / 2);
    f.write(&b, 1);
  }
  auto t = Trainer::Create(c, data);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> warnings;
  auto resumed = (*t)->Resume(&warnings);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(*resumed, 2);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("rank-00000.safetensors"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace pstar

namespace pstar {
namespace {

// ||a - b|| / ||b|| over elements [begin, end) of both (b may be shorter than a:
// a padded tensor against its unpadded twin).
double RelativeL2(const std::vector<float>& a, const std::vector<float>& b, size_t begin, size_t end) {
  double num = 0, den = 0;
  for (size_t i = begin; i < end; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double L2(const std::vector<float>& a, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += double(a[i]) * a[i];
  return std::sqrt(sum);
}

constexpr int64_t kTinyEmbd = 16;  // n_embd of test::kTinyGptJob

// The k third of a block's c_attn.bias adds q.b_k to every score of a query's
// row, a shift the row's softmax ignores: in exact arithmetic its gradient is
// zero and it never moves, whatever it holds. What it gets is rounding noise,
// whose size depends on the CPU's kernels (ours, and OpenBLAS's, which picks
// its own by CPU), and Adam turns that noise into steps of up to lr: two runs
// that round differently part there by amounts no bound on the rest of the
// model predicts. Such elements are judged by what they are instead: their
// gradient is noise beside the q third's. Returns the elements [begin, end)
// of tensor `name` that only shift a softmax row (empty if none).
std::pair<size_t, size_t> ShiftOnlyElements(const std::string& name) {
  if (name.ends_with(".attn.c_attn.bias")) return {size_t(kTinyEmbd), size_t(2 * kTinyEmbd)};
  return {0, 0};
}

// The shift-only elements' gradient, in every block, is rounding noise: at
// most 1e-3 of the q third's (fp32 rounding leaves it near 1e-7 of it on any
// CPU; a real gradient is of the q third's size).
::testing::AssertionResult ShiftOnlyGradientsAreNoise(const TrainRun& run) {
  int blocks = 0;
  for (size_t i = 0; i < run.names.size(); ++i) {
    const auto [begin, end] = ShiftOnlyElements(run.names[i]);
    if (begin == end) continue;
    ++blocks;
    const double noise = L2(run.grads[i], begin, end), q = L2(run.grads[i], 0, begin);
    if (!(q > 0) || noise > 1e-3 * q) {
      return ::testing::AssertionFailure() << run.names[i] << ": the k third's gradient has norm " << noise
                                           << " against the q third's " << q;
    }
  }
  if (blocks == 0) return ::testing::AssertionFailure() << "no c_attn.bias among the tensors";
  return ::testing::AssertionSuccess();
}

// The same loss at every step, to fp32 rounding.
::testing::AssertionResult SameLosses(const TrainRun& a, const TrainRun& b) {
  if (a.losses.size() != b.losses.size()) return ::testing::AssertionFailure() << "the runs took other steps";
  for (size_t s = 0; s < b.losses.size(); ++s) {
    if (!(std::fabs(a.losses[s] - b.losses[s]) <= 1e-5 * b.losses[s])) {
      return ::testing::AssertionFailure() << "step " << s << ": loss " << a.losses[s] << " against " << b.losses[s];
    }
  }
  return ::testing::AssertionSuccess();
}

// Every parameter the same to fp32 rounding (relative 1e-5: a padded and an
// unpadded vocabulary give the GEMMs other shapes; AVX2 and AVX-512 kernels
// part at 3e-7), but for the shift-only elements, whose gradients must be
// noise in both. Only the first b.size() elements of a's tensors are compared
// (b unpadded, a padded).
::testing::AssertionResult SameParams(const TrainRun& a, const TrainRun& b) {
  if (a.params.size() != b.params.size()) return ::testing::AssertionFailure() << "the runs have other tensors";
  for (size_t i = 0; i < b.params.size(); ++i) {
    const auto [begin, end] = ShiftOnlyElements(b.names[i]);
    const std::vector<float>& x = a.params[i];
    const std::vector<float>& y = b.params[i];
    const double d = std::max(RelativeL2(x, y, 0, begin), RelativeL2(x, y, end, y.size()));
    if (!(d <= 1e-5)) return ::testing::AssertionFailure() << b.names[i] << ": relative L2 difference " << d;
  }
  if (auto noise = ShiftOnlyGradientsAreNoise(a); !noise) return noise;
  return ShiftOnlyGradientsAreNoise(b);
}

::testing::AssertionResult SameModel(const TrainRun& a, const TrainRun& b) {
  if (auto losses = SameLosses(a, b); !losses) return losses;
  return SameParams(a, b);
}

TEST(CheckpointTraining, PaddedVocabularyTrainsAsUnpaddedAndSavesNoPadding) {
  auto data = test::RandomTokens(4000, 40, 33);
  test::TempDir padded_dir("padded"), unpadded_dir("unpadded"), export_dir("padded-export");
  Config padded = test::TinyGptConfig({"train.steps=6", "checkpoint.dir=" + padded_dir.path()});
  Config unpadded =
      test::TinyGptConfig({"train.steps=6", "checkpoint.keep=0", "checkpoint.dir=" + unpadded_dir.path()});
  unpadded.model.gpt.vocab_multiple = 1;
  ASSERT_EQ(padded.model.gpt.padded_vocab_size(), 64);

  const TrainRun p = TrainOneRank(padded, data, 0, 6, true);
  const TrainRun u = TrainOneRank(unpadded, data, 0, 6, true);
  EXPECT_TRUE(SameModel(p, u));

  // The padding rows (wte is tensor 0) are zero in every state.
  auto t = Trainer::Create(padded, data);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> warnings;
  ASSERT_TRUE((*t)->Resume(&warnings).ok());
  ASSERT_TRUE((*t)->Step().ok());
  for (StateKind kind : {StateKind::kParam, StateKind::kGrad, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    const std::vector<float> wte = test::TensorCopies((*t)->store(), kind)[0];
    ASSERT_EQ(wte.size(), size_t(64 * 16));
    for (size_t e = 40 * 16; e < wte.size(); ++e) ASSERT_EQ(wte[e], 0.0f) << "kind " << int(kind) << " element " << e;
  }

  // What users keep: 40 rows in the checkpoint's pieces and in the export.
  auto header = SafetensorsHeader::Read(padded_dir.path() + "/step-00000006/rank-00000.safetensors");
  ASSERT_TRUE(header.ok()) << header.status().message();
  for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
    const std::string piece = std::string(kind) + "/transformer.wte.weight@0";
    ASSERT_TRUE(header->tensors.count(piece)) << piece;
    EXPECT_EQ(header->tensors.at(piece).shape, (std::vector<int64_t>{40 * 16})) << piece;
  }
  ASSERT_TRUE(ExportHuggingFace(padded_dir.path() + "/step-00000006", export_dir.path()).ok());
  auto exported = SafetensorsFile::Read(export_dir.path() + "/model.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  EXPECT_EQ(exported->tensors().at("transformer.wte.weight").shape, (std::vector<int64_t>{40, 16}));

  // The unpadded run's step-3 checkpoint resumes in a padded run, which then
  // continues as the padded run did.
  std::filesystem::remove_all(unpadded_dir.path() + "/step-00000006");
  std::filesystem::remove_all(unpadded_dir.path() + "/step-00000005");
  std::filesystem::remove_all(unpadded_dir.path() + "/step-00000004");
  test::WriteText(unpadded_dir.path() + "/latest", "step-00000003\n");
  Config resume = padded;
  resume.checkpoint.dir = unpadded_dir.path();
  const TrainRun r = TrainOneRank(resume, data, 3, 6, false);
  TrainRun p_last3 = p;
  p_last3.losses.erase(p_last3.losses.begin(), p_last3.losses.begin() + 3);
  EXPECT_TRUE(SameModel(r, p_last3));
}

// The comparison catches a real difference. A vocabulary of 41 padded to 64
// whose row 40 starts at zero is the padded model with one padding row leaking
// into the softmax (the data holds only ids below 40): its losses and its
// parameters both part from the unpadded model's. And a k third of c_attn.bias
// given a real gradient (the q third's) is not taken for noise.
TEST(CheckpointTraining, APaddingRowInTheSoftmaxFailsTheComparison) {
  auto data = test::RandomTokens(4000, 40, 33);
  Config unpadded = test::TinyGptConfig({"train.steps=6"});
  unpadded.model.gpt.vocab_multiple = 1;
  const TrainRun u = TrainOneRank(unpadded, data, 0, 6, false);

  const Config leaky_config = test::TinyGptConfig({"train.steps=6", "model.vocab_size=41"});
  ASSERT_EQ(leaky_config.model.gpt.padded_vocab_size(), 64);
  auto t = Trainer::Create(leaky_config, data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  float* wte = (*t)->store().TensorData(StateKind::kParam, 0);
  std::fill(wte + 40 * kTinyEmbd, wte + 41 * kTinyEmbd, 0.0f);
  std::vector<float> losses;
  for (int s = 0; s < 6; ++s) {
    auto st = (*t)->Step();
    ASSERT_TRUE(st.ok());
    losses.push_back(st->loss);
  }
  const TrainRun leaky = Collect(**t, losses);
  EXPECT_FALSE(SameLosses(leaky, u));
  EXPECT_FALSE(SameParams(leaky, u));
  EXPECT_TRUE(ShiftOnlyGradientsAreNoise(leaky));  // the leak shifts no score

  TrainRun real_gradient = u;
  std::vector<float>& g = real_gradient.grads[5];
  ASSERT_EQ(real_gradient.names[5], "transformer.h.0.attn.c_attn.bias");
  std::copy(g.begin(), g.begin() + kTinyEmbd, g.begin() + kTinyEmbd);
  EXPECT_FALSE(ShiftOnlyGradientsAreNoise(real_gradient));
  EXPECT_FALSE(SameParams(u, real_gradient));
}

}  // namespace
}  // namespace pstar
