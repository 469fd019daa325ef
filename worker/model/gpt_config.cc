#include "worker/model/gpt_config.h"

namespace pstar {

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kGpt2: return "gpt2";
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kMistral: return "mistral";
  }
  return "?";
}
const char* NormKindName(NormKind k) { return k == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }
const char* PositionKindName(PositionKind k) { return k == PositionKind::kLearned ? "learned" : "rope"; }
const char* MlpKindName(MlpKind k) { return k == MlpKind::kGelu ? "gelu" : "swiglu"; }
const char* LinearBiasName(LinearBias b) {
  return b == LinearBias::kAll ? "all" : b == LinearBias::kQkv ? "qkv" : "none";
}

GptConfig ArchitectureDefaults(Architecture a) {
  GptConfig g;
  g.architecture = a;
  if (a == Architecture::kGpt2) return g;
  // LlamaConfig, Qwen2Config and MistralConfig's defaults.
  g.norm = NormKind::kRmsNorm;
  g.norm_eps = 1e-6;
  g.positions = PositionKind::kRotary;
  g.rope_theta = 10000.0;
  g.mlp = MlpKind::kSwiGlu;
  g.linear_bias = a == Architecture::kQwen2 ? LinearBias::kQkv : LinearBias::kNone;
  g.tied_embeddings = false;
  return g;
}

std::optional<DescriptionProblem> CheckDescription(const GptConfig& g) {
  const std::string arch = ArchitectureName(g.architecture);
  const GptConfig d = ArchitectureDefaults(g.architecture);
  auto problem = [](std::string field, std::string why) { return DescriptionProblem{std::move(field), std::move(why)}; };
  auto its = [&](const char* what, const char* is, const char* has) {
    return std::string(is) + " is not " + arch + "'s " + what + " (" + arch + " has " + has + ")";
  };
  if (g.norm != d.norm) return problem("norm", its("norm", NormKindName(g.norm), NormKindName(d.norm)));
  if (g.positions != d.positions) {
    return problem("positions", its("positions", PositionKindName(g.positions), PositionKindName(d.positions)));
  }
  if (g.mlp != d.mlp) return problem("mlp", its("MLP", MlpKindName(g.mlp), MlpKindName(d.mlp)));
  if (g.linear_bias != d.linear_bias) {
    return problem("linear_bias", its("linear biases", LinearBiasName(g.linear_bias), LinearBiasName(d.linear_bias)));
  }
  if (g.n_head <= 0 || g.n_embd <= 0) return problem("n_head", "must be positive");
  if (g.kv_heads() <= 0 || g.n_head % g.kv_heads() != 0) {
    return problem("n_kv_head", std::to_string(g.kv_heads()) + " does not divide n_head " + std::to_string(g.n_head));
  }
  if (g.head_dim == 0 && g.n_embd % g.n_head != 0) {
    return problem("n_head", std::to_string(g.n_head) + " does not divide n_embd " + std::to_string(g.n_embd) +
                                 (g.architecture == Architecture::kGpt2 ? "" : " (or give model.head_dim)"));
  }
  if (g.head_size() <= 0) return problem("head_dim", "must be positive");
  if (g.architecture == Architecture::kGpt2) {
    if (g.kv_heads() != g.n_head) return problem("n_kv_head", "must equal n_head: gpt2 has multi-head attention");
    if (g.head_size() * g.n_head != g.n_embd) return problem("head_dim", "must be n_embd / n_head in gpt2");
    if (!g.tied_embeddings) return problem("tie_word_embeddings", "must be true: gpt2 ties its embeddings");
    if (g.norm_eps != 1e-5) return problem("norm_eps", "must be 1e-05 in gpt2 (its LayerNorm's epsilon)");
  } else if (g.intermediate_size <= 0) {
    return problem("intermediate_size", "is required for " + arch + " (the MLP's width)");
  }
  if (!(g.norm_eps > 0) || !(g.norm_eps < 1)) return problem("norm_eps", "must be in (0, 1)");
  if (g.positions == PositionKind::kRotary) {
    if (g.head_size() % 2 != 0) {
      return problem("head_dim", "is " + std::to_string(g.head_size()) + ", odd; RoPE rotates pairs of columns");
    }
    if (!(g.rope_theta > 1)) return problem("rope_theta", "must be more than 1");
  } else if (g.rope_scaling.llama3) {
    return problem("rope_scaling", "is set but positions are learned (it scales RoPE)");
  }
  const kernels::RopeScaling& r = g.rope_scaling;
  if (r.llama3) {
    if (!(r.factor >= 1)) return problem("rope_scaling.factor", "must be at least 1");
    if (!(r.low_freq_factor > 0)) return problem("rope_scaling.low_freq_factor", "must be positive");
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      return problem("rope_scaling.high_freq_factor", "must be more than low_freq_factor");
    }
    if (r.original_max_position_embeddings < 1) {
      return problem("rope_scaling.original_max_position_embeddings", "must be positive");
    }
  }
  return std::nullopt;
}

