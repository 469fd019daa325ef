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

bool IsBias(const TensorSpec& s) { return s.role == TensorRole::kBias || s.role == TensorRole::kNormBias; }

// The elements of the largest group of tensors one block op reads.
int64_t LargestBlockGroup(const GptConfig& g) {
  const int64_t C = g.n_embd, F = g.mlp_size();
  const int64_t qkv = g.qkv_width() * C + (g.qkv_bias() ? g.qkv_width() : 0);
  return std::max({qkv, C * g.attn_width(), g.mlp_in_width() * C, C * F});
}

// A (Vp, C) vocabulary table `name` as its row parts (VocabPartRows), the
// last holding the padded rows; one whole tensor when one part holds it.
std::vector<TensorSpec> VocabTable(const GptConfig& g, const std::string& name, TensorRole role) {
  const int64_t C = g.n_embd, Vp = g.padded_vocab_size(), pad = Vp - g.vocab_size, rows = VocabPartRows(g);
  if (rows >= Vp) return {{name, {Vp, C}, role, kInitStd, pad}};
  std::vector<TensorSpec> parts;
  for (int64_t r0 = 0; r0 < Vp; r0 += rows) {
    const int64_t n = std::min(rows, Vp - r0);
    TensorSpec s{name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + n) + "]", {n, C}, role, kInitStd,
                 r0 + n == Vp ? pad : 0};
    s.part_of = name;
    s.part_row = r0;
    parts.push_back(std::move(s));
  }
  return parts;
}

// The tensors of each op that reads parameters, in forward order and, within
// an op, in layout order: the embeddings (the token table's row parts), each
// block's six (its first norm, q|k|v, the attention's output projection, its
// second norm, the MLP's two GEMMs), the final norm and an untied classifier
// (its row parts).
std::vector<std::vector<TensorSpec>> GptOps(const GptConfig& g) {
  const int64_t C = g.n_embd, F = g.mlp_size(), Vp = g.padded_vocab_size(), pad = Vp - g.vocab_size;
  const int64_t hs = g.head_size(), q = g.attn_width(), kv = g.kv_heads() * hs;
  std::vector<std::vector<TensorSpec>> ops;
  auto joined = [](TensorSpec s) {
    s.joined = true;
    return s;
  };
  if (g.architecture == Architecture::kGpt2) {
    // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
    const float proj_std = kInitStd / std::sqrt(2.0f * float(g.n_layer));
    ops.push_back({{"transformer.wte.weight", {Vp, C}, TensorRole::kEmbedding, kInitStd, pad},
                   {"transformer.wpe.weight", {g.max_seq_len, C}, TensorRole::kEmbedding, kInitStd}});
    for (int64_t l = 0; l < g.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      ops.push_back({{p + "ln_1.weight", {C}, TensorRole::kNormWeight, 0}, {p + "ln_1.bias", {C}, TensorRole::kNormBias, 0}});
      ops.push_back({{p + "attn.c_attn.weight", {3 * C, C}, TensorRole::kWeight, kInitStd},
                     {p + "attn.c_attn.bias", {3 * C}, TensorRole::kBias, 0}});
      ops.push_back({{p + "attn.c_proj.weight", {C, C}, TensorRole::kWeight, proj_std},
                     {p + "attn.c_proj.bias", {C}, TensorRole::kBias, 0}});
      ops.push_back({{p + "ln_2.weight", {C}, TensorRole::kNormWeight, 0}, {p + "ln_2.bias", {C}, TensorRole::kNormBias, 0}});
      ops.push_back({{p + "mlp.c_fc.weight", {F, C}, TensorRole::kWeight, kInitStd},
                     {p + "mlp.c_fc.bias", {F}, TensorRole::kBias, 0}});
      ops.push_back({{p + "mlp.c_proj.weight", {C, F}, TensorRole::kWeight, proj_std},
                     {p + "mlp.c_proj.bias", {C}, TensorRole::kBias, 0}});
    }
    ops.push_back({{"transformer.ln_f.weight", {C}, TensorRole::kNormWeight, 0},
                   {"transformer.ln_f.bias", {C}, TensorRole::kNormBias, 0}});
    return ops;
  }
  // The Llama family (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM):
  // every linear layer initialized normal(0, 0.02) as their
  // initializer_range says.
  ops.push_back(VocabTable(g, "model.embed_tokens.weight", TensorRole::kEmbedding));
  for (int64_t l = 0; l < g.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ops.push_back({{p + "input_layernorm.weight", {C}, TensorRole::kNormWeight, 0}});
    std::vector<TensorSpec> qkv = {{p + "self_attn.q_proj.weight", {q, C}, TensorRole::kWeight, kInitStd},
                                   joined({p + "self_attn.k_proj.weight", {kv, C}, TensorRole::kWeight, kInitStd}),
                                   joined({p + "self_attn.v_proj.weight", {kv, C}, TensorRole::kWeight, kInitStd})};
    if (g.qkv_bias()) {
      qkv.push_back({p + "self_attn.q_proj.bias", {q}, TensorRole::kBias, 0});
      qkv.push_back(joined({p + "self_attn.k_proj.bias", {kv}, TensorRole::kBias, 0}));
      qkv.push_back(joined({p + "self_attn.v_proj.bias", {kv}, TensorRole::kBias, 0}));
    }
    ops.push_back(std::move(qkv));
    ops.push_back({{p + "self_attn.o_proj.weight", {C, q}, TensorRole::kWeight, kInitStd}});
    ops.push_back({{p + "post_attention_layernorm.weight", {C}, TensorRole::kNormWeight, 0}});
    ops.push_back({{p + "mlp.gate_proj.weight", {F, C}, TensorRole::kWeight, kInitStd},
                   joined({p + "mlp.up_proj.weight", {F, C}, TensorRole::kWeight, kInitStd})});
    ops.push_back({{p + "mlp.down_proj.weight", {C, F}, TensorRole::kWeight, kInitStd}});
  }
  ops.push_back({{"model.norm.weight", {C}, TensorRole::kNormWeight, 0}});
  if (!g.tied_embeddings) ops.push_back(VocabTable(g, "lm_head.weight", TensorRole::kWeight));
  return ops;
}

}  // namespace

