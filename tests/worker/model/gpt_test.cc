// Training invariants of the CPU GPT: recompute is bit-identical, gradient
// accumulation equals a larger batch, chunking never changes the numbers.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>

#include "tests/worker/tiny_gpt_job.h"
#include "worker/train/trainer.h"

namespace pstar {
namespace {

Config MakeConfig(const std::vector<std::string>& overrides) { return test::TinyGptConfig(overrides); }
using test::RandomTokens;

// The invariants every decoder keeps, on the tiny GPT-2 and Llama jobs.
using GptFamilies = test::TinyFamilyTest;

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // per tensor, after training
  std::vector<std::vector<float>> grads;   // per tensor, of the last step
};

RunResult Train(const Config& config, const TokenSource& data) {
  auto t = Trainer::Create(config, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  RunResult r;
  for (int64_t s = 0; s < config.train.steps; ++s) {
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok());
    r.losses.push_back(st->loss);
  }
  r.params = test::TensorCopies((*t)->store(), StateKind::kParam);
  r.grads = test::TensorCopies((*t)->store(), StateKind::kGrad);
  return r;
}

void ExpectBitIdentical(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)));
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)))
        << "tensor " << i;
    EXPECT_EQ(0, std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)))
        << "gradient " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Decoders, GptFamilies, testing::ValuesIn(test::TinyFamilies()), test::TinyFamilyName);

// In every precision: 16-bit runs keep 16-bit block inputs, and the
// recomputed blocks read the same bits.
TEST_P(GptFamilies, ActivationCheckpointingIsBitIdentical) {
  auto data = Tokens(2000, 1);
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const std::string p = std::string("train.precision=") + precision;
    auto off = Train(Job({"train.activation_checkpointing=false", p}), data);
    auto on = Train(Job({"train.activation_checkpointing=true", p}), data);
    ExpectBitIdentical(off, on);
  }
}

TEST_P(GptFamilies, ChunkSizeDoesNotChangeTraining) {
  auto data = Tokens(2000, 2);
  auto automatic = Train(Job({}), data);
  auto small = Train(Job({"default_chunk_size=1024"}), data);  // 40x16 wte is the largest
  auto large = Train(Job({"default_chunk_size=100000"}), data);
  ExpectBitIdentical(automatic, small);
  ExpectBitIdentical(automatic, large);
}

// Every CPU kernel splits its work by the shape alone: 1, 2 and 3 threads
// train the same bits, on a model large enough that the GEMMs are tiled,
// attention spans several blocks and the classifier runs over the whole
// micro-batch or (a deeper model) several row blocks.
void ExpectThreadCountDoesNotChangeTraining(test::TinyJob job, const std::vector<std::string>& shape) {
  auto data = RandomTokens(20000, 300, 4);
  for (const char* layers : {"model.n_layer=2", "model.n_layer=5"}) {
    std::vector<std::string> overrides = shape;
    for (const char* o : {"model.vocab_size=300", "model.max_seq_len=160", "train.batch_size=3", "train.seq_len=150",
                          "train.steps=2"}) {
      overrides.push_back(o);
    }
    overrides.push_back(layers);
    const Config c = job(overrides);
    const int64_t tokens = 3 * 150, rows = ClassifierRows(c.model.gpt, tokens);
    SCOPED_TRACE(testing::Message() << layers << ": classifier rows " << rows << " of " << tokens);
    EXPECT_EQ(rows < tokens, std::string(layers) == "model.n_layer=5") << "both forms of the classifier";
    std::vector<RunResult> runs;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      runs.push_back(Train(c, data));
    }
    omp_set_num_threads(omp_get_num_procs());
    ExpectBitIdentical(runs[0], runs[1]);
    ExpectBitIdentical(runs[0], runs[2]);
  }
}

TEST(Gpt, ThreadCountDoesNotChangeTraining) {
  ExpectThreadCountDoesNotChangeTraining(test::TinyGptConfig, {"model.n_embd=96", "model.n_head=3"});
}

// The same with grouped-query attention (3 query heads per kv head), RoPE and
// SwiGLU.
TEST(Gpt, LlamaThreadCountDoesNotChangeTraining) {
  ExpectThreadCountDoesNotChangeTraining(test::TinyLlamaConfig, {"model.n_embd=96", "model.n_head=6",
                                                                "model.n_kv_head=2", "model.head_dim=16",
                                                                "model.intermediate_size=320"});
}

