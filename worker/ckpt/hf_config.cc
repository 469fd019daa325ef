#include "worker/ckpt/hf_config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <optional>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/core/file_util.h"

namespace pstar {
namespace {

using Json = nlohmann::json;

// The architectures pstar imports, by their model class and model_type.
struct KnownArchitecture {
  const char* model_class;
  const char* model_type;
  Architecture architecture;
};
constexpr KnownArchitecture kKnown[] = {{"LlamaForCausalLM", "llama", Architecture::kLlama},
                                        {"Qwen2ForCausalLM", "qwen2", Architecture::kQwen2},
                                        {"MistralForCausalLM", "mistral", Architecture::kMistral},
                                        {"GPT2LMHeadModel", "gpt2", Architecture::kGpt2}};

std::string KnownClasses() {
  std::string s;
  for (const KnownArchitecture& k : kKnown) s += (s.empty() ? "" : ", ") + std::string(k.model_class);
  return s;
}

// Reads keys of one config.json, each error naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const Json& j, const std::string& path) : j_(j), path_(path) {}

  Status Error(const std::string& key, const std::string& what) const {
    return Status::InvalidArgument(path_ + ": " + key + " " + what);
  }
  bool Present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  // A positive integer; absent or null is `fallback` where one is given.
  Result<int64_t> Count(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!Present(key)) {
      if (fallback) return *fallback;
      return Error(key, "is missing (pstar reads the model's shape from it)");
    }
    const Json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) return Error(key, "must be a positive integer, got " + v.dump());
    return v.get<int64_t>();
  }
  Result<double> Number(const char* key, double fallback) const {
    if (!Present(key)) return fallback;
    const Json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) return Error(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  Result<bool> Flag(const char* key, bool fallback) const {
    if (!Present(key)) return fallback;
    if (!j_[key].is_boolean()) return Error(key, "must be true or false, got " + j_[key].dump());
    return j_[key].get<bool>();
  }
  Result<std::string> Text(const char* key, const std::string& fallback) const {
    if (!Present(key)) return fallback;
    if (!j_[key].is_string()) return Error(key, "must be a string, got " + j_[key].dump());
    return j_[key].get<std::string>();
  }
  // Refuses a flag set to what pstar's decoder does not compute.
  Status RequireFlag(const char* key, bool want, const std::string& why) const {
    PSTAR_ASSIGN_OR_RETURN(bool v, Flag(key, want));
    if (v != want) return Error(key, std::string("is ") + (v ? "true" : "false") + ": " + why);
    return Status::Ok();
  }

 private:
  const Json& j_;
  const std::string& path_;
};

Result<Architecture> ReadArchitecture(const Json& j, const std::string& path) {
  std::string model_class, model_type;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const Json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || !a[0].is_string()) {
      return Status::InvalidArgument(path + ": architectures must list one model class, got " + a.dump());
    }
    model_class = a[0].get<std::string>();
  }
  if (j.contains("model_type") && j["model_type"].is_string()) model_type = j["model_type"].get<std::string>();
  if (model_class.empty() && model_type.empty()) {
    return Status::InvalidArgument(path + ": names no architecture (neither architectures nor model_type)");
  }
  for (const KnownArchitecture& k : kKnown) {
    if (model_class.empty() ? model_type != k.model_type : model_class != k.model_class) continue;
    if (!model_class.empty() && !model_type.empty() && model_type != k.model_type) {
      return Status::InvalidArgument(path + ": architectures says " + model_class + " but model_type is " +
                                     model_type);
    }
    return k.architecture;
  }
  return Status::InvalidArgument(path + ": architecture " + (model_class.empty() ? model_type : model_class) +
                                 " is not one pstar imports (" + KnownClasses() + ")");
}