bool SameDescription(const GptConfig& a, const GptConfig& b) {
  const kernels::RopeScaling &x = a.rope_scaling, &y = b.rope_scaling;
  const bool same_scaling = x.llama3 == y.llama3 &&
                            (!x.llama3 || (x.factor == y.factor && x.low_freq_factor == y.low_freq_factor &&
                                           x.high_freq_factor == y.high_freq_factor &&
                                           x.original_max_position_embeddings == y.original_max_position_embeddings));
  return a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_embd == b.n_embd && a.vocab_size == b.vocab_size &&
         a.max_seq_len == b.max_seq_len && a.vocab_multiple == b.vocab_multiple && a.kv_heads() == b.kv_heads() &&
         a.head_size() == b.head_size() && a.mlp_size() == b.mlp_size() && a.architecture == b.architecture &&
         a.norm == b.norm && a.norm_eps == b.norm_eps && a.positions == b.positions &&
         (a.positions != PositionKind::kRotary || a.rope_theta == b.rope_theta) && same_scaling && a.mlp == b.mlp &&
         a.linear_bias == b.linear_bias && a.tied_embeddings == b.tied_embeddings;
}

namespace {

// Per layer, in the linear layers' weights and biases and the norms.
double LayerParameters(const GptConfig& g) {
  const double C = double(g.n_embd), qkv = double(g.qkv_width()), attn = double(g.attn_width());
  const double in = double(g.mlp_in_width()), F = double(g.mlp_size());
  double p = C * qkv + attn * C + C * in + F * C;
  if (g.qkv_bias()) p += qkv;
  if (g.other_bias()) p += C + in + C;
  p += (g.norm == NormKind::kLayerNorm ? 4.0 : 2.0) * C;
  return p;
}

// The linear layers' weights of one layer (the GEMMs' share of its FLOPs).
double LayerGemmParameters(const GptConfig& g) {
  const double C = double(g.n_embd);
  return C * double(g.qkv_width()) + double(g.attn_width()) * C + C * double(g.mlp_in_width()) +
         double(g.mlp_size()) * C;
}

double OuterParameters(const GptConfig& g) {
  const double C = double(g.n_embd);
  double p = double(g.vocab_size) * C * (g.tied_embeddings ? 1.0 : 2.0);
  if (g.positions == PositionKind::kLearned) p += double(g.max_seq_len) * C;
  p += (g.norm == NormKind::kLayerNorm ? 2.0 : 1.0) * C;
  return p;
}

}  // namespace

int64_t GptConfig::NumParameters() const {
  const int64_t C = n_embd, qkv = qkv_width(), attn = attn_width(), in = mlp_in_width(), F = mlp_size();
  int64_t per_layer = C * qkv + attn * C + C * in + F * C + (norm == NormKind::kLayerNorm ? 4 : 2) * C;
  if (qkv_bias()) per_layer += qkv;
  if (other_bias()) per_layer += C + in + C;
  int64_t outer = vocab_size * C * (tied_embeddings ? 1 : 2) + (norm == NormKind::kLayerNorm ? 2 : 1) * C;
  if (positions == PositionKind::kLearned) outer += max_seq_len * C;
  return outer + n_layer * per_layer;
}

double GptConfig::NumParametersApprox() const { return OuterParameters(*this) + double(n_layer) * LayerParameters(*this); }

namespace {

GptConfig Gpt2Shape(int64_t layers, int64_t heads, int64_t embd, int64_t vocab, int64_t positions) {
  GptConfig g;
  g.n_layer = layers;
  g.n_head = heads;
  g.n_embd = embd;
  g.vocab_size = vocab;
  g.max_seq_len = positions;
  return g;
}

struct LlamaShape {
  Architecture architecture;
  int64_t layers, heads, kv_heads, embd, head_dim, intermediate, vocab, positions;
  double theta, eps;
  bool tied;
  double llama3_factor;  // 0: no rope scaling
};

GptConfig Describe(const LlamaShape& s) {
  GptConfig g = ArchitectureDefaults(s.architecture);
  g.n_layer = s.layers;
  g.n_head = s.heads;
  g.n_kv_head = s.kv_heads;
  g.n_embd = s.embd;
  g.head_dim = s.head_dim;
  g.intermediate_size = s.intermediate;
  g.vocab_size = s.vocab;
  g.max_seq_len = s.positions;
  g.rope_theta = s.theta;
  g.norm_eps = s.eps;
  g.tied_embeddings = s.tied;
  if (s.llama3_factor > 0) {
    g.rope_scaling.llama3 = true;
    g.rope_scaling.factor = s.llama3_factor;
    g.rope_scaling.low_freq_factor = 1.0;
    g.rope_scaling.high_freq_factor = 4.0;
    g.rope_scaling.original_max_position_embeddings = 8192;
  }
  return g;
}

}  // namespace