int64_t VocabPartRows(const GptConfig& g) {
  const int64_t Vp = g.padded_vocab_size();
  if (g.architecture == Architecture::kGpt2) return Vp;
  const int64_t fit = std::max<int64_t>(64, LargestBlockGroup(g) / g.n_embd / 64 * 64);
  if (fit >= Vp) return Vp;
  // As many parts as that takes, evened out (64-row multiples).
  const int64_t parts = (Vp + fit - 1) / fit;
  return ((Vp + parts - 1) / parts + 63) / 64 * 64;
}

std::vector<TensorSpec> GptTensorSpecs(const GptConfig& g) {
  std::vector<TensorSpec> s;
  for (std::vector<TensorSpec>& op : GptOps(g)) {
    for (TensorSpec& t : op) s.push_back(std::move(t));
  }
  return s;
}

std::vector<TensorSpec> GptVisibleTensorSpecs(const GptConfig& g) {
  std::vector<TensorSpec> specs;
  for (const TensorSpec& part : GptTensorSpecs(g)) {
    if (!part.part_of.empty() && part.part_row > 0) {
      specs.back().shape[0] += part.visible_shape()[0];  // the next rows of the same tensor
      continue;
    }
    TensorSpec s = part;
    s.name = part.tensor();
    s.part_of.clear();
    s.part_row = 0;
    s.shape = s.visible_shape();
    s.padded_rows = 0;
    specs.push_back(std::move(s));
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
          // Keyed by the whole tensor's elements: a row part holds the values
          // the whole tensor would.
          FillNormal(p, n, spec.init_std, seed, StableKey(spec.tensor()), uint64_t(spec.tensor_offset() + s.begin));
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
  const std::vector<std::vector<TensorSpec>> ops = GptOps(g);
  std::vector<std::vector<TensorId>> ids;
  for (const auto& op : ops) {
    std::vector<TensorId> v;
    for (const TensorSpec& t : op) v.push_back(layout.Find(t.name));
    ids.push_back(std::move(v));
  }
  // ids: the embeddings, kBlockOps per layer, the final norm, [the classifier].
  constexpr size_t kPerLayer = 6;
  auto layer_op = [&](int64_t l, size_t op) { return ids[1 + size_t(l) * kPerLayer + op]; };
  const std::vector<TensorId>& embed = ids.front();
  const std::vector<TensorId>& final_norm = ids[1 + size_t(g.n_layer) * kPerLayer];
  // The vocabulary tables' moments: one for a whole table (GPT-2's with its
  // position table), one per row part otherwise.
  const bool parted = !ops.front().front().part_of.empty();
  const std::vector<TensorId> cls = !g.tied_embeddings ? ids.back()
                                    : parted          ? embed
                                                      : std::vector<TensorId>{embed.front()};
  auto moments = [&](const std::vector<TensorId>& whole) {
    std::vector<std::vector<TensorId>> m;
    if (!parted) return std::vector<std::vector<TensorId>>{whole};
    for (TensorId id : whole) m.push_back({id});
    return m;
  };
  const std::vector<std::vector<TensorId>> embed_moments = moments(embed);
  const std::vector<std::vector<TensorId>> cls_moments = moments(cls);
  const int64_t R = ClassifierRows(g, tokens);
  const int64_t blocks = parted ? (tokens + R - 1) / R : 1;
  auto block_forward = [&](std::vector<AccessMoment>& seq, int64_t l) {
    for (size_t op = 0; op < kPerLayer; ++op) seq.push_back({layer_op(l, op), Pass::kForward});
  };
  std::vector<AccessMoment> seq;
  for (const auto& m : embed_moments) seq.push_back({m, Pass::kForward});
  for (int64_t l = 0; l < g.n_layer; ++l) block_forward(seq, l);
  seq.push_back({final_norm, Pass::kForward});
  for (int64_t b = 0; b < blocks; ++b) {
    for (const auto& m : cls_moments) seq.push_back({m, Pass::kForward});
  }
  // With dlogits kept, the classifier's input gradient reads its weight and
  // its weight gradient waits for the embeddings' backward (Gpt::Backward);
  // otherwise a parted classifier computes each block's logits part by part
  // again, then takes each part's gradients.
  const bool dlogits_kept = ClassifierKeepsLogits(g, tokens);
  if (dlogits_kept || !parted) {
    for (const auto& m : cls_moments) seq.push_back({m, Pass::kBackward, /*params=*/true, /*grads=*/!dlogits_kept});
  } else {
    for (int64_t b = 0; b < blocks; ++b) {
      for (const auto& m : cls_moments) seq.push_back({m, Pass::kBackward, /*params=*/true, /*grads=*/false});
      for (const auto& m : cls_moments) seq.push_back({m, Pass::kBackward});
    }
  }
  seq.push_back({final_norm, Pass::kBackward});
  for (int64_t l = g.n_layer - 1; l >= 0; --l) {
    if (recompute && l != g.n_layer - 1) block_forward(seq, l);
    for (size_t op = kPerLayer; op-- > 0;) seq.push_back({layer_op(l, op), Pass::kBackward});
  }
  if (dlogits_kept) {
    for (const auto& m : cls_moments) seq.push_back({m, Pass::kBackward, /*params=*/false});  // weight gradients
  }
  // The embeddings' backward reads no weight.
  for (const auto& m : embed_moments) seq.push_back({m, Pass::kBackward, /*params=*/false});
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
      classifier_rows_(ClassifierRows(config, batch * seq)),
      rotary_(config.positions == PositionKind::kRotary) {}

Result<Gpt> Gpt::Create(const GptConfig& config, ParamStore& store, Arena& arena, int64_t batch, int64_t seq,
                        bool recompute, std::unique_ptr<ModelKernels> kernels, bool keep_gelu) {
  if (seq > config.max_seq_len) {
    return Status::InvalidArgument("sequence length " + std::to_string(seq) +
                                   " exceeds the model's max_seq_len " +
                                   std::to_string(config.max_seq_len));
  }
  if (kernels == nullptr) kernels = MakeCpuModelKernels();
  const bool llama_ops = config.norm == NormKind::kRmsNorm || config.positions == PositionKind::kRotary ||
                         config.mlp == MlpKind::kSwiGlu || config.kv_heads() != config.n_head ||
                         VocabPartRows(config) < config.padded_vocab_size();
  if (llama_ops && !kernels->HasLlamaOps()) {
    return Status::FailedPrecondition(std::string("the ") + ArchitectureName(config.architecture) +
                                      " architecture runs on runtime.device cpu only in this version (its " +
                                      ComputeDeviceName(kernels->device()) + " kernels are not built yet)");
  }
  Gpt gpt(config, batch, seq, recompute, kernels->compute(), keep_gelu);
  gpt.kernels_ = std::move(kernels);
  gpt.store_ = &store;
  const ParamLayout& layout = store.layout();
  auto op_tensors = [&](const std::vector<TensorSpec>& specs) -> Result<OpTensors> {
    OpTensors t;
    for (const TensorSpec& spec : specs) {
      const TensorId id = layout.Find(spec.name);
      if (id < 0) return Status::Internal("layout has no tensor " + spec.name);
      t.ids.push_back(id);
      if (IsBias(spec) && t.b < 0) t.b = id;
      if (!IsBias(spec) && t.w < 0) t.w = id;
    }
    return t;
  };
  // A vocabulary table's row parts (one whole part when it is not split).
  auto row_parts = [&](const std::vector<TensorSpec>& specs) -> Result<std::vector<RowPart>> {
    std::vector<RowPart> parts;
    for (const TensorSpec& spec : specs) {
      if (spec.tensor() != specs.front().tensor()) continue;  // GPT-2's position table
      const TensorId id = layout.Find(spec.name);
      if (id < 0) return Status::Internal("layout has no tensor " + spec.name);
      parts.push_back({id, spec.part_row, spec.shape[0]});
    }
    return parts;
  };
  const std::vector<std::vector<TensorSpec>> ops = GptOps(config);
  PSTAR_ASSIGN_OR_RETURN(OpTensors embed, op_tensors(ops.front()));
  PSTAR_ASSIGN_OR_RETURN(gpt.embed_parts_, row_parts(ops.front()));
  gpt.wpe_ = config.positions == PositionKind::kLearned ? embed.ids[1] : -1;
  size_t next = 1;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    LayerTensors t;
    for (OpTensors& op : t) {
      PSTAR_ASSIGN_OR_RETURN(op, op_tensors(ops[next++]));
    }
    gpt.layers_.push_back(std::move(t));
  }
  PSTAR_ASSIGN_OR_RETURN(gpt.final_norm_, op_tensors(ops[next++]));
  gpt.cls_parts_ = gpt.embed_parts_;
  if (!config.tied_embeddings) {
    PSTAR_ASSIGN_OR_RETURN(gpt.cls_parts_, row_parts(ops[next++]));
  }
  PSTAR_RETURN_IF_ERROR(gpt.Carve(arena));
  gpt.kernels_->SetScratch(gpt.acts_.scratch, KernelScratchBytes(gpt.compute_, config, batch, seq));
  if (gpt.rotary_) {
    // Each row's positions from 0, and the tables for this many positions
    // (an entry does not depend on the table's length).
    const int64_t half = config.head_size() / 2;
    std::vector<float> cos(size_t(seq * half)), sin(size_t(seq * half));
    kernels::RopeTables(cos.data(), sin.data(), seq, config.head_size(), config.rope_theta, config.rope_scaling);
    std::vector<int32_t> positions(size_t(batch * seq));
    for (int64_t i = 0; i < batch * seq; ++i) positions[size_t(i)] = int32_t(i % seq);
    gpt.kernels_->Upload(gpt.acts_.rope_cos, cos.data(), seq * half);
    gpt.kernels_->Upload(gpt.acts_.rope_sin, sin.data(), seq * half);
    gpt.kernels_->Upload(gpt.acts_.positions, positions.data(), batch * seq);
    gpt.rope_ = {gpt.acts_.rope_cos, gpt.acts_.rope_sin, gpt.acts_.positions};
  }
  return gpt;
}

template <typename Alloc>
void Gpt::Lay(Alloc&& alloc) {
  const GptConfig& cfg = config_;
  const int64_t BT = B_ * T_, C = cfg.n_embd, BTC = BT * C;
  const int64_t lse = B_ * cfg.n_head * T_;  // attention keeps no T×T matrix
  const int64_t qkv = cfg.qkv_width(), att = cfg.attn_width(), mlp_in = cfg.mlp_in_width(), F = cfg.mlp_size();
  const bool layernorm = cfg.norm == NormKind::kLayerNorm;
  // alloc takes a count of 4-byte words.
  auto f = [&](int64_t n) { return static_cast<float*>(alloc(n)); };
  // n elements in the run's activation format (ActTensor).
  auto g = [&](int64_t n) {
    if (compute_.precision == Precision::kFp32) return ActTensor{f(n), nullptr};
    return ActTensor{nullptr, static_cast<uint16_t*>(alloc((n + 1) / 2))};
  };
  Activations& a = acts_;
  a.blocks.assign(size_t(recompute_ ? 1 : cfg.n_layer), BlockActivations{});
  for (auto& b : a.blocks) {
    b.ln1 = g(BTC);
    b.ln1_mean = layernorm ? f(BT) : nullptr;
    b.ln1_rstd = f(BT);
    b.qkv = g(BT * qkv);
    b.lse = f(lse);
    b.atty = g(BT * att);
    b.res2 = g(BTC);
    b.ln2 = g(BTC);
    b.ln2_mean = layernorm ? f(BT) : nullptr;
    b.ln2_rstd = f(BT);
    b.fch = g(BT * mlp_in);
    if (keep_gelu_) b.fch_gelu = g(BT * F);
  }
  a.residual.clear();
  for (int64_t l = 0; l <= cfg.n_layer; ++l) a.residual.push_back(g(BTC));
  a.lnf = g(BTC);
  a.lnf_mean = layernorm ? f(BT) : nullptr;
  a.lnf_rstd = f(BT);
  a.logits = g(classifier_rows_ * cfg.padded_vocab_size());
  a.losses = f(BT);
  a.tmp = f(BTC);
  a.fch_gelu = keep_gelu_ ? ActTensor{} : g(BT * F);
  a.dres = f(BTC);
  a.dres16 = compute_.precision == Precision::kFp32 ? ActTensor{} : g(BTC);
  a.dres_gemm = compute_.precision == Precision::kFp32 ? ActTensor{a.dres} : a.dres16;
  a.dtmp = g(BT * std::max(C, att));
  a.dqkv = g(BT * qkv);
  a.dfch = g(BT * mlp_in);
  a.dmlp = cfg.mlp == MlpKind::kSwiGlu ? g(BT * F) : ActTensor{};
  a.tokens = static_cast<int32_t*>(alloc(BT));  // int32: same size as float
  a.targets = static_cast<int32_t*>(alloc(BT));
  a.positions = static_cast<int32_t*>(alloc(BT));
  if (rotary_) {
    a.rope_cos = f(T_ * (cfg.head_size() / 2));
    a.rope_sin = f(T_ * (cfg.head_size() / 2));
  } else {
    a.rope_cos = a.rope_sin = nullptr;
  }
  const int64_t scratch = KernelScratchBytes(compute_, cfg, B_, T_);
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

void Gpt::NormForward(const OpTensors& t, ActTensor out, float* mean, float* rstd, ActTensor inp) {
  const int64_t BT = B_ * T_, C = config_.n_embd;
  auto u = store_->Acquire(t.ids, Pass::kForward);
  if (config_.norm == NormKind::kLayerNorm) {
    kernels_->LayerNormForward(out, mean, rstd, inp, P(u, t.w), P(u, t.b), BT, C);
  } else {
    kernels_->RmsNormForward(out, rstd, inp, P(u, t.w), float(config_.norm_eps), BT, C);
  }
}

// dres += the norm's input gradient from dout (and its 16-bit copy).
void Gpt::NormBackward(const OpTensors& t, ActTensor dout, ActTensor inp, const float* mean, const float* rstd) {
  const int64_t BT = B_ * T_, C = config_.n_embd;
  Activations& a = acts_;
  auto u = store_->Acquire(t.ids, Pass::kBackward);
  if (config_.norm == NormKind::kLayerNorm) {
    kernels_->LayerNormBackward(a.dres, a.dres16, G(u, t.w), G(u, t.b), dout, inp, P(u, t.w), mean, rstd, BT, C);
  } else {
    kernels_->RmsNormBackward(a.dres, a.dres16, G(u, t.w), dout, inp, P(u, t.w), rstd, BT, C);
  }
}

void Gpt::MlpActivation(ActTensor out, ActTensor fch) {
  const int64_t BT = B_ * T_, F = config_.mlp_size();
  if (config_.mlp == MlpKind::kGelu) {
    kernels_->GeluForward(out, fch, BT * F);
  } else {
    kernels_->SwiGluForward(out, fch, BT, F);
  }
}

void Gpt::BlockForward(int64_t l, ActTensor x, ActTensor y) {
  const int64_t BT = B_ * T_, C = config_.n_embd;
  const int64_t qkv = config_.qkv_width(), att = config_.attn_width(), mlp_in = config_.mlp_in_width();
  const int64_t F = config_.mlp_size();
  const LayerTensors& t = layers_[size_t(l)];
  BlockActivations& a = BlockActs(l);
  NormForward(t[kNorm1], a.ln1, a.ln1_mean, a.ln1_rstd, x);
  {
    auto u = store_->Acquire(t[kQkv].ids, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kQkv, a.qkv, a.ln1, P(u, t[kQkv].w), P(u, t[kQkv].b), BT, C, qkv);
  }
  if (rotary_) kernels_->RopeForward(a.qkv, Shape(), rope_);
  kernels_->AttentionForward(a.atty, a.lse, a.qkv, Shape());
  {
    const OpTensors& p = t[kAttnProj];
    auto u = store_->Acquire(p.ids, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kAttnProj, ActTensor{acts_.tmp}, a.atty, P(u, p.w), P(u, p.b), BT, att, C);
  }
  {
    // The attention residual and the second norm in one pass.
    const OpTensors& n = t[kNorm2];
    auto u = store_->Acquire(n.ids, Pass::kForward);
    if (config_.norm == NormKind::kLayerNorm) {
      kernels_->ResidualLayerNormForward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, acts_.tmp, P(u, n.w), P(u, n.b),
                                         BT, C);
    } else {
      kernels_->ResidualRmsNormForward(a.res2, a.ln2, a.ln2_rstd, x, acts_.tmp, P(u, n.w), float(config_.norm_eps),
                                       BT, C);
    }
  }
  {
    auto u = store_->Acquire(t[kFc].ids, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kFc, a.fch, a.ln2, P(u, t[kFc].w), P(u, t[kFc].b), BT, C, mlp_in);
  }
  const ActTensor act = GeluOutput(a);
  MlpActivation(act, a.fch);
  {
    const OpTensors& p = t[kFcProj];
    auto u = store_->Acquire(p.ids, Pass::kForward);
    kernels_->MatmulForward(LinearRole::kFcProj, ActTensor{acts_.tmp}, act, P(u, p.w), P(u, p.b), BT, F, C);
  }
  kernels_->ResidualForward(y, a.res2, acts_.tmp, BT * C);
}

// On entry acts_.dres holds dL/dy; on exit it holds dL/dx.
void Gpt::BlockBackward(int64_t l, ActTensor x) {
  const int64_t BT = B_ * T_, C = config_.n_embd;
  const int64_t qkv = config_.qkv_width(), att = config_.attn_width(), mlp_in = config_.mlp_in_width();
  const int64_t F = config_.mlp_size();
  const LayerTensors& t = layers_[size_t(l)];
  BlockActivations& a = BlockActs(l);
  Activations& g = acts_;
  // A kept activation output is this layer's; the shared one holds this
  // layer's when the forward pass (or the recomputation) of this block was
  // the last to write it, and is recomputed otherwise.
  const ActTensor act = GeluOutput(a);
  if (!keep_gelu_ && !recompute_ && l != config_.n_layer - 1) MlpActivation(act, a.fch);
  {
    const OpTensors& p = t[kFcProj];
    auto u = store_->Acquire(p.ids, Pass::kBackward);
    if (config_.mlp == MlpKind::kGelu) {
      kernels_->MatmulBackwardGelu(LinearRole::kFcProj, g.dfch, G(u, p.w), G(u, p.b), g.dres_gemm, act, P(u, p.w),
                                   a.fch, BT, F, C);
    } else {
      kernels_->MatmulBackward(LinearRole::kFcProj, g.dmlp, G(u, p.w), G(u, p.b), g.dres_gemm, act, P(u, p.w), BT,
                               F, C);
    }
  }
  if (config_.mlp == MlpKind::kSwiGlu) kernels_->SwiGluBackward(g.dfch, a.fch, g.dmlp, BT, F);
  {
    const OpTensors& p = t[kFc];
    auto u = store_->Acquire(p.ids, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kFc, g.dtmp, G(u, p.w), G(u, p.b), g.dfch, a.ln2, P(u, p.w), BT, C, mlp_in);
  }
  NormBackward(t[kNorm2], g.dtmp, a.res2, a.ln2_mean, a.ln2_rstd);
  {
    const OpTensors& p = t[kAttnProj];
    auto u = store_->Acquire(p.ids, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kAttnProj, g.dtmp, G(u, p.w), G(u, p.b), g.dres_gemm, a.atty, P(u, p.w), BT,
                             att, C);
  }
  kernels_->AttentionBackward(g.dqkv, g.dtmp, a.qkv, a.atty, a.lse, Shape(), Rope());
  {
    const OpTensors& p = t[kQkv];
    auto u = store_->Acquire(p.ids, Pass::kBackward);
    kernels_->MatmulBackward(LinearRole::kQkv, g.dtmp, G(u, p.w), G(u, p.b), g.dqkv, a.ln1, P(u, p.w), BT, C, qkv);
  }
  NormBackward(t[kNorm1], g.dtmp, x, a.ln1_mean, a.ln1_rstd);
}

void Gpt::Forward(const MicroBatch& batch, float* logits, int64_t logits_rows) {
  RunForward(batch, std::nullopt, logits, logits_rows);
}

void Gpt::TrainForward(const MicroBatch& batch, float token_weight, float* logits) {
  RunForward(batch, token_weight, logits, -1);
}

void Gpt::RunForward(const MicroBatch& batch, std::optional<float> token_weight, float* logits,
                     int64_t logits_rows) {
  const int64_t BT = B_ * T_, C = config_.n_embd, L = config_.n_layer;
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size();
  Activations& a = acts_;
  kernels_->Upload(a.tokens, batch.tokens, BT);
  kernels_->Upload(a.targets, batch.targets, BT);
  if (batch.positions != nullptr || packed_) {
    std::vector<int32_t> rows;
    const int32_t* positions = batch.positions;
    if (positions == nullptr) {  // back to each row from 0
      rows.resize(size_t(BT));
      for (int64_t i = 0; i < BT; ++i) rows[size_t(i)] = int32_t(i % T_);
      positions = rows.data();
    }
    kernels_->Upload(a.positions, positions, BT);
    packed_ = batch.positions != nullptr;
  }
  if (embed_parts_.size() == 1) {
    const TensorId wte = embed_parts_[0].id;
    auto u = store_->Acquire(wpe_ < 0 ? std::vector<TensorId>{wte} : std::vector<TensorId>{wte, wpe_}, Pass::kForward);
    kernels_->EncoderForward(a.residual[0], a.tokens, packed_ ? a.positions : nullptr, P(u, wte), P(u, wpe_), B_, T_,
                             C);
  } else {
    // Part by part, each writing its tokens' rows.
    for (const RowPart& part : embed_parts_) {
      auto u = store_->Acquire({part.id}, Pass::kForward);
      kernels_->EncoderPartForward(a.residual[0], a.tokens, P(u, part.id), part.row0, part.rows, B_, T_, C);
    }
  }
  for (int64_t l = 0; l < L; ++l) BlockForward(l, a.residual[size_t(l)], a.residual[size_t(l + 1)]);
  NormForward(final_norm_, a.lnf, a.lnf_mean, a.lnf_rstd, a.residual[size_t(L)]);
  // The loss block by block; in training with the whole micro-batch in one
  // block, dlogits in the same pass (backward then needs no logits again).
  const int64_t R = classifier_rows_;
  const bool dlogits_now = token_weight.has_value() && R >= BT;
  dloss_ = token_weight.value_or(0.0f);
  pending_ = !token_weight.has_value() ? ClassifierBackward::kNone
             : dlogits_now            ? ClassifierBackward::kDlogitsReady
                                      : ClassifierBackward::kRecompute;
  const int64_t keep = logits_rows < 0 ? BT : std::min(logits_rows, BT);
  auto loss_block = [&](int64_t r0, int64_t n) {
    if (logits != nullptr && r0 < keep) kernels_->DownloadRows(logits + r0 * V, a.logits, std::min(n, keep - r0), V, Vp);
    kernels_->CrossEntropy(a.losses + r0, a.logits, a.targets + r0, dloss_, dlogits_now, n, V, Vp);
  };
  if (cls_parts_.size() == 1) {
    const TensorId cls = cls_parts_[0].id;
    auto u = store_->Acquire({cls}, Pass::kForward);
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
      const int64_t n = std::min(R, BT - r0);
      kernels_->MatmulForward(LinearRole::kClassifier, a.logits, a.lnf.At(r0 * C), P(u, cls), Param{}, n, C, Vp);
      loss_block(r0, n);
    }
  } else {
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
      const int64_t n = std::min(R, BT - r0);
      ClassifierPartsForward(r0, n, Pass::kForward);
      loss_block(r0, n);
    }
  }
  kernels_->AddToLossSum(a.losses, BT);
  for (int64_t i = 0; i < BT; ++i) loss_tokens_ += batch.targets[i] >= 0 ? 1 : 0;
}