Status ReadGpt2(const ConfigReader& r, GptConfig& g) {
  PSTAR_ASSIGN_OR_RETURN(g.n_layer, r.Count("n_layer"));
  PSTAR_ASSIGN_OR_RETURN(g.n_head, r.Count("n_head"));
  PSTAR_ASSIGN_OR_RETURN(g.n_embd, r.Count("n_embd"));
  PSTAR_ASSIGN_OR_RETURN(g.vocab_size, r.Count("vocab_size"));
  PSTAR_ASSIGN_OR_RETURN(const int64_t ctx, r.Count("n_ctx", 1024));
  PSTAR_ASSIGN_OR_RETURN(g.max_seq_len, r.Count("n_positions", ctx));
  PSTAR_ASSIGN_OR_RETURN(const int64_t inner, r.Count("n_inner", 4 * g.n_embd));
  if (inner != 4 * g.n_embd) return r.Error("n_inner", "is " + std::to_string(inner) + "; pstar's GPT-2 MLP is 4 n_embd wide");
  PSTAR_ASSIGN_OR_RETURN(const std::string act, r.Text("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return r.Error("activation_function", "is " + act + "; pstar's GPT-2 uses the tanh approximation (gelu_new)");
  }
  PSTAR_ASSIGN_OR_RETURN(const double eps, r.Number("layer_norm_epsilon", 1e-5));
  if (std::abs(eps - 1e-5) > 1e-12) return r.Error("layer_norm_epsilon", "is not 1e-05, which pstar's GPT-2 uses");
  PSTAR_RETURN_IF_ERROR(r.RequireFlag("tie_word_embeddings", true, "pstar's GPT-2 ties its classifier to wte"));
  PSTAR_RETURN_IF_ERROR(r.RequireFlag("scale_attn_by_inverse_layer_idx", false,
                                      "pstar's GPT-2 scales attention by 1/sqrt(head size) alone"));
  PSTAR_RETURN_IF_ERROR(r.RequireFlag("scale_attn_weights", true, "pstar's GPT-2 scales attention by 1/sqrt(head size)"));
  PSTAR_RETURN_IF_ERROR(r.RequireFlag("add_cross_attention", false, "pstar's GPT-2 is a decoder alone"));
  return Status::Ok();
}

Status ReadRopeScaling(const Json& j, const ConfigReader& r, kernels::RopeScaling& s) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return Status::Ok();
  const Json& o = j["rope_scaling"];
  if (!o.is_object()) return r.Error("rope_scaling", "must be an object or null, got " + o.dump());
  // transformers reads rope_type, and type from older files.
  const char* type_key = o.contains("rope_type") ? "rope_type" : "type";
  if (!o.contains(type_key) || !o[type_key].is_string()) return r.Error("rope_scaling", "names no rope_type");
  const std::string type = o[type_key].get<std::string>();
  if (type == "default") return Status::Ok();
  if (type != "llama3") {
    return r.Error("rope_scaling", "type " + type + " is not one pstar computes (llama3, or none)");
  }
  auto number = [&](const char* key) -> Result<double> {
    if (!o.contains(key) || !o[key].is_number()) return r.Error(std::string("rope_scaling.") + key, "is missing (type llama3 needs it)");
    return o[key].get<double>();
  };
  s.llama3 = true;
  PSTAR_ASSIGN_OR_RETURN(s.factor, number("factor"));
  PSTAR_ASSIGN_OR_RETURN(s.low_freq_factor, number("low_freq_factor"));
  PSTAR_ASSIGN_OR_RETURN(s.high_freq_factor, number("high_freq_factor"));
  if (!o.contains("original_max_position_embeddings") || !o["original_max_position_embeddings"].is_number_integer()) {
    return r.Error("rope_scaling.original_max_position_embeddings", "is missing (type llama3 needs it)");
  }
  s.original_max_position_embeddings = o["original_max_position_embeddings"].get<int64_t>();
  return Status::Ok();
}