const std::vector<GptPreset>& GptPresets() {
  constexpr auto kLlama = Architecture::kLlama, kQwen2 = Architecture::kQwen2, kMistral = Architecture::kMistral;
  static const std::vector<GptPreset> kPresets = {
      {"tiny", Gpt2Shape(4, 4, 128, 512, 256)},
      {"gpt2-124m", Gpt2Shape(12, 12, 768, 50257, 1024)},
      {"gpt2-350m", Gpt2Shape(24, 16, 1024, 50257, 1024)},
      {"gpt2-774m", Gpt2Shape(36, 20, 1280, 50257, 1024)},
      {"gpt2-1.5b", Gpt2Shape(48, 25, 1600, 50257, 1024)},
      // Hidden-4096 shapes in the style of PatrickStar's scaling runs.
      {"gpt3-4b", Gpt2Shape(20, 32, 4096, 50257, 1024)},
      {"gpt3-6.7b", Gpt2Shape(32, 32, 4096, 50257, 2048)},
      {"gpt3-10b", Gpt2Shape(50, 32, 4096, 50257, 1024)},
      {"gpt3-13b", Gpt2Shape(40, 40, 5120, 50257, 2048)},
      {"gpt3-20b", Gpt2Shape(100, 32, 4096, 50257, 1024)},
      {"gpt3-175b", Gpt2Shape(96, 96, 12288, 50257, 2048)},
      // The published config.json shapes: {layers, heads, kv heads, hidden,
      // head_dim, intermediate, vocabulary, positions, rope_theta,
      // rms_norm_eps, tied, llama3 rope factor}.
      {"llama-tiny", Describe({kLlama, 4, 4, 2, 128, 32, 352, 512, 256, 10000.0, 1e-5, false, 0})},
      {"llama-3.2-1b", Describe({kLlama, 16, 32, 8, 2048, 64, 8192, 128256, 131072, 500000.0, 1e-5, true, 32.0})},
      {"llama-3.2-3b", Describe({kLlama, 28, 24, 8, 3072, 128, 8192, 128256, 131072, 500000.0, 1e-5, true, 32.0})},
      {"llama-3.1-8b", Describe({kLlama, 32, 32, 8, 4096, 128, 14336, 128256, 131072, 500000.0, 1e-5, false, 8.0})},
      {"llama-3.1-70b", Describe({kLlama, 80, 64, 8, 8192, 128, 28672, 128256, 131072, 500000.0, 1e-5, false, 8.0})},
      {"qwen2.5-0.5b", Describe({kQwen2, 24, 14, 2, 896, 64, 4864, 151936, 32768, 1000000.0, 1e-6, true, 0})},
      {"qwen2.5-7b", Describe({kQwen2, 28, 28, 4, 3584, 128, 18944, 152064, 32768, 1000000.0, 1e-6, false, 0})},
      {"mistral-7b-v0.3", Describe({kMistral, 32, 32, 8, 4096, 128, 14336, 32768, 32768, 1000000.0, 1e-5, false, 0})},
  };
  return kPresets;
}

std::optional<GptConfig> FindGptPreset(std::string_view name) {
  for (const auto& p : GptPresets()) {
    if (p.name == name) return p.config;
  }
  return std::nullopt;
}

int64_t ClassifierRows(const GptConfig& config, int64_t tokens) {
  // The classifier's GEMM (2 C Vp per token) against 2% of the step's
  // (6 (L P + C Vp), P a layer's GEMM weights): 47 C Vp >= 3 L P; GPT-2's
  // P = 12 C^2 gives 47 Vp >= 36 L C.
  const double L = double(config.n_layer), C = double(config.n_embd), Vp = double(config.padded_vocab_size());
  if (47.0 * C * Vp >= 3.0 * L * LayerGemmParameters(config)) return tokens;
  return (tokens + 15) / 16;
}

}  // namespace pstar