// The classifier's two forms (the whole micro-batch's logits kept, dlogits
// with the loss; or row blocks, the logits computed again in backward) train
// the same model to rounding: one shape in both forms, by padding the
// vocabulary more (the padding is outside the softmax and stays zero).
TEST(Gpt, ClassifierRowBlocksAndTheWholeBatchAgree) {
  auto data = RandomTokens(4000, 40, 5);
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    Config blocks = MakeConfig({"model.n_embd=64", "model.n_head=4", std::string("train.precision=") + precision,
                                "train.steps=3"});
    Config whole = blocks;
    whole.model.gpt.vocab_multiple = 128;
    const int64_t tokens = blocks.train.batch_size * blocks.train.seq_len;
    ASSERT_LT(ClassifierRows(blocks.model.gpt, tokens), tokens);
    ASSERT_EQ(ClassifierRows(whole.model.gpt, tokens), tokens);
    const RunResult a = Train(blocks, data), b = Train(whole, data);
    // bf16: the logits round to 16 bits, and the dlogits of row blocks are
    // those of recomputed logits through GEMMs of other shapes.
    const double tolerance = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
    for (size_t s = 0; s < a.losses.size(); ++s) {
      EXPECT_NEAR(a.losses[s], b.losses[s], tolerance * std::abs(a.losses[s])) << "step " << s;
    }
    ASSERT_EQ(a.params.size(), b.params.size());
    for (size_t i = 0; i < a.params.size(); ++i) {
      // wte is (padded vocab, C): its first vocab_size rows are the model's.
      const size_t n = std::min(a.params[i].size(), b.params[i].size());
      double num = 0, den = 0;
      for (size_t j = 0; j < n; ++j) {
        const double d = double(a.grads[i][j]) - b.grads[i][j];
        num += d * d;
        den += double(b.grads[i][j]) * b.grads[i][j];
      }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 10 * tolerance) << "gradient of tensor " << i;
    }
  }
}

TEST_P(GptFamilies, GradientAccumulationEqualsLargerBatch) {
  auto data = Tokens(4000, 3);
  for (int k : {2, 4}) {
    SCOPED_TRACE("accumulation " + std::to_string(k));
    auto accum = Train(Job({"train.batch_size=2", "train.grad_accum_steps=" + std::to_string(k),
                                   "train.steps=1"}),
                       data);
    auto big = Train(Job({"train.batch_size=" + std::to_string(2 * k), "train.steps=1"}), data);
    EXPECT_NEAR(accum.losses[0], big.losses[0], 1e-6 * std::abs(big.losses[0]));
    double worst = 0;
    for (size_t i = 0; i < big.grads.size(); ++i) {
      double num = 0, den = 0;
      for (size_t j = 0; j < big.grads[i].size(); ++j) {
        double d = double(accum.grads[i][j]) - big.grads[i][j];
        num += d * d;
        den += double(big.grads[i][j]) * big.grads[i][j];
      }
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    }
    EXPECT_LT(worst, 1e-6) << "largest relative gradient difference";
  }
}

TEST_P(GptFamilies, InitializationIsIndependentOfChunking) {
  Config a = Job({}), b = Job({"default_chunk_size=1024"});
  // A chunk size other than the automatic one (the Llama job's is 1024).
  const int64_t other = ParamLayout::ChooseChunkElems(GptTensorSpecs(a.model.gpt)) == 1024 ? 2048 : 1024;
  ParamStore sa(*ParamLayout::Build(GptTensorSpecs(a.model.gpt), 0));
  ParamStore sb(*ParamLayout::Build(GptTensorSpecs(b.model.gpt), other));
  ASSERT_NE(sa.layout().num_chunks(), sb.layout().num_chunks());
  InitParameters(sa, 99);
  InitParameters(sb, 99);
  for (TensorId id = 0; id < sa.layout().num_tensors(); ++id) {
    const int64_t n = sa.layout().spec(id).numel();
    EXPECT_EQ(0, std::memcmp(sa.TensorData(StateKind::kParam, id), sb.TensorData(StateKind::kParam, id),
                             size_t(n) * sizeof(float)));
  }
}