double Gpt::TakeLoss() {
  const LossTotals t = TakeLossTotals();
  return t.positions > 0 ? t.sum / double(t.positions) : 0.0;
}

Gpt::LossTotals Gpt::TakeLossTotals() { return LossTotalsOf(kernels_->TakeLossSum()); }

Gpt::LossTotals Gpt::LossTotalsOf(double loss_sum) { return {loss_sum, std::exchange(loss_tokens_, 0)}; }

void Gpt::Backward() {
  const int64_t BT = B_ * T_, C = config_.n_embd, L = config_.n_layer;
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size();
  Activations& a = acts_;
  if (pending_ == ClassifierBackward::kNone) {
    std::fprintf(stderr, "pstar: internal error: Gpt::Backward without a TrainForward before it\n");
    std::abort();
  }
  // dlnf (into dtmp) and the classifier's weight gradient from dlogits:
  // kept from forward (the weight gradient then at the end, from the same
  // dlogits and lnf), or per block from the logits again (the same bits as
  // in forward).
  const bool dlogits_kept = pending_ == ClassifierBackward::kDlogitsReady;
  if (cls_parts_.size() == 1) {
    const TensorId cls = cls_parts_[0].id;
    if (dlogits_kept) {
      auto u = store_->AcquireParams({cls});
      kernels_->MatmulBackward(LinearRole::kClassifier, a.dtmp, nullptr, nullptr, a.logits, a.lnf, P(u, cls), BT, C,
                               Vp);
    } else {
      auto u = store_->Acquire({cls}, Pass::kBackward);
      const int64_t R = classifier_rows_;
      for (int64_t r0 = 0; r0 < BT; r0 += R) {
        const int64_t n = std::min(R, BT - r0);
        kernels_->MatmulForward(LinearRole::kClassifier, a.logits, a.lnf.At(r0 * C), P(u, cls), Param{}, n, C, Vp);
        kernels_->CrossEntropy(nullptr, a.logits, a.targets + r0, dloss_, true, n, V, Vp);
        kernels_->MatmulBackward(LinearRole::kClassifier, a.dtmp.At(r0 * C), u.grad(cls), nullptr, a.logits,
                                 a.lnf.At(r0 * C), P(u, cls), n, C, Vp);
      }
    }
  } else if (dlogits_kept) {
    ClassifierPartsInputGrad(0, BT, /*weight_grads=*/false);
  } else {
    // Each block's logits part by part again (the same bits as in forward),
    // its dlogits, then each part's gradients.
    const int64_t R = classifier_rows_;
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
      const int64_t n = std::min(R, BT - r0);
      ClassifierPartsForward(r0, n, Pass::kBackward);
      kernels_->CrossEntropy(nullptr, a.logits, a.targets + r0, dloss_, true, n, V, Vp);
      ClassifierPartsInputGrad(r0, n, /*weight_grads=*/true);
    }
  }
  pending_ = ClassifierBackward::kNone;
  kernels_->Zero(a.dres, BT * C);
  NormBackward(final_norm_, a.dtmp, a.residual[size_t(L)], a.lnf_mean, a.lnf_rstd);
  for (int64_t l = L - 1; l >= 0; --l) {
    // The shared block set still holds the last layer from the forward pass.
    if (recompute_ && l != L - 1) BlockForward(l, a.residual[size_t(l)], a.residual[size_t(l + 1)]);
    BlockBackward(l, a.residual[size_t(l)]);
  }
  if (dlogits_kept) {
    // The classifier's weight gradient first, in a use of its own: a
    // gradient kept in 16 bits is rounded after it, as at the turn.
    for (const RowPart& part : cls_parts_) {
      auto u = store_->AcquireGrads({part.id});
      if (cls_parts_.size() == 1) {
        kernels_->MatmulBackward(LinearRole::kClassifier, ActTensor{}, u.grad(part.id), nullptr, a.logits, a.lnf,
                                 Param{}, BT, C, Vp);
      } else {
        kernels_->ClassifierPartBackward(nullptr, false, u.grad(part.id), a.logits, a.lnf, Param{}, BT, C, part.row0,
                                         part.rows, Vp);
      }
    }
  }
  // Token (and position) rows take their gradients; no weight is read.
  if (embed_parts_.size() == 1) {
    const TensorId wte = embed_parts_[0].id;
    auto u = store_->AcquireGrads(wpe_ < 0 ? std::vector<TensorId>{wte} : std::vector<TensorId>{wte, wpe_});
    kernels_->EncoderBackward(u.grad(wte), G(u, wpe_), a.dres, a.tokens, packed_ ? a.positions : nullptr, B_, T_, C);
  } else {
    for (const RowPart& part : embed_parts_) {
      auto u = store_->AcquireGrads({part.id});
      kernels_->EncoderPartBackward(u.grad(part.id), a.dres, a.tokens, part.row0, part.rows, B_, T_, C);
    }
  }
}

