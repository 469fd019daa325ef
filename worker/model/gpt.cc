#include "worker/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "worker/core/counter_rng.h"

namespace pstar {

namespace {

constexpr float kInitStd = 0.02f;

std::string LayerName(int64_t l, const char* suffix) {
  return "transformer.h." + std::to_string(l) + "." + suffix;
}

}  // namespace

std::vector<TensorSpec> GptTensorSpecs(const GptConfig& g) {
  const int64_t C = g.n_embd;
  // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
  const float proj_std = kInitStd / std::sqrt(2.0f * float(g.n_layer));
  std::vector<TensorSpec> s;
  s.push_back({"transformer.wte.weight", {g.padded_vocab_size(), C}, TensorRole::kEmbedding, kInitStd,
               g.padded_vocab_size() - g.vocab_size});
  s.push_back({"transformer.wpe.weight", {g.max_seq_len, C}, TensorRole::kEmbedding, kInitStd});
  for (int64_t l = 0; l < g.n_layer; ++l) {
    s.push_back({LayerName(l, "ln_1.weight"), {C}, TensorRole::kNormWeight, 0});
    s.push_back({LayerName(l, "ln_1.bias"), {C}, TensorRole::kNormBias, 0});
    s.push_back({LayerName(l, "attn.c_attn.weight"), {3 * C, C}, TensorRole::kWeight, kInitStd});
    s.push_back({LayerName(l, "attn.c_attn.bias"), {3 * C}, TensorRole::kBias, 0});
    s.push_back({LayerName(l, "attn.c_proj.weight"), {C, C}, TensorRole::kWeight, proj_std});
    s.push_back({LayerName(l, "attn.c_proj.bias"), {C}, TensorRole::kBias, 0});
    s.push_back({LayerName(l, "ln_2.weight"), {C}, TensorRole::kNormWeight, 0});
    s.push_back({LayerName(l, "ln_2.bias"), {C}, TensorRole::kNormBias, 0});
    s.push_back({LayerName(l, "mlp.c_fc.weight"), {4 * C, C}, TensorRole::kWeight, kInitStd});
    s.push_back({LayerName(l, "mlp.c_fc.bias"), {4 * C}, TensorRole::kBias, 0});
    s.push_back({LayerName(l, "mlp.c_proj.weight"), {C, 4 * C}, TensorRole::kWeight, proj_std});
    s.push_back({LayerName(l, "mlp.c_proj.bias"), {C}, TensorRole::kBias, 0});
  }
  s.push_back({"transformer.ln_f.weight", {C}, TensorRole::kNormWeight, 0});
  s.push_back({"transformer.ln_f.bias", {C}, TensorRole::kNormBias, 0});
  return s;
}

std::vector<TensorSpec> GptVisibleTensorSpecs(const GptConfig& g) {
  std::vector<TensorSpec> specs = GptTensorSpecs(g);
  for (TensorSpec& s : specs) {
    s.shape = s.visible_shape();
    s.padded_rows = 0;
  }
  return specs;
}

void InitParameters(ParamStore& store, uint64_t seed) {
  // Each rank fills only its slice of each tensor; the counter RNG makes any
  // slice equal the same slice of a whole-tensor fill.
  const ParamLayout& layout = store.layout();
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    float* shard = store.HostShard(StateKind::kParam, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const TensorSpec& spec = layout.spec(id);
      const ParamStore::Slice s = store.OwnedSlice(id);
      float* p = shard + s.shard_offset;
      const int64_t n = s.end - s.begin;
      switch (spec.role) {
        case TensorRole::kEmbedding:
        case TensorRole::kWeight:
          FillNormal(p, n, spec.init_std, seed, StableKey(spec.name), uint64_t(s.begin));
          // Padding rows are zero (the visible elements are the same as unpadded).
          for (int64_t i = std::max(s.begin, spec.visible_numel()); i < s.end; ++i) p[i - s.begin] = 0.0f;
          break;
        case TensorRole::kNormWeight:
          for (int64_t i = 0; i < n; ++i) p[i] = 1.0f;
          break;
        case TensorRole::kBias:
        case TensorRole::kNormBias:
          for (int64_t i = 0; i < n; ++i) p[i] = 0.0f;
          break;
      }
    }
  }
  store.chunks().ZeroFill(StateKind::kExpAvg);
  store.chunks().ZeroFill(StateKind::kExpAvgSq);
}