// In every precision (16-bit runs keep their activations in 16 bits), with
// and without recomputation and kept GELU outputs.
TEST_P(GptFamilies, ActivationBytesAreExactlyWhatTheArenaHandsOut) {
  Config c = Job({});
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const ComputeSpec compute{ComputeDevice::kCpu, precision};
    for (bool recompute : {false, true}) {
      for (bool keep_gelu : {false, true}) {
        SCOPED_TRACE(testing::Message() << PrecisionName(precision) << " recompute " << recompute << " keep_gelu "
                                        << keep_gelu);
        ParamStore store(*ParamLayout::Build(GptTensorSpecs(c.model.gpt), 0));
        const int64_t bytes = Gpt::ActivationBytes(c.model.gpt, 4, 8, recompute, compute, keep_gelu);
        Arena arena("activations", size_t(bytes));
        auto gpt =
            Gpt::Create(c.model.gpt, store, arena, 4, 8, recompute, MakeCpuModelKernels(precision), keep_gelu);
        ASSERT_TRUE(gpt.ok()) << gpt.status().message();
        EXPECT_EQ(int64_t(arena.used_bytes()), bytes);
        Arena small("activations", size_t(bytes) - 64);
        EXPECT_FALSE(
            Gpt::Create(c.model.gpt, store, small, 4, 8, recompute, MakeCpuModelKernels(precision), keep_gelu).ok());
      }
    }
    EXPECT_LT(Gpt::ActivationBytes(c.model.gpt, 4, 8, true, compute),
              Gpt::ActivationBytes(c.model.gpt, 4, 8, false, compute));
    EXPECT_LT(Gpt::ActivationBytes(c.model.gpt, 4, 8, false, compute),
              Gpt::ActivationBytes(c.model.gpt, 4, 8, false, compute, true));
    // Recomputing whole blocks keeps nothing more.
    EXPECT_EQ(Gpt::ActivationBytes(c.model.gpt, 4, 8, true, compute, true),
              Gpt::ActivationBytes(c.model.gpt, 4, 8, true, compute));
  }
}

// Attention keeps no T×T matrix: activations grow linearly with the sequence
// (doubling T doubles them, within 5%), with and without recomputation, in
// fp32 and 16 bits, and the arena hands out exactly what the plan says at
// each length. 16-bit runs keep every activation a layer keeps in 16 bits:
// they save exactly half of those bytes (the fp32 workspaces and statistics
// stay).
TEST(Gpt, ActivationBytesAreLinearInTheSequenceLength) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const ComputeSpec compute{ComputeDevice::kCpu, precision};
    for (bool recompute : {false, true}) {
      int64_t previous = 0;
      for (int64_t T : {256, 512, 1024, 2048}) {
        SCOPED_TRACE(testing::Message() << PrecisionName(precision) << " recompute " << recompute << " T " << T);
        Config c = MakeConfig({"model.max_seq_len=2048", "model.n_embd=64", "model.n_head=4", "model.n_layer=3",
                               "model.vocab_size=512"});
        const int64_t bytes = Gpt::ActivationBytes(c.model.gpt, 2, T, recompute, compute);
        if (previous > 0) { EXPECT_NEAR(double(bytes) / double(previous), 2.0, 0.1); }
        previous = bytes;
        if (precision != Precision::kFp32) {
          // Half of each kept activation's 4 bytes: per block kept ln_1, qkv (3),
          // attention's output, the attention residual, ln_2 and the MLP's
          // pre-activation (4): 11 values per token and channel; the L + 1 block
          // inputs, ln_f and the shared GELU output (4). Arena rounding aside.
          const int64_t fp32 = Gpt::ActivationBytes(c.model.gpt, 2, T, recompute, {ComputeDevice::kCpu});
          // The classifier's logits (ClassifierRows of them) are in 16 bits
          // too, and so are the backward workspaces dtmp, dqkv (3) and dfch
          // (4), less the 16-bit copy of the residual gradient: 7.
          const int64_t L = c.model.gpt.n_layer, kept = recompute ? 1 : L;
          const int64_t logits = ClassifierRows(c.model.gpt, 2 * T) * c.model.gpt.padded_vocab_size();
          const int64_t halved = 2 * 2 * T * c.model.gpt.n_embd * (11 * kept + (L + 1) + 1 + 4 + 7) + 2 * logits;
          EXPECT_NEAR(double(fp32 - bytes), double(halved), 0.01 * double(halved));
        }
        ParamStore store(*ParamLayout::Build(GptTensorSpecs(c.model.gpt), 0));
        Arena arena("activations", size_t(bytes));
        auto gpt = Gpt::Create(c.model.gpt, store, arena, 2, T, recompute, MakeCpuModelKernels(precision));
        ASSERT_TRUE(gpt.ok()) << gpt.status().message();
        EXPECT_EQ(int64_t(arena.peak_bytes()), bytes);
      }
    }
  }
}

