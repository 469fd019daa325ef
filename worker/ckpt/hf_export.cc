#include "worker/ckpt/hf_export.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <vector>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/model/gpt.h"

namespace pstar {

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool IsHfConv1DWeight(const std::string& name) {
  return EndsWith(name, ".attn.c_attn.weight") || EndsWith(name, ".attn.c_proj.weight") ||
         EndsWith(name, ".mlp.c_fc.weight") || EndsWith(name, ".mlp.c_proj.weight");
}

std::string HfGpt2ConfigJson(const GptConfig& g, int64_t eot) {
  if (eot < 0) eot = EndOfTextId(g);
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = g.vocab_size;
  j["n_positions"] = g.max_seq_len;
  j["n_ctx"] = g.max_seq_len;
  j["n_embd"] = g.n_embd;
  j["n_layer"] = g.n_layer;
  j["n_head"] = g.n_head;
  j["n_inner"] = nullptr;  // 4 * n_embd
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  // pstar trains without dropout.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  // transformers' GPT2Config defaults these to 50256, which is out of range
  // for any smaller vocabulary and breaks generate(): the tokenizer's
  // <|endoftext|>, or without one the last id.
  j["bos_token_id"] = eot;
  j["eos_token_id"] = eot;
  return j.dump(2) + "\n";
}

int64_t EndOfTextId(const GptConfig& g) { return g.vocab_size - 1; }

std::string HfGenerationConfigJson(const GptConfig& g, int64_t eot) {
  if (eot < 0) eot = EndOfTextId(g);
  nlohmann::ordered_json j;
  j["_from_model_config"] = true;
  j["bos_token_id"] = eot;
  j["eos_token_id"] = eot;
  return j.dump(2) + "\n";
}

Result<HfExportSummary> ExportHuggingFaceGpt2(const std::string& step_dir, const std::string& output_dir) {
  PSTAR_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(step_dir));  // its model shape is checked there
  const GptConfig& g = manifest.state.model;
  if (g.architecture != Architecture::kGpt2) {
    return Status::FailedPrecondition(step_dir + ": the checkpoint is a " + ArchitectureName(g.architecture) +
                                      " model; pstar export writes GPT-2 directories only in this version");
  }

  const std::vector<TensorSpec> specs = GptVisibleTensorSpecs(g);
  PSTAR_ASSIGN_OR_RETURN(std::vector<std::vector<float>> values, LoadWholeParams(step_dir, g));
  int64_t parameters = 0;
  for (const TensorSpec& s : specs) parameters += s.numel();

  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");  // what transformers expects of PyTorch weights
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    if (!IsHfConv1DWeight(s.name)) {
      writer.AddView(s.name, Dtype::kF32, s.shape, values[i].data());
      continue;
    }
    // (out, in) -> (in, out), in place of the original.
    const int64_t rows = s.shape[0], cols = s.shape[1];
    std::vector<float> t(values[i].size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = values[i][size_t(r * cols + c)];
    }
    values[i] = std::move(t);
    writer.AddView(s.name, Dtype::kF32, {cols, rows}, values[i].data());
  }

  std::error_code ec;
  std::filesystem::create_directories(output_dir, ec);
  if (ec) return Status::InvalidArgument("cannot create " + output_dir + ": " + ec.message());
  HfExportSummary summary;
  summary.step = manifest.state.step;
  summary.parameters = parameters;
  summary.model_path = (std::filesystem::path(output_dir) / "model.safetensors").string();
  summary.config_path = (std::filesystem::path(output_dir) / "config.json").string();
  summary.generation_config_path = (std::filesystem::path(output_dir) / "generation_config.json").string();
  PSTAR_RETURN_IF_ERROR(writer.Write(summary.model_path));
  std::optional<BpeTokenizer> tokenizer;
  std::string tokenizer_json;
  if (manifest.state.tokenizer == "gpt2") {
    PSTAR_ASSIGN_OR_RETURN(tokenizer_json, ReadCheckpointTokenizer(step_dir));
    PSTAR_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::FromTokenizerJsonText(tokenizer_json, step_dir + "/tokenizer.json"));
    tokenizer.emplace(std::move(t));
  }
  const int64_t eot = tokenizer ? tokenizer->eot() : EndOfTextId(g);
  PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.config_path, HfGpt2ConfigJson(g, eot)));
  PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.generation_config_path, HfGenerationConfigJson(g, eot)));
  if (tokenizer) {
    const nlohmann::ordered_json tokenizer_config = {
        {"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", g.max_seq_len}, {"add_prefix_space", false},
        {"bos_token", "<|endoftext|>"},       {"eos_token", "<|endoftext|>"},     {"unk_token", "<|endoftext|>"}};
    for (const auto& [name, text] : {std::pair<std::string, std::string>{"tokenizer.json", tokenizer_json},
                                     {"vocab.json", tokenizer->ToVocabJson()},
                                     {"merges.txt", tokenizer->ToMergesTxt()},
                                     {"tokenizer_config.json", tokenizer_config.dump(2) + "\n"}}) {
      const std::string path = (std::filesystem::path(output_dir) / name).string();
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path, text));
      summary.tokenizer_paths.push_back(path);
    }
  }
  return summary;
}

}  // namespace pstar