// LlamaConfig, Qwen2Config and MistralConfig: one set of keys, their own
// defaults, their own attention windows.
Status ReadLlamaFamily(const Json& j, const ConfigReader& r, HfModelConfig& out) {
  GptConfig& g = out.model;
  const Architecture a = g.architecture;
  PSTAR_ASSIGN_OR_RETURN(g.n_layer, r.Count("num_hidden_layers"));
  PSTAR_ASSIGN_OR_RETURN(g.n_head, r.Count("num_attention_heads"));
  PSTAR_ASSIGN_OR_RETURN(g.n_embd, r.Count("hidden_size"));
  PSTAR_ASSIGN_OR_RETURN(g.intermediate_size, r.Count("intermediate_size"));
  PSTAR_ASSIGN_OR_RETURN(g.vocab_size, r.Count("vocab_size"));
  PSTAR_ASSIGN_OR_RETURN(g.n_kv_head, r.Count("num_key_value_heads", g.n_head));
  if (g.n_embd % g.n_head != 0 && !r.Present("head_dim")) {
    return r.Error("num_attention_heads", std::to_string(g.n_head) + " does not divide hidden_size " +
                                              std::to_string(g.n_embd) + " and no head_dim is given");
  }
  PSTAR_ASSIGN_OR_RETURN(g.head_dim, r.Count("head_dim", g.n_embd / g.n_head));
  const int64_t default_positions = a == Architecture::kLlama ? 2048 : a == Architecture::kQwen2 ? 32768 : 131072;
  PSTAR_ASSIGN_OR_RETURN(g.max_seq_len, r.Count("max_position_embeddings", default_positions));
  PSTAR_ASSIGN_OR_RETURN(g.norm_eps, r.Number("rms_norm_eps", 1e-6));
  PSTAR_ASSIGN_OR_RETURN(g.rope_theta, r.Number("rope_theta", 10000.0));
  PSTAR_ASSIGN_OR_RETURN(g.tied_embeddings, r.Flag("tie_word_embeddings", false));
  PSTAR_RETURN_IF_ERROR(ReadRopeScaling(j, r, g.rope_scaling));
  PSTAR_ASSIGN_OR_RETURN(const std::string act, r.Text("hidden_act", "silu"));
  if (act != "silu") return r.Error("hidden_act", "is " + act + "; the family's MLP is SwiGLU (silu)");
  if (a != Architecture::kQwen2) {
    PSTAR_RETURN_IF_ERROR(r.RequireFlag("attention_bias", false, "pstar's " + std::string(ArchitectureName(a)) +
                                                                     " has no biases on its attention projections"));
  }
  PSTAR_RETURN_IF_ERROR(r.RequireFlag("mlp_bias", false, "the family's MLP has no biases"));
  PSTAR_ASSIGN_OR_RETURN(const int64_t tp, r.Count("pretraining_tp", 1));
  (void)tp;  // slices the same GEMMs in Meta's training; the same math

  if (a == Architecture::kMistral && r.Present("sliding_window")) {
    PSTAR_ASSIGN_OR_RETURN(out.sliding_window, r.Count("sliding_window"));
  }
  if (a == Architecture::kQwen2) {
    PSTAR_ASSIGN_OR_RETURN(const bool sliding, r.Flag("use_sliding_window", false));
    PSTAR_ASSIGN_OR_RETURN(const int64_t first, r.Count("max_window_layers", g.n_layer));
    // Qwen2's layers from max_window_layers on take the window.
    if (sliding && first < g.n_layer) {
      PSTAR_ASSIGN_OR_RETURN(out.sliding_window, r.Count("sliding_window", 4096));
    }
  }
  return Status::Ok();
}

// config.json's name for a description field CheckDescription names.
const char* HfKey(Architecture a, const std::string& field) {
  const bool gpt2 = a == Architecture::kGpt2;
  if (field == "n_kv_head") return "num_key_value_heads";
  if (field == "n_head") return gpt2 ? "n_head" : "num_attention_heads";
  if (field == "norm_eps") return gpt2 ? "layer_norm_epsilon" : "rms_norm_eps";
  if (field == "head_dim") return "head_dim";
  if (field == "intermediate_size") return "intermediate_size";
  if (field == "tie_word_embeddings") return "tie_word_embeddings";
  if (field == "rope_theta") return "rope_theta";
  if (field.rfind("rope_scaling", 0) == 0) return "rope_scaling";
  return nullptr;
}

}  // namespace

Result<HfModelConfig> ParseHfConfig(std::string_view text, const std::string& path) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  PSTAR_ASSIGN_OR_RETURN(const Architecture a, ReadArchitecture(j, path));
  HfModelConfig out;
  out.path = path;
  out.model = ArchitectureDefaults(a);
  const ConfigReader r(j, path);
  PSTAR_RETURN_IF_ERROR(a == Architecture::kGpt2 ? ReadGpt2(r, out.model) : ReadLlamaFamily(j, r, out));
  if (std::optional<DescriptionProblem> problem = CheckDescription(out.model)) {
    const char* key = HfKey(a, problem->field);
    return Status::InvalidArgument(path + ": " + (key ? key : problem->field.c_str()) + " " + problem->why);
  }
  return out;
}

Result<std::vector<NamedFile>> ReadHfCarriedFiles(const std::string& dir) {
  std::vector<NamedFile> files;
  for (const std::string& name : CarriedModelFileNames()) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    PSTAR_ASSIGN_OR_RETURN(RandomAccessFile file, RandomAccessFile::Open(path));
    PSTAR_ASSIGN_OR_RETURN(std::string contents, file.ReadAll(kMaxHfFileBytes));
    files.push_back({name, std::move(contents)});
  }
  return files;
}

Result<HfModelConfig> ReadHfConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  PSTAR_ASSIGN_OR_RETURN(RandomAccessFile file, RandomAccessFile::Open(path));
  PSTAR_ASSIGN_OR_RETURN(std::string text, file.ReadAll(kMaxHfJsonBytes));
  return ParseHfConfig(text, path);
}

}  // namespace pstar
