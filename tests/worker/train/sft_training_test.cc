// Fine-tuning on packed examples (data.source jsonl's rows): the loss is the
// mean over the step's counted targets on every micro-batch and rank, so the
// gradients and the AdamW trajectory equal a float64 PyTorch reference that
// packs the same examples itself, at accumulation 1 and 2 and at 1 and 2
// ranks; and a packed row gives each of its examples what it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/model/torch_match.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/data/packed_rows.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

constexpr int64_t kSeq = 24, kVocab = 150, kRowsPerStep = 4, kSteps = 4;

// Examples of random ids with random prompt/answer turns: what the chat
// formats give (the first id a document start, each answer counted), some
// longer than a row.
std::vector<TokenizedExample> RandomExamples(std::mt19937_64& rng, int n) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<TokenizedExample> out;
  for (int e = 0; e < n; ++e) {
    TokenizedExample x;
    x.line = e + 1;
    const int64_t len = e == 0 ? kSeq + 9 : pick(3, kSeq);  // the first one is cut to the row
    x.ids.push_back(1);
    x.counted.push_back(0);
    bool answer = false;
    while (int64_t(x.ids.size()) < len) {
      for (int64_t k = pick(1, 6); k > 0 && int64_t(x.ids.size()) < len; --k) {
        x.ids.push_back(int32_t(pick(2, kVocab - 1)));
        x.counted.push_back(answer ? 1 : 0);
      }
      answer = !answer;
    }
    x.counted.back() = 1;  // every example counts something
    out.push_back(std::move(x));
  }
  return out;
}

Config SftConfig(int64_t batch, int64_t accum) {
  return test::TinyLlamaConfig({"model.max_seq_len=" + std::to_string(kSeq), "train.seq_len=" + std::to_string(kSeq),
                                "train.batch_size=" + std::to_string(batch),
                                "train.grad_accum_steps=" + std::to_string(accum),
                                "train.steps=" + std::to_string(kSteps), "train.eval_batches=" + std::to_string(accum),
                                "optimizer.params.lr=0.003", "train.warmup_steps=2", "train.min_lr=0.0003"});
}

std::string CaseJson(const Config& c, uint64_t seed) {
  const GptConfig& g = c.model.gpt;
  nlohmann::json j = {{"n_layer", g.n_layer},
                      {"n_head", g.n_head},
                      {"n_kv_head", g.kv_heads()},
                      {"head_dim", g.head_size()},
                      {"norm_eps", g.norm_eps},
                      {"tied", g.tied_embeddings},
                      {"rope",
                       {{"theta", g.rope_theta},
                        {"factor", 4},
                        {"low_freq_factor", 1},
                        {"high_freq_factor", 4},
                        {"original_max", 8}}},
                      {"lr", 0.003},
                      {"min_lr", 0.0003},
                      {"warmup_steps", 2},
                      {"steps", kSteps},
                      {"beta1", 0.9},
                      {"beta2", 0.95},
                      {"eps", 1e-8},
                      {"weight_decay", 0.1},
                      {"grad_clip", 1.0},
                      {"seq", kSeq},
                      {"seed", seed},
                      {"pad", 0},
                      {"rows_per_step", kRowsPerStep},
                      {"overlong_truncate", true}};
  return j.dump();
}

struct WorldRun {
  std::vector<float> losses;
  double val_loss = 0;
  std::vector<std::vector<float>> params;  // rank 0's whole tensors after training (world 1 only)
  std::string error;
};

