#include "worker/ckpt/hf_import.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"

namespace pstar {
namespace {

constexpr char kOurPrefix[] = "transformer.";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// config.json against the run's model shape.
Status CheckHfConfig(const std::string& path, const GptConfig& g) {
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2") {
    return Status::InvalidArgument(path + ": model_type is " + j["model_type"].dump() + ", not gpt2");
  }
  const int64_t positions = j.value("n_positions", j.value("n_ctx", int64_t(-1)));
  for (const auto& [key, ours, name] :
       {std::tuple{"n_layer", g.n_layer, "model.n_layer"}, {"n_head", g.n_head, "model.n_head"},
        {"n_embd", g.n_embd, "model.n_embd"}, {"vocab_size", g.vocab_size, "model.vocab_size"}}) {
    if (!j.contains(key) || !j[key].is_number_integer()) return Status::InvalidArgument(path + ": no integer " + key);
    if (j[key].get<int64_t>() != ours) {
      return Status::InvalidArgument(path + ": " + key + " is " + std::to_string(j[key].get<int64_t>()) + " but " +
                                     name + " is " + std::to_string(ours) + " (set the model to the imported shape)");
    }
  }
  if (positions != g.max_seq_len) {
    return Status::InvalidArgument(path + ": n_positions is " + std::to_string(positions) +
                                   " but model.max_seq_len is " + std::to_string(g.max_seq_len) +
                                   " (set the model to the imported shape)");
  }
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return Status::InvalidArgument(path + ": activation_function is " + act +
                                   "; pstar's GPT-2 uses the tanh approximation (gelu_new)");
  }
  if (std::abs(j.value("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-9) {
    return Status::InvalidArgument(path + ": layer_norm_epsilon is not 1e-5, which pstar's GPT-2 uses");
  }
  return Status::Ok();
}

}  // namespace

Status ImportHuggingFaceGpt2(const std::string& dir, const GptConfig& g, ParamStore& store) {
  namespace fs = std::filesystem;
  PSTAR_RETURN_IF_ERROR(CheckHfConfig((fs::path(dir) / "config.json").string(), g));
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  PSTAR_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  const auto& tensors = file.tensors();
  const std::string prefix = tensors.count("transformer.wte.weight") ? kOurPrefix : "";
  if (!tensors.count(prefix + "wte.weight")) {
    return Status::InvalidArgument(path + ": no wte.weight or transformer.wte.weight: not a GPT-2 model");
  }
  const ParamLayout& layout = store.layout();
  std::set<std::string> expected;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    expected.insert(prefix + layout.spec(id).name.substr(sizeof(kOurPrefix) - 1));
  }
  for (const auto& [name, t] : tensors) {
    if (expected.count(name) || EndsWith(name, ".attn.bias") || EndsWith(name, ".attn.masked_bias") ||
        name == "lm_head.weight") {
      continue;
    }
    return Status::InvalidArgument(path + ": unknown tensor " + name + " (not part of GPT-2)");
  }
  if (tensors.count("lm_head.weight")) {
    PSTAR_ASSIGN_OR_RETURN(std::vector<float> head, file.ToFloats("lm_head.weight"));
    PSTAR_ASSIGN_OR_RETURN(std::vector<float> wte, file.ToFloats(prefix + "wte.weight"));
    if (head != wte) return Status::InvalidArgument(path + ": lm_head.weight differs from wte (pstar ties the head)");
  }
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    float* shard = store.HostShard(StateKind::kParam, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const TensorSpec& spec = layout.spec(id);
      const std::string name = prefix + spec.name.substr(sizeof(kOurPrefix) - 1);
      auto it = tensors.find(name);
      if (it == tensors.end()) return Status::InvalidArgument(path + ": no tensor " + name);
      const std::vector<int64_t> visible = spec.visible_shape();
      const bool conv1d = IsHfConv1DWeight(spec.name);
      const std::vector<int64_t> want = conv1d ? std::vector<int64_t>{visible[1], visible[0]} : visible;
      if (it->second.shape != want) {
        return Status::InvalidArgument(path + ": " + name + " has shape " + ShapeText(it->second.shape) +
                                       ", the model needs " + ShapeText(want));
      }
      PSTAR_ASSIGN_OR_RETURN(std::vector<float> values, file.ToFloats(name));
      const ParamStore::Slice s = store.OwnedSlice(id);
      float* p = shard + s.shard_offset;
      const int64_t cols = conv1d ? visible[1] : 0, rows = conv1d ? visible[0] : 0;
      for (int64_t i = s.begin; i < s.end; ++i) {
        float v = 0.0f;  // padding rows stay zero
        if (i < spec.visible_numel()) v = conv1d ? values[size_t((i % cols) * rows + i / cols)] : values[size_t(i)];
        p[i - s.begin] = v;
      }
    }
  }
  return Status::Ok();
}

}  // namespace pstar