void Gpt::ClassifierPartsForward(int64_t r0, int64_t n, Pass pass) {
  const int64_t C = config_.n_embd, Vp = config_.padded_vocab_size();
  for (const RowPart& part : cls_parts_) {
    auto u = pass == Pass::kForward ? store_->Acquire({part.id}, pass) : store_->AcquireParams({part.id});
    kernels_->ClassifierPartForward(acts_.logits, acts_.lnf.At(r0 * C), P(u, part.id), n, C, part.row0, part.rows,
                                    Vp);
  }
}

void Gpt::ClassifierPartsInputGrad(int64_t r0, int64_t n, bool weight_grads) {
  const int64_t C = config_.n_embd, Vp = config_.padded_vocab_size();
  Activations& a = acts_;
  // dlnf summed over the parts in fp32, in part order: in place in an fp32
  // run, else in the projections' workspace and rounded once.
  const bool fp32 = compute_.precision == Precision::kFp32;
  float* sum = fp32 ? a.dtmp.f32 + r0 * C : a.tmp + r0 * C;
  for (size_t p = 0; p < cls_parts_.size(); ++p) {
    const RowPart& part = cls_parts_[p];
    auto u = weight_grads ? store_->Acquire({part.id}, Pass::kBackward) : store_->AcquireParams({part.id});
    kernels_->ClassifierPartBackward(sum, /*accumulate=*/p > 0, weight_grads ? u.grad(part.id) : nullptr, a.logits,
                                     a.lnf.At(r0 * C), P(u, part.id), n, C, part.row0, part.rows, Vp);
  }
  if (!fp32) kernels_->Narrow(a.dtmp.At(r0 * C), sum, n * C);
}

}  // namespace pstar
