// Trainer::Sample (train.sample_every): greedy tokens equal the standalone
// Sampler's on the same weights, training is untouched, and ZeRO ranks agree
// with one rank.
#include <gtest/gtest.h>

#include <thread>

#include "tests/test_util.h"
#include "tests/worker/dist/thread_group_communicator.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/ckpt/checkpoint_dir.h"
#include "worker/model/gpt.h"
#include "worker/model/sampler.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

Config MakeConfig() {
  auto c = ParseConfig(
      "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 61, max_seq_len: 16}\n"
      "optimizer: {type: AdamW, params: {lr: 0.01}}\n"
      "train: {batch_size: 2, seq_len: 16, steps: 4, seed: 3}\n"
      "default_chunk_size: 1024\n",
      "test");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

VectorTokenSource Data() {
  std::vector<int32_t> t(3000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * i + 7 * i) % 61);
  return VectorTokenSource(std::move(t));
}

std::vector<std::vector<float>> VisibleParams(ParamStore& store) {
  std::vector<std::vector<float>> out;
  for (TensorId id = 0; id < store.layout().num_tensors(); ++id) {
    const float* p = store.TensorData(StateKind::kParam, id);
    out.emplace_back(p, p + store.layout().spec(id).visible_numel());
  }
  return out;
}

TEST(TrainerSample, GreedyEqualsTheSamplerAndTrainingIsUntouched) {
  VectorTokenSource data = Data();
  auto t = Trainer::Create(MakeConfig(), data);
  auto twin = Trainer::Create(MakeConfig(), data);
  ASSERT_TRUE(t.ok() && twin.ok());
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*t)->Step().ok() && (*twin)->Step().ok());
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.tokens = 20;  // the window slides past seq_len
  auto ours = (*t)->Sample({5, 9, 2}, greedy);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  EXPECT_EQ(ours->size(), 20u);
  auto sampler = Sampler::Create(MakeConfig().model.gpt, VisibleParams((*t)->store()));
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(*ours, *(*sampler)->Generate({5, 9, 2}, greedy));
  SampleOptions drawn;
  drawn.tokens = 10;
  drawn.seed = 4;
  drawn.top_k = 5;
  EXPECT_EQ(*(*t)->Sample({1}, drawn), *(*sampler)->Generate({1}, drawn));
  // The sampled trainer goes on exactly as its twin.
  for (int s = 0; s < 2; ++s) {
    auto a = (*t)->Step(), b = (*twin)->Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss);
  }
  EXPECT_EQ(VisibleParams((*t)->store()), VisibleParams((*twin)->store()));
}

TEST(TrainerSample, ZeroRanksAgreeWithOneRank) {
  VectorTokenSource data = Data();
  SampleOptions o;
  o.tokens = 12;
  o.seed = 9;
  auto one = Trainer::Create(MakeConfig(), data);
  ASSERT_TRUE(one.ok());
  auto want = (*one)->Sample({3, 3}, o);
  ASSERT_TRUE(want.ok());
  constexpr int kWorld = 2;
  auto comms = test::MakeThreadGroupCommunicators(kWorld);
  std::vector<std::vector<int32_t>> got(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      Config c = MakeConfig();
      c.train.batch_size = 1;
      auto t = Trainer::Create(c, data, comms[size_t(r)].get());
      if (!t.ok()) {
        errors[size_t(r)] = t.status().message();
        return;
      }
      auto s = (*t)->Sample({3, 3}, o);
      if (!s.ok()) errors[size_t(r)] = s.status().message();
      else got[size_t(r)] = *s;
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[size_t(r)], "");
    EXPECT_EQ(got[size_t(r)], *want) << "rank " << r;
  }
}

// A Llama model whose token table and classifier are in row parts: its
// checkpoint holds them whole, and the sampler built from the whole tensors
// generates what the trainer's own model does.
TEST(TrainerSample, RowPartsSaveWholeAndSampleAsTheTrainerDoes) {
  test::TempDir dir("sample-parts");
  // Rows of the model's whole length: the trainer's window is the sampler's.
  const Config c = test::TinyLlamaConfig({"train.steps=2", "train.seq_len=12", "checkpoint.dir=" + dir.path()});
  ASSERT_LT(VocabPartRows(c.model.gpt), c.model.gpt.padded_vocab_size()) << "the tiny Llama is in row parts";
  VectorTokenSource data = test::RandomTokens(2000, c.model.gpt.vocab_size, 4);
  auto t = Trainer::Create(c, data);
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*t)->Step().ok());
  ASSERT_TRUE((*t)->SaveCheckpoint().ok());
  auto whole = LoadWholeParams(dir.path() + "/" + StepDirName(2), c.model.gpt);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const std::vector<TensorSpec> visible = GptVisibleTensorSpecs(c.model.gpt);
  ASSERT_EQ(whole->size(), visible.size());
  EXPECT_EQ(int64_t(whole->front().size()), c.model.gpt.vocab_size * c.model.gpt.n_embd);
  auto sampler = Sampler::Create(c.model.gpt, *whole);
  ASSERT_TRUE(sampler.ok()) << sampler.status().message();
  SampleOptions o;
  o.tokens = 10;
  o.seed = 2;
  auto ours = (*t)->Sample({7, 120, 64, 149}, o);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  EXPECT_EQ(*ours, *(*sampler)->Generate({7, 120, 64, 149}, o));
}

}  // namespace
}  // namespace pstar