std::vector<AccessMoment> GptAccessSequence(const GptConfig& g, const ParamLayout& layout, bool recompute,
                                            int64_t tokens) {
  auto id = [&](const std::string& name) { return layout.Find(name); };
  auto block = [&](int64_t l, const char* a, const char* b) {
    return std::vector<TensorId>{id(LayerName(l, a)), id(LayerName(l, b))};
  };
  auto block_forward = [&](std::vector<AccessMoment>& seq, int64_t l) {
    for (auto [w, b] : {std::pair{"ln_1.weight", "ln_1.bias"}, {"attn.c_attn.weight", "attn.c_attn.bias"},
                        {"attn.c_proj.weight", "attn.c_proj.bias"}, {"ln_2.weight", "ln_2.bias"},
                        {"mlp.c_fc.weight", "mlp.c_fc.bias"}, {"mlp.c_proj.weight", "mlp.c_proj.bias"}}) {
      seq.push_back({block(l, w, b), Pass::kForward});
    }
  };
  const TensorId wte = id("transformer.wte.weight"), wpe = id("transformer.wpe.weight");
  const TensorId lnf_w = id("transformer.ln_f.weight"), lnf_b = id("transformer.ln_f.bias");
  std::vector<AccessMoment> seq;
  seq.push_back({{wte, wpe}, Pass::kForward});
  for (int64_t l = 0; l < g.n_layer; ++l) block_forward(seq, l);
  seq.push_back({{lnf_w, lnf_b}, Pass::kForward});
  seq.push_back({{wte}, Pass::kForward});
  // With dlogits kept, the classifier's input gradient reads wte and its
  // weight gradient waits for the embeddings' backward (Gpt::Backward).
  const bool dlogits_kept = ClassifierKeepsLogits(g, tokens);
  seq.push_back({{wte}, Pass::kBackward, /*params=*/true, /*grads=*/!dlogits_kept});
  seq.push_back({{lnf_w, lnf_b}, Pass::kBackward});
  for (int64_t l = g.n_layer - 1; l >= 0; --l) {
    if (recompute && l != g.n_layer - 1) block_forward(seq, l);
    for (auto [w, b] : {std::pair{"mlp.c_proj.weight", "mlp.c_proj.bias"}, {"mlp.c_fc.weight", "mlp.c_fc.bias"},
                        {"ln_2.weight", "ln_2.bias"}, {"attn.c_proj.weight", "attn.c_proj.bias"},
                        {"attn.c_attn.weight", "attn.c_attn.bias"}, {"ln_1.weight", "ln_1.bias"}}) {
      seq.push_back({block(l, w, b), Pass::kBackward});
    }
  }
  if (dlogits_kept) seq.push_back({{wte}, Pass::kBackward, /*params=*/false});  // the classifier's weight gradient
  seq.push_back({{wte, wpe}, Pass::kBackward, /*params=*/false});  // the embeddings' backward reads no weight
  return seq;
}

int64_t Gpt::ActivationBytes(const GptConfig& g, int64_t B, int64_t T, bool recompute, const ComputeSpec& compute,
                             bool keep_gelu) {
  // Walk the same allocation sequence Carve makes, counting what the arena charges.
  Gpt probe(g, B, T, recompute, compute, keep_gelu);
  int64_t bytes = 0;
  probe.Lay([&](int64_t floats) -> void* {
    bytes += int64_t(Arena::Rounded(size_t(floats) * 4));
    return nullptr;
  });
  return bytes;
}

Gpt::Gpt(const GptConfig& config, int64_t batch, int64_t seq, bool recompute, const ComputeSpec& compute,
         bool keep_gelu)
    : config_(config),
      store_(nullptr),
      B_(batch),
      T_(seq),
      recompute_(recompute),
      keep_gelu_(keep_gelu && !recompute),
      compute_(compute),
      classifier_rows_(ClassifierRows(config, batch * seq)) {}

