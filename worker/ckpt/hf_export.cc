#include "worker/ckpt/hf_export.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/core/file_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/model/gpt.h"
#include "worker/runtime/half_format.h"

namespace pstar {

namespace {

namespace fs = std::filesystem;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const char* TorchDtype(Dtype d) { return d == Dtype::kBF16 ? "bfloat16" : d == Dtype::kF16 ? "float16" : "float32"; }

// One tensor of the export: the checkpoint's name and shape, and how the
// files name and lay it out.
struct ExportTensor {
  std::string ours;             // as the checkpoint names it
  std::string name;             // in the files
  std::vector<int64_t> shape;   // in the files
  bool transposed = false;      // GPT-2's Conv1D: the files hold (in, out)
  int64_t numel = 0;
};

// Produces a tensor's bytes in the export's dtype, by element range, from
// the checkpoint: the safetensors writer's Fetch.
class TensorProducer {
 public:
  TensorProducer(const CheckpointParamReader& reader, Dtype dtype) : reader_(reader), dtype_(dtype) {}

  Status Produce(const ExportTensor& t, char* dst, int64_t offset, int64_t bytes) {
    const int64_t eb = DtypeBytes(dtype_), first = offset / eb, n = bytes / eb;
    float* values = reinterpret_cast<float*>(dst);
    if (dtype_ != Dtype::kF32) {
      floats_.resize(size_t(n));
      values = floats_.data();
    }
    PSTAR_RETURN_IF_ERROR(t.transposed ? ReadTransposed(t, first, n, values) : reader_.Read(t.ours, first, n, values));
    if (dtype_ != Dtype::kF32) {
      halves_.resize(size_t(n));
      NarrowToHalf(halves_.data(), values, n, dtype_ == Dtype::kBF16 ? HalfFormat::kBf16 : HalfFormat::kFp16);
      std::copy_n(reinterpret_cast<const char*>(halves_.data()), size_t(bytes), dst);
    }
    return Status::Ok();
  }

 private:
  // Elements [first, first + n) of the files' (in, out) = (cols, rows) form
  // of our (rows, cols) tensor: the columns [c0, c1] they touch, read as
  // one run per row of ours.
  Status ReadTransposed(const ExportTensor& t, int64_t first, int64_t n, float* dst) {
    const int64_t rows = t.shape[1], cols = t.shape[0];
    const int64_t c0 = first / rows, c1 = (first + n - 1) / rows, w = c1 - c0 + 1;
    block_.resize(size_t(rows * w));
    for (int64_t r = 0; r < rows; ++r) PSTAR_RETURN_IF_ERROR(reader_.Read(t.ours, r * cols + c0, w, &block_[size_t(r * w)]));
    for (int64_t j = first; j < first + n; ++j) dst[j - first] = block_[size_t((j % rows) * w + (j / rows - c0))];
    return Status::Ok();
  }