TEST(Gpt, LearnsTheGeneratedCorpus) {
  auto c = ParseConfig(test::kTinyGptJob, "test", {"data.generated_tokens=20000", "train.steps=150",
                                       "optimizer.params.lr=0.02", "train.warmup_steps=5"});
  ASSERT_TRUE(c.ok());
  auto data = OpenDataSource(*c);
  ASSERT_TRUE(data.ok());
  auto r = Train(*c, **data);
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.5f) << "first " << r.losses.front() << " last "
                                                       << r.losses.back();
}

}  // namespace
}  // namespace pstar

namespace pstar {
namespace {

// A vocabulary table larger than a block's tensors is stored in row parts
// no larger than the largest group a block op reads (so the chunk size
// follows the blocks), each a 64-row multiple, in order, the last with the
// padding; checkpoints and users see the whole tensor. GPT-2's tables stay
// whole.
TEST(Gpt, LargeVocabulariesAreInRowPartsNoLargerThanABlocksTensors) {
  int parted = 0;
  for (const GptPreset& preset : GptPresets()) {
    SCOPED_TRACE(preset.name);
    const GptConfig& g = preset.config;
    const std::vector<TensorSpec> specs = GptTensorSpecs(g);
    const int64_t Vp = g.padded_vocab_size();
    // The largest group of joined tensors outside the vocabulary tables.
    int64_t largest = 0, group = 0;
    for (const TensorSpec& s : specs) {
      if (!s.part_of.empty() || s.shape[0] == Vp) continue;
      group = s.joined ? group + s.numel() : s.numel();
      largest = std::max(largest, group);
    }
    const int64_t rows = VocabPartRows(g);
    if (g.architecture == Architecture::kGpt2) {
      EXPECT_EQ(rows, Vp);
      for (const TensorSpec& s : specs) EXPECT_TRUE(s.part_of.empty()) << s.name;
      continue;
    }
    for (const std::string table : {"model.embed_tokens.weight", "lm_head.weight"}) {
      if (table == "lm_head.weight" && g.tied_embeddings) continue;
      int64_t next_row = 0, padded = 0;
      int parts = 0;
      for (const TensorSpec& s : specs) {
        if (s.tensor() != table) continue;
        ++parts;
        EXPECT_EQ(s.part_row, next_row) << s.name;
        EXPECT_EQ(s.tensor_offset(), s.part_row * g.n_embd) << s.name;
        EXPECT_EQ(s.shape[0] % 64, 0) << s.name;
        EXPECT_LE(s.shape[0], rows) << s.name;
        if (rows < Vp) EXPECT_LE(s.numel(), largest) << s.name << ": a part larger than the blocks' tensors";
        next_row += s.shape[0];
        padded += s.padded_rows;
      }
      EXPECT_EQ(next_row, Vp) << table;
      EXPECT_EQ(padded, Vp - g.vocab_size) << table;
      EXPECT_EQ(parts, (Vp + rows - 1) / rows) << table;
      if (parts > 1) ++parted;
    }
    EXPECT_LE(ParamLayout::ChooseChunkElems(specs), (std::max(largest, rows * g.n_embd) + 1023) / 1024 * 1024 * 2);
    // The visible tensors are whole, with the published shapes.
    const std::vector<TensorSpec> visible = GptVisibleTensorSpecs(g);
    EXPECT_EQ(visible.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(visible.front().shape, (std::vector<int64_t>{g.vocab_size, g.n_embd}));
    if (!g.tied_embeddings) {
      EXPECT_EQ(visible.back().name, "lm_head.weight");
      EXPECT_EQ(visible.back().shape, (std::vector<int64_t>{g.vocab_size, g.n_embd}));
    }
    for (const TensorSpec& s : visible) EXPECT_TRUE(s.part_of.empty()) << s.name;
  }
  EXPECT_GE(parted, 7) << "the 128k and 152k vocabularies are in parts";
  // Llama 3.1 8B: 128,256 rows against gate|up's 2 x 14336 x 4096 elements
  // (28,672 rows of 4096): five parts of 25,664 rows, the last 25,600.
  const GptConfig llama8b = *FindGptPreset("llama-3.1-8b");
  EXPECT_EQ(VocabPartRows(llama8b), 25664);
}

}  // namespace
}  // namespace pstar