// kSteps steps of `world` ranks with accumulation `accum` over `rows`.
WorldRun Train(const PackedRows& rows, int world, int64_t accum) {
  const Config config = SftConfig(kRowsPerStep / (world * accum), accum);
  auto comms = test::MakeThreadGroupCommunicators(world);
  WorldRun result;
  std::mutex mu;
  auto run = [&](int rank) {
    auto t = Trainer::Create(config, rows, comms[size_t(rank)].get());
    std::string error;
    std::vector<float> losses;
    double val = 0;
    if (!t.ok()) error = t.status().message();
    if (t.ok()) {
      Status s = (*t)->SetValidationData(rows);
      auto v = s.ok() ? (*t)->Evaluate() : Result<double>(s);
      if (!v.ok()) error = v.status().message();
      if (v.ok()) val = *v;
      for (int64_t k = 0; k < kSteps && error.empty(); ++k) {
        auto st = (*t)->Step();
        if (!st.ok()) error = st.status().message();
        if (st.ok()) losses.push_back(st->loss);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!error.empty()) result.error = error;
    if (rank == 0) {
      result.losses = losses;
      result.val_loss = val;
      if (world == 1 && t.ok()) {
        for (const test::WholeTensor& w : test::WholeTensors((*t)->store(), StateKind::kParam)) {
          result.params.push_back(w.values);
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(run, r);
  for (auto& th : threads) th.join();
  return result;
}

TEST(SftTorchMatch, MaskedLossGradientsAndTrajectoryMatchFloat64AtAnyAccumulationAndWorld) {
  const uint64_t seed = test::RunSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  std::mt19937_64 rng(seed);
  const std::vector<TokenizedExample> examples = RandomExamples(rng, 18);
  const uint64_t data_seed = SftConfig(kRowsPerStep, 1).data.seed;
  auto rows = PackedRows::Pack(examples, kSeq, OverlongPolicy::kTruncate, data_seed, 0);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_GE(rows->rows(), kRowsPerStep);

  // The initial weights (the seed's, the same at every world size) for the reference.
  auto first = Trainer::Create(SftConfig(kRowsPerStep, 1), *rows);
  ASSERT_TRUE(first.ok()) << first.status().message();
  test::TempDir dir("sft_torch");
  SafetensorsWriter weights;
  const std::vector<test::WholeTensor> initial = test::WholeTensors((*first)->store(), StateKind::kParam);
  for (const test::WholeTensor& w : initial) weights.Add(w.name, Dtype::kF32, w.shape, w.values.data());
  ASSERT_TRUE(weights.Write(dir.path() + "/weights.safetensors").ok());
  nlohmann::json ex = nlohmann::json::array();
  for (const TokenizedExample& e : examples) ex.push_back({{"line", e.line}, {"ids", e.ids}, {"counted", e.counted}});
  std::ofstream(dir.path() + "/examples.json") << ex.dump();
  std::ofstream(dir.path() + "/case.json") << CaseJson(SftConfig(kRowsPerStep, 1), data_seed);
  test::ProcessResult py = test::RunProcess(
      {"/usr/bin/python3", test::SourceDir() + "/tests/fixtures/torch_sft_reference.py", dir.path()});
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;

  // The reference packed the same rows.
  auto ref_rows = SafetensorsFile::Read(dir.path() + "/rows.safetensors");
  ASSERT_TRUE(ref_rows.ok()) << ref_rows.status().message();
  const std::vector<double> rt = *ref_rows->ToDoubles("tokens"), rg = *ref_rows->ToDoubles("targets"),
                            rp = *ref_rows->ToDoubles("positions");
  ASSERT_EQ(int64_t(rt.size()), rows->rows() * kSeq);
  std::vector<int32_t> tokens(size_t(rows->rows() * kSeq)), targets(tokens.size()), positions(tokens.size());
  for (int64_t r = 0; r < rows->rows(); ++r) {
    rows->Row(r, tokens.data() + r * kSeq, targets.data() + r * kSeq, positions.data() + r * kSeq);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_EQ(tokens[i], int32_t(rt[i])) << "token " << i;
    ASSERT_EQ(targets[i], int32_t(rg[i])) << "target " << i;
    ASSERT_EQ(positions[i], int32_t(rp[i])) << "position " << i;
  }
  auto ref = test::ReadTorchReference(dir.path());
  ASSERT_TRUE(ref.has_value());

  // The first step's gradients at accumulation 1 and 2: the micro-batches'
  // counted targets divide by the step's count.
  int64_t step_counted = 0;
  for (int64_t r = 0; r < kRowsPerStep; ++r) step_counted += rows->Counted(r);
  for (int64_t accum : {1, 2}) {
    SCOPED_TRACE("accumulation " + std::to_string(accum));
    auto t = Trainer::Create(SftConfig(kRowsPerStep / accum, accum), *rows);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ParamStore& store = (*t)->store();
    Gpt& model = (*t)->model();
    store.ZeroGrads();
    const int64_t n = kRowsPerStep / accum * kSeq;
    std::vector<float> logits(size_t(kRowsPerStep * kSeq * kVocab));
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; ++m) {
      const int64_t at = m * n;
      model.TrainForward({tokens.data() + at, targets.data() + at, positions.data() + at},
                         1.0f / float(step_counted), logits.data() + at * kVocab);
      loss_sum += model.TakeLossTotals().sum;
      model.Backward();
    }
    const double worst = test::ExpectMatchesTorch(*ref, store, logits, float(loss_sum / double(step_counted)));
    std::printf("accumulation %lld: %lld counted of %lld positions, float64 worst relative error %.3g\n",
                (long long)accum, (long long)step_counted, (long long)(kRowsPerStep * kSeq), worst);
  }

  // Training steps at every split of the step's rows: each the reference's
  // AdamW losses, and every split the same weights to rounding.
  const std::vector<double> ref_loss = *ref->f64.ToDoubles("loss");
  std::vector<std::vector<float>> final_one;
  for (const auto& [world, accum] : std::vector<std::pair<int, int64_t>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", accumulation " + std::to_string(accum));
    const WorldRun run = Train(*rows, world, accum);
    ASSERT_TRUE(run.error.empty()) << run.error;
    const double trajectory = test::ExpectTrajectoryMatchesTorch(*ref, run.losses, /*as_float32_is=*/true);
    // Validation: the masked mean over the first step's rows, before training.
    EXPECT_LE(std::abs(run.val_loss - ref_loss[0]) / ref_loss[0], 1e-5) << run.val_loss << " vs " << ref_loss[0];
    if (world == 1 && accum == 1) final_one = run.params;
    if (world == 1 && accum == 2) {
      for (size_t k = 0; k < final_one.size(); ++k) {
        for (size_t i = 0; i < final_one[k].size(); ++i) {
          ASSERT_NEAR(run.params[k][i], final_one[k][i], 1e-5 + 1e-4 * std::abs(final_one[k][i]))
              << initial[k].name << "[" << i << "]";
        }
      }
    }
    std::printf("world %d accumulation %lld: %lld AdamW losses within %.3g of float64\n", world, (long long)accum,
                (long long)run.losses.size(), trajectory);
  }
}

// A packed row against its examples run alone, each at the start of a row
// of its own with the rest ignored: the same logits and, summed, the same
// gradients, to fp32 rounding; for both decoders (RoPE's positions, and
// GPT-2's learned table read and its gradient summed by position).
class SftPacking : public testing::TestWithParam<test::TinyFamily> {};

TEST_P(SftPacking, APackedRowGivesEachExampleWhatItGetsAlone) {
  std::mt19937_64 rng(test::RunSeed());
  std::vector<TokenizedExample> ex = RandomExamples(rng, 4);
  ex[0].ids.resize(10);
  ex[0].counted.resize(10);
  ex[0].counted.back() = 1;
  auto packed = PackedRows::Pack(ex, kSeq * 4, OverlongPolicy::kError, 5, 0);
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  ASSERT_EQ(packed->rows(), 1);
  const int64_t T = packed->seq();
  const Config config = GetParam().job({"model.max_seq_len=" + std::to_string(T), "train.seq_len=" + std::to_string(T),
                                       "train.batch_size=1", "model.vocab_size=" + std::to_string(kVocab)});
  std::vector<int32_t> tokens(static_cast<size_t>(T)), targets(tokens.size()), positions(tokens.size());
  packed->Row(0, tokens.data(), targets.data(), positions.data());
  auto t = Trainer::Create(config, *packed);
  ASSERT_TRUE(t.ok()) << t.status().message();
  test::RandomizeWeights((*t)->store(), 11, 0.15f);
  ParamStore& store = (*t)->store();
  Gpt& model = (*t)->model();
  const int64_t V = config.model.gpt.vocab_size;
  std::vector<float> logits(size_t(T * V)), alone_logits(logits.size());
  store.ZeroGrads();
  model.TrainForward({tokens.data(), targets.data(), positions.data()}, 1.0f, logits.data());
  (void)model.TakeLoss();
  model.Backward();
  const std::vector<test::WholeTensor> packed_grads = test::WholeTensors(store, StateKind::kGrad);
  // Each example alone (its rows of the packed row at the start of one), its gradients summed.
  store.ZeroGrads();
  double worst = 0;
  for (int64_t t0 = 0; t0 < T;) {
    int64_t len = 1;
    while (t0 + len < T && positions[size_t(t0 + len)] != 0) ++len;
    if (std::all_of(targets.begin() + t0, targets.begin() + t0 + len, [](int32_t x) { return x < 0; })) {
      t0 += len;  // padding: nothing counted, nothing to compare
      continue;
    }
    std::vector<int32_t> one(size_t(T), 0), one_targets(size_t(T), -1);
    std::copy_n(tokens.begin() + t0, len, one.begin());
    std::copy_n(targets.begin() + t0, len, one_targets.begin());
    model.TrainForward({one.data(), one_targets.data()}, 1.0f, alone_logits.data());
    (void)model.TakeLoss();
    model.Backward();
    for (int64_t i = 0; i < len * V; ++i) {
      const float want = alone_logits[size_t(i)], got = logits[size_t(t0 * V + i)];
      worst = std::max(worst, double(std::abs(got - want)));
      ASSERT_NEAR(got, want, 2e-5 * std::max(1.0f, std::abs(want))) << "example at " << t0 << ", logit " << i;
    }
    t0 += len;
  }
  const std::vector<test::WholeTensor> summed = test::WholeTensors(store, StateKind::kGrad);
  for (size_t k = 0; k < summed.size(); ++k) {
    std::vector<double> want(summed[k].values.begin(), summed[k].values.end());
    EXPECT_LE(test::RelativeError(packed_grads[k].values.data(), want), 1e-5) << summed[k].name;
  }
  std::printf("%s: %lld positions in one row: logits within %.3g of each example alone\n", GetParam().name,
              (long long)T, worst);
}

INSTANTIATE_TEST_SUITE_P(Decoders, SftPacking, testing::ValuesIn(test::TinyFamilies()), test::TinyFamilyName);

}  // namespace
}  // namespace pstar