  const CheckpointParamReader& reader_;
  const Dtype dtype_;
  std::vector<float> floats_, block_;
  std::vector<uint16_t> halves_;
};

std::vector<ExportTensor> ExportTensors(const GptConfig& g) {
  std::vector<ExportTensor> out;
  for (const TensorSpec& s : GptVisibleTensorSpecs(g)) {
    ExportTensor t{s.name, s.name, s.shape, false, s.numel()};
    if (g.architecture == Architecture::kGpt2 && IsHfConv1DWeight(s.name)) {
      t.transposed = true;
      std::swap(t.shape[0], t.shape[1]);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Consecutive tensors, each shard at most `max_bytes` unless one tensor is
// larger, as transformers splits them.
std::vector<std::vector<size_t>> Shards(const std::vector<ExportTensor>& tensors, int64_t eb, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = tensors[i].numel * eb;
    if (shards.empty() || (bytes > 0 && bytes + b > max_bytes)) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += b;
  }
  return shards;
}

std::string ShardName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return name;
}

// Weight files a previous export left that this one does not name.
Status RemoveStaleWeights(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 && EndsWith(name, ".safetensors") &&
                       name.find("-of-") != std::string::npos;
    if ((shard || name == kSingleName || name == kIndexName) && !keep.count(name)) {
      fs::remove(entry.path(), ec);
      if (ec) return Status::Internal("cannot remove the stale " + entry.path().string() + ": " + ec.message());
    }
  }
  return Status::Ok();
}

// The family's config.json: the imported directory's, with the description
// keys pstar trained (the shape, positions, norm, tying, the dtype written)
// set to the run's, so what pstar does not describe (token ids, a sliding
// window the run's sequences fit in, transformers' version) stays as the
// publisher wrote it.
Result<std::string> MergedConfigJson(const std::string& ours_text, const std::optional<std::string>& carried) {
  const nlohmann::ordered_json ours = nlohmann::ordered_json::parse(ours_text);
  if (!carried) return ours_text;
  nlohmann::ordered_json merged = nlohmann::ordered_json::parse(*carried, nullptr, /*allow_exceptions=*/false);
  if (merged.is_discarded() || !merged.is_object()) {
    return Status::DataLoss("the checkpoint's config.json (carried from the imported directory) is not a JSON object");
  }
  static const std::set<std::string> kDescribed = {
      "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
      "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias", "mlp_bias",
      "torch_dtype"};
  for (const auto& [key, value] : ours.items()) {
    if (kDescribed.count(key) || !merged.contains(key)) merged[key] = value;
  }
  return merged.dump(2) + "\n";
}

}  // namespace

int64_t HfExportBufferBytes() {
  // The checksum pass's read block; the writer's staging block, the floats a
  // 16-bit block is narrowed from (twice its bytes) and the halves (its
  // bytes); a transposed block a row wider at most (GPT-2's weights, far
  // smaller).
  return SafetensorsWriter::kFetchBlockBytes * 5;
}

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

std::string HfLlamaFamilyConfigJson(const GptConfig& g, Dtype dtype) {
  static constexpr const char* kClass[] = {"GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM",
                                           "MistralForCausalLM"};
  const Architecture a = g.architecture;
  nlohmann::ordered_json j;
  j["architectures"] = {kClass[int(a)]};
  j["model_type"] = ArchitectureName(a);
  j["vocab_size"] = g.vocab_size;
  j["hidden_size"] = g.n_embd;
  j["intermediate_size"] = g.mlp_size();
  j["num_hidden_layers"] = g.n_layer;
  j["num_attention_heads"] = g.n_head;
  j["num_key_value_heads"] = g.kv_heads();
  j["head_dim"] = g.head_size();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = g.max_seq_len;
  j["rms_norm_eps"] = g.norm_eps;
  j["rope_theta"] = g.rope_theta;
  if (g.rope_scaling.llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", g.rope_scaling.factor},
                         {"low_freq_factor", g.rope_scaling.low_freq_factor},
                         {"high_freq_factor", g.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", g.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = g.tied_embeddings;
  if (a == Architecture::kLlama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (a == Architecture::kQwen2) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = g.max_seq_len;
    j["max_window_layers"] = g.n_layer;
  }
  if (a == Architecture::kMistral) j["sliding_window"] = nullptr;
  j["attention_dropout"] = 0.0;  // pstar trains without dropout
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = TorchDtype(dtype);
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

Result<HfExportSummary> ExportHuggingFace(const std::string& step_dir, const std::string& output_dir,
                                          const HfExportOptions& options) {
  PSTAR_ASSIGN_OR_RETURN(CheckpointParamReader reader, CheckpointParamReader::Open(step_dir));
  const Manifest& manifest = reader.manifest();
  const GptConfig& g = manifest.state.model;
  const bool gpt2 = g.architecture == Architecture::kGpt2;
  const Dtype dtype = options.dtype.value_or(gpt2 ? Dtype::kF32 : Dtype::kBF16);
  if (dtype != Dtype::kF32 && dtype != Dtype::kBF16 && dtype != Dtype::kF16) {
    return Status::InvalidArgument(std::string("export writes F32, BF16 or F16, not ") + DtypeName(dtype));
  }
  if (options.max_shard_bytes <= 0) return Status::InvalidArgument("the shard size must be positive");

  const std::vector<ExportTensor> tensors = ExportTensors(g);
  const int64_t eb = DtypeBytes(dtype);
  int64_t parameters = 0, total_bytes = 0;
  for (const ExportTensor& t : tensors) {
    parameters += t.numel;
    total_bytes += t.numel * eb;
  }
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec) return Status::InvalidArgument("cannot create " + output_dir + ": " + ec.message());

  HfExportSummary summary;
  summary.step = manifest.state.step;
  summary.parameters = parameters;
  summary.dtype = dtype;
  const auto path_of = [&](const std::string& name) { return (fs::path(output_dir) / name).string(); };
  TensorProducer producer(reader, dtype);
  const std::vector<std::vector<size_t>> shards = Shards(tensors, eb, options.max_shard_bytes);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::set<std::string> written;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? kSingleName : ShardName(k, shards.size());
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");  // what transformers expects of PyTorch weights
    for (size_t i : shards[k]) {
      const ExportTensor& t = tensors[i];
      writer.AddFetched(t.name, dtype, t.shape, [&producer, &t](char* dst, int64_t offset, int64_t bytes) {
        return producer.Produce(t, dst, offset, bytes);
      });
      weight_map[t.name] = name;
    }
    PSTAR_RETURN_IF_ERROR(writer.Write(path_of(name)));
    summary.weight_paths.push_back(path_of(name));
    written.insert(name);
  }
  if (shards.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    summary.index_path = path_of(kIndexName);
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.index_path, index.dump(2) + "\n"));
    written.insert(kIndexName);
  }
  PSTAR_RETURN_IF_ERROR(RemoveStaleWeights(output_dir, written));