Result<Gpt> Gpt::Create(const GptConfig& config, ParamStore& store, Arena& arena, int64_t batch, int64_t seq,
                        bool recompute, std::unique_ptr<ModelKernels> kernels, bool keep_gelu) {
  if (seq > config.max_seq_len) {
    return Status::InvalidArgument("sequence length " + std::to_string(seq) +
                                   " exceeds the model's max_seq_len " +
                                   std::to_string(config.max_seq_len));
  }
  if (kernels == nullptr) kernels = MakeCpuModelKernels();
  Gpt gpt(config, batch, seq, recompute, kernels->compute(), keep_gelu);
  gpt.kernels_ = std::move(kernels);
  gpt.store_ = &store;
  const ParamLayout& layout = store.layout();
  auto find = [&](const std::string& name) -> Result<TensorId> {
    TensorId id = layout.Find(name);
    if (id < 0) return Status::Internal("layout has no tensor " + name);
    return id;
  };
  PSTAR_ASSIGN_OR_RETURN(gpt.wte_, find("transformer.wte.weight"));
  PSTAR_ASSIGN_OR_RETURN(gpt.wpe_, find("transformer.wpe.weight"));
  PSTAR_ASSIGN_OR_RETURN(gpt.lnf_w_, find("transformer.ln_f.weight"));
  PSTAR_ASSIGN_OR_RETURN(gpt.lnf_b_, find("transformer.ln_f.bias"));
  for (int64_t l = 0; l < config.n_layer; ++l) {
    LayerTensors t{};
    PSTAR_ASSIGN_OR_RETURN(t.ln1_w, find(LayerName(l, "ln_1.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.ln1_b, find(LayerName(l, "ln_1.bias")));
    PSTAR_ASSIGN_OR_RETURN(t.qkv_w, find(LayerName(l, "attn.c_attn.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.qkv_b, find(LayerName(l, "attn.c_attn.bias")));
    PSTAR_ASSIGN_OR_RETURN(t.attn_proj_w, find(LayerName(l, "attn.c_proj.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.attn_proj_b, find(LayerName(l, "attn.c_proj.bias")));
    PSTAR_ASSIGN_OR_RETURN(t.ln2_w, find(LayerName(l, "ln_2.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.ln2_b, find(LayerName(l, "ln_2.bias")));
    PSTAR_ASSIGN_OR_RETURN(t.fc_w, find(LayerName(l, "mlp.c_fc.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.fc_b, find(LayerName(l, "mlp.c_fc.bias")));
    PSTAR_ASSIGN_OR_RETURN(t.fc_proj_w, find(LayerName(l, "mlp.c_proj.weight")));
    PSTAR_ASSIGN_OR_RETURN(t.fc_proj_b, find(LayerName(l, "mlp.c_proj.bias")));
    gpt.layers_.push_back(t);
  }
  PSTAR_RETURN_IF_ERROR(gpt.Carve(arena));
  gpt.kernels_->SetScratch(gpt.acts_.scratch, KernelScratchBytes(gpt.compute_, config, batch, seq));
  return gpt;
}

template <typename Alloc>
void Gpt::Lay(Alloc&& alloc) {
  const int64_t BT = B_ * T_, C = config_.n_embd, BTC = BT * C;
  const int64_t lse = B_ * config_.n_head * T_;  // attention keeps no T×T matrix
  // alloc takes a count of 4-byte words.
  auto f = [&](int64_t n) { return static_cast<float*>(alloc(n)); };
  // n elements in the run's activation format (ActTensor).
  auto g = [&](int64_t n) {
    if (compute_.precision == Precision::kFp32) return ActTensor{f(n), nullptr};
    return ActTensor{nullptr, static_cast<uint16_t*>(alloc((n + 1) / 2))};
  };
  Activations& a = acts_;
  a.blocks.assign(size_t(recompute_ ? 1 : config_.n_layer), BlockActivations{});
  for (auto& b : a.blocks) {
    b.ln1 = g(BTC);
    b.ln1_mean = f(BT);
    b.ln1_rstd = f(BT);
    b.qkv = g(3 * BTC);
    b.lse = f(lse);
    b.atty = g(BTC);
    b.res2 = g(BTC);
    b.ln2 = g(BTC);
    b.ln2_mean = f(BT);
    b.ln2_rstd = f(BT);
    b.fch = g(4 * BTC);
    if (keep_gelu_) b.fch_gelu = g(4 * BTC);
  }
  a.residual.clear();
  for (int64_t l = 0; l <= config_.n_layer; ++l) a.residual.push_back(g(BTC));
  a.lnf = g(BTC);
  a.lnf_mean = f(BT);
  a.lnf_rstd = f(BT);
  a.logits = g(classifier_rows_ * config_.padded_vocab_size());
  a.losses = f(BT);
  a.tmp = f(BTC);
  a.fch_gelu = keep_gelu_ ? ActTensor{} : g(4 * BTC);
  a.dres = f(BTC);
  a.dres16 = compute_.precision == Precision::kFp32 ? ActTensor{} : g(BTC);
  a.dres_gemm = compute_.precision == Precision::kFp32 ? ActTensor{a.dres} : a.dres16;
  a.dtmp = g(BTC);
  a.dqkv = g(3 * BTC);
  a.dfch = g(4 * BTC);
  a.tokens = static_cast<int32_t*>(alloc(BT));  // int32: same size as float
  a.targets = static_cast<int32_t*>(alloc(BT));
  const int64_t scratch = KernelScratchBytes(compute_, config_, B_, T_);
  a.scratch = scratch > 0 ? alloc((scratch + 3) / 4) : nullptr;
}

Status Gpt::Carve(Arena& arena) {
  Status status;
  Lay([&](int64_t floats) -> void* {
    if (!status.ok()) return nullptr;
    auto r = arena.AllocateFloats(size_t(floats));
    if (!r.ok()) {
      status = r.status();
      return nullptr;
    }
    return *r;
  });
  return status;
}

Gpt::BlockActivations& Gpt::BlockActs(int64_t layer) {
  return acts_.blocks[recompute_ ? 0 : size_t(layer)];
}

void Gpt::BlockForward(int64_t l, ActTensor x, ActTensor y) {
  const int64_t BT = B_ * T_, C = config_.n_embd, NH = config_.n_head;
  const LayerTensors& t = layers_[size_t(l)];
  BlockActivations& a = BlockActs(l);
  {
    auto u = store_->Acquire({t.ln1_w, t.ln1_b}, Pass::kForward);
    kernels_->LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, P(u, t.ln1_w), P(u, t.ln1_b), BT, C);
  }
  {
    auto u = store_->Acquire({t.qkv_w, t.qkv_b}, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kQkv, a.qkv, a.ln1, P(u, t.qkv_w), P(u, t.qkv_b), BT, C, 3 * C);
  }
  kernels_->AttentionForward(a.atty, a.lse, a.qkv, B_, T_, C, NH);
  {
    auto u = store_->Acquire({t.attn_proj_w, t.attn_proj_b}, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kAttnProj, ActTensor{acts_.tmp}, a.atty, P(u, t.attn_proj_w),
                            P(u, t.attn_proj_b), BT, C, C);
  }
  {
    // The attention residual and ln_2 in one pass.
    auto u = store_->Acquire({t.ln2_w, t.ln2_b}, Pass::kForward);
    kernels_->ResidualLayerNormForward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, acts_.tmp, P(u, t.ln2_w),
                                       P(u, t.ln2_b), BT, C);
  }
  {
    auto u = store_->Acquire({t.fc_w, t.fc_b}, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kFc, a.fch, a.ln2, P(u, t.fc_w), P(u, t.fc_b), BT, C, 4 * C);
  }
  const ActTensor gelu = GeluOutput(a);
  kernels_->GeluForward(gelu, a.fch, BT * 4 * C);
  {
    auto u = store_->Acquire({t.fc_proj_w, t.fc_proj_b}, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kFcProj, ActTensor{acts_.tmp}, gelu, P(u, t.fc_proj_w), P(u, t.fc_proj_b), BT,
                            4 * C, C);
  }
  kernels_->ResidualForward(y, a.res2, acts_.tmp, BT * C);
}

// On entry acts_.dres holds dL/dy; on exit it holds dL/dx.
void Gpt::BlockBackward(int64_t l, ActTensor x) {
  const int64_t BT = B_ * T_, C = config_.n_embd, NH = config_.n_head;
  const LayerTensors& t = layers_[size_t(l)];
  BlockActivations& a = BlockActs(l);
  Activations& g = acts_;
  // A kept GELU output is this layer's; the shared one holds this layer's
  // when the forward pass (or the recomputation) of this block was the last
  // to write it, and is recomputed otherwise.
  const ActTensor gelu = GeluOutput(a);
  if (!keep_gelu_ && !recompute_ && l != config_.n_layer - 1) kernels_->GeluForward(gelu, a.fch, BT * 4 * C);
  {
    auto u = store_->Acquire({t.fc_proj_w, t.fc_proj_b}, Pass::kBackward);
    kernels_->MatmulBackwardGelu(LinearRole::kFcProj, g.dfch, u.grad(t.fc_proj_w), u.grad(t.fc_proj_b), g.dres_gemm,
                                 gelu, P(u, t.fc_proj_w), a.fch, BT, 4 * C, C);
  }
  {
    auto u = store_->Acquire({t.fc_w, t.fc_b}, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kFc, g.dtmp, u.grad(t.fc_w), u.grad(t.fc_b), g.dfch, a.ln2,
                             P(u, t.fc_w), BT, C, 4 * C);
  }
  {
    auto u = store_->Acquire({t.ln2_w, t.ln2_b}, Pass::kBackward);
    kernels_->LayerNormBackward(g.dres, g.dres16, u.grad(t.ln2_w), u.grad(t.ln2_b), g.dtmp, a.res2, P(u, t.ln2_w),
                                a.ln2_mean, a.ln2_rstd, BT, C);
  }
  {
    auto u = store_->Acquire({t.attn_proj_w, t.attn_proj_b}, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kAttnProj, g.dtmp, u.grad(t.attn_proj_w), u.grad(t.attn_proj_b),
                             g.dres_gemm, a.atty, P(u, t.attn_proj_w), BT, C, C);
  }
  kernels_->AttentionBackward(g.dqkv, g.dtmp, a.qkv, a.atty, a.lse, B_, T_, C, NH);
  {
    auto u = store_->Acquire({t.qkv_w, t.qkv_b}, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kQkv, g.dtmp, u.grad(t.qkv_w), u.grad(t.qkv_b), g.dqkv, a.ln1,
                             P(u, t.qkv_w), BT, C, 3 * C);
  }
  {
    auto u = store_->Acquire({t.ln1_w, t.ln1_b}, Pass::kBackward);
    kernels_->LayerNormBackward(g.dres, g.dres16, u.grad(t.ln1_w), u.grad(t.ln1_b), g.dtmp, x, P(u, t.ln1_w),
                                a.ln1_mean, a.ln1_rstd, BT, C);
  }
}

void Gpt::Forward(const int32_t* tokens, const int32_t* targets, float* logits, int64_t logits_rows) {
  RunForward(tokens, targets, std::nullopt, logits, logits_rows);
}

void Gpt::TrainForward(const int32_t* tokens, const int32_t* targets, float loss_weight, float* logits) {
  RunForward(tokens, targets, loss_weight, logits, -1);
}

void Gpt::RunForward(const int32_t* tokens, const int32_t* targets, std::optional<float> loss_weight, float* logits,
                     int64_t logits_rows) {
  const int64_t BT = B_ * T_, C = config_.n_embd, L = config_.n_layer;
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size();
  Activations& a = acts_;
  kernels_->Upload(a.tokens, tokens, BT);
  kernels_->Upload(a.targets, targets, BT);
  {
    auto u = store_->Acquire({wte_, wpe_}, Pass::kForward);
    kernels_->EncoderForward(a.residual[0], a.tokens, P(u, wte_), P(u, wpe_), B_, T_, C);
  }
  for (int64_t l = 0; l < L; ++l) BlockForward(l, a.residual[size_t(l)], a.residual[size_t(l + 1)]);
  {
    auto u = store_->Acquire({lnf_w_, lnf_b_}, Pass::kForward);
    kernels_->LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual[size_t(L)], P(u, lnf_w_),
                        P(u, lnf_b_), BT, C);
  }
  // The loss block by block; in training with the whole micro-batch in one
  // block, dlogits in the same pass (backward then needs no logits again).
  const int64_t R = classifier_rows_;
  const bool dlogits_now = loss_weight.has_value() && R >= BT;
  dloss_ = loss_weight.has_value() ? *loss_weight / float(BT) : 0.0f;
  pending_ = !loss_weight.has_value() ? ClassifierBackward::kNone
             : dlogits_now            ? ClassifierBackward::kDlogitsReady
                                      : ClassifierBackward::kRecompute;
  {
    auto u = store_->Acquire({wte_}, Pass::kForward);
    const int64_t keep = logits_rows < 0 ? BT : std::min(logits_rows, BT);
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
      const int64_t n = std::min(R, BT - r0);
      kernels_->MatmulForward(LinearRole::kClassifier, a.logits, a.lnf.At(r0 * C), P(u, wte_), Param{}, n, C, Vp);
      if (logits != nullptr && r0 < keep) {
        kernels_->DownloadRows(logits + r0 * V, a.logits, std::min(n, keep - r0), V, Vp);
      }
      kernels_->CrossEntropy(a.losses + r0, a.logits, a.targets + r0, dloss_, dlogits_now, n, V, Vp);
    }
  }
  kernels_->AddToLossSum(a.losses, BT);
  loss_tokens_ += BT;
}

double Gpt::TakeLoss() { return MeanLoss(kernels_->TakeLossSum()); }

double Gpt::MeanLoss(double loss_sum) {
  const int64_t tokens = std::exchange(loss_tokens_, 0);
  return tokens > 0 ? loss_sum / double(tokens) : 0.0;
}

void Gpt::Backward() {
  const int64_t BT = B_ * T_, C = config_.n_embd, L = config_.n_layer;
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size();
  Activations& a = acts_;
  if (pending_ == ClassifierBackward::kNone) {
    std::fprintf(stderr, "pstar: internal error: Gpt::Backward without a TrainForward before it\n");
    std::abort();
  }
  // dlnf (into dtmp) and dwte from dlogits: kept from forward (dwte then
  // at the end, from the same dlogits and lnf), or per block from the
  // logits again (the same bits as in forward).
  const bool dlogits_kept = pending_ == ClassifierBackward::kDlogitsReady;
  if (dlogits_kept) {
    auto u = store_->AcquireParams({wte_});
    kernels_->MatmulBackward(LinearRole::kClassifier, a.dtmp, nullptr, nullptr, a.logits, a.lnf, P(u, wte_), BT, C, Vp);
  } else {
    auto u = store_->Acquire({wte_}, Pass::kBackward);
    const int64_t R = classifier_rows_;
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
      const int64_t n = std::min(R, BT - r0);
      kernels_->MatmulForward(LinearRole::kClassifier, a.logits, a.lnf.At(r0 * C), P(u, wte_), Param{}, n, C, Vp);
      kernels_->CrossEntropy(nullptr, a.logits, a.targets + r0, dloss_, true, n, V, Vp);
      kernels_->MatmulBackward(LinearRole::kClassifier, a.dtmp.At(r0 * C), u.grad(wte_), nullptr, a.logits,
                               a.lnf.At(r0 * C), P(u, wte_), n, C, Vp);
    }
  }
  pending_ = ClassifierBackward::kNone;
  kernels_->Zero(a.dres, BT * C);
  {
    auto u = store_->Acquire({lnf_w_, lnf_b_}, Pass::kBackward);
    kernels_->LayerNormBackward(a.dres, a.dres16, u.grad(lnf_w_), u.grad(lnf_b_), a.dtmp, a.residual[size_t(L)],
                                P(u, lnf_w_), a.lnf_mean, a.lnf_rstd, BT, C);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    // The shared block set still holds the last layer from the forward pass.
    if (recompute_ && l != L - 1) BlockForward(l, a.residual[size_t(l)], a.residual[size_t(l + 1)]);
    BlockBackward(l, a.residual[size_t(l)]);
  }
  if (dlogits_kept) {
    // The classifier's share of wte's gradient first, in a use of its own:
    // a gradient kept in 16 bits is rounded after it, as at the turn.
    auto u = store_->AcquireGrads({wte_});
    kernels_->MatmulBackward(LinearRole::kClassifier, ActTensor{}, u.grad(wte_), nullptr, a.logits, a.lnf, Param{}, BT,
                             C, Vp);
  }
  {
    // Token and position rows take their gradients; no weight is read.
    auto u = store_->AcquireGrads({wte_, wpe_});
    kernels_->EncoderBackward(u.grad(wte_), u.grad(wpe_), a.dres, a.tokens, B_, T_, C);
  }
}

}  // namespace pstar