  summary.config_path = path_of("config.json");
  summary.generation_config_path = path_of("generation_config.json");
  PSTAR_ASSIGN_OR_RETURN(std::vector<NamedFile> carried, ReadCheckpointModelFiles(step_dir));
  std::optional<std::string> carried_config, carried_generation;
  for (const NamedFile& f : carried) {
    if (f.name == "config.json") {
      carried_config = f.contents;
    } else if (f.name == "generation_config.json") {
      carried_generation = f.contents;
    } else {
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path_of(f.name), f.contents));
      summary.carried_paths.push_back(path_of(f.name));
    }
  }
  std::optional<BpeTokenizer> tokenizer;
  std::string tokenizer_json;
  const std::string& kind = manifest.state.tokenizer;
  if (BpeTokenizer::IsBpeKind(kind)) {
    PSTAR_ASSIGN_OR_RETURN(std::string saved, ReadCheckpointTokenizer(step_dir));
    PSTAR_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::FromSaved(kind, saved, step_dir + "/" + manifest.tokenizer_file.name));
    tokenizer_json = t.ToTokenizerJson();
    tokenizer.emplace(std::move(t));
  }
  if (gpt2) {
    const int64_t eot = tokenizer ? tokenizer->eot() : EndOfTextId(g);
    std::string config = HfGpt2ConfigJson(g, eot);
    if (dtype != Dtype::kF32) {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(config);
      j["torch_dtype"] = TorchDtype(dtype);
      config = j.dump(2) + "\n";
    }
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.config_path, config));
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.generation_config_path, HfGenerationConfigJson(g, eot)));
  } else {
    PSTAR_ASSIGN_OR_RETURN(std::string config, MergedConfigJson(HfLlamaFamilyConfigJson(g, dtype), carried_config));
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.config_path, config));
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(summary.generation_config_path,
                                              carried_generation.value_or("{\n  \"_from_model_config\": true\n}\n")));
  }
  if (tokenizer && !tokenizer->gpt2_pretokenizer()) {
    // The model's own tokenizer.json, as the run read it; the imported
    // directory's tokenizer_config.json (with its chat template) went above,
    // else a minimal one naming the document and end tokens. (GPT-2's
    // family, whichever name the run gave it, gets GPT-2's files below.)
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path_of("tokenizer.json"), tokenizer_json));
    summary.tokenizer_paths.push_back(path_of("tokenizer.json"));
    if (tokenizer->tiktoken()) {
      // The rank file too, where Meta's Hugging Face directories keep it:
      // tiktoken (and Meta's own code) read that, not the tokenizer.json.
      std::error_code ec;
      fs::create_directories(path_of("original"), ec);
      if (ec) return Status::InvalidArgument("cannot create " + path_of("original") + ": " + ec.message());
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path_of("original/tokenizer.model"), tokenizer->SavedText()));
      summary.tokenizer_paths.push_back(path_of("original/tokenizer.model"));
    }
    const bool carried_config = std::any_of(carried.begin(), carried.end(),
                                            [](const NamedFile& f) { return f.name == "tokenizer_config.json"; });
    if (!carried_config) {
      nlohmann::ordered_json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", g.max_seq_len}};
      auto content = [&](int32_t id) { return tokenizer->Decode(std::vector<int32_t>{id}); };
      if (tokenizer->DocumentStart().size() == 1) {
        if (auto bos = content(tokenizer->DocumentStart()[0]); bos.ok()) tc["bos_token"] = *bos;
      }
      if (tokenizer->eot() >= 0) {
        if (auto eos = content(tokenizer->eot()); eos.ok()) tc["eos_token"] = *eos;
      }
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path_of("tokenizer_config.json"), tc.dump(2) + "\n"));
      summary.tokenizer_paths.push_back(path_of("tokenizer_config.json"));
    }
  } else if (tokenizer) {
    const nlohmann::ordered_json tokenizer_config = {
        {"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", g.max_seq_len}, {"add_prefix_space", false},
        {"bos_token", "<|endoftext|>"},       {"eos_token", "<|endoftext|>"},     {"unk_token", "<|endoftext|>"}};
    for (const auto& [name, text] : {std::pair<std::string, std::string>{"tokenizer.json", tokenizer_json},
                                     {"vocab.json", tokenizer->ToVocabJson()},
                                     {"merges.txt", tokenizer->ToMergesTxt()},
                                     {"tokenizer_config.json", tokenizer_config.dump(2) + "\n"}}) {
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(path_of(name), text));
      summary.tokenizer_paths.push_back(path_of(name));
    }
  }
  return summary;
}

}  // namespace pstar
