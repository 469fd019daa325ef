#include "worker/ckpt/hf_import.h"

#include <algorithm>
#include <map>
#include <vector>

#include "worker/ckpt/hf_config.h"
#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/hf_weights.h"
#include "worker/model/gpt.h"

namespace pstar {
namespace {

constexpr char kGpt2Prefix[] = "transformer.";
constexpr char kTiedHead[] = "lm_head.weight";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// How the directory names and lays out each of the run's tensors.
struct HfTensorNames {
  std::string prefix;  // GPT-2's published weights drop "transformer."
  bool gpt2 = false;

  std::string Of(const std::string& ours) const {
    return gpt2 ? prefix + ours.substr(sizeof(kGpt2Prefix) - 1) : ours;
  }
  // Tensors the files may hold beside the model's: buffers that config.json
  // determines.
  bool Ignored(const std::string& name) const {
    if (gpt2) return EndsWith(name, ".attn.bias") || EndsWith(name, ".attn.masked_bias");
    return EndsWith(name, ".rotary_emb.inv_freq");
  }
  bool Transposed(const std::string& ours) const { return gpt2 && IsHfConv1DWeight(ours); }
};

// One rank's import: its owned slices, read through the staging buffer.
class Importer {
 public:
  Importer(const HfWeights& weights, const HfImportOptions& options)
      : weights_(weights), staging_(size_t(std::max<int64_t>(1, options.staging_elements))) {}

  Status Read(const std::string& hf, int64_t first, int64_t count, float* dst) {
    Status s = weights_.ReadFloats(hf, first, count, dst, staging_);
    return s.ok() ? s : s.WithPrefix("tensor " + hf);
  }

  // Elements [begin, end) of our (rows, cols) tensor from the (cols, rows)
  // one the file holds: for each of its rows, the run of our rows the slice
  // touches.
  Status ReadTransposed(const std::string& hf, int64_t rows, int64_t cols, int64_t begin, int64_t end, float* dst) {
    const int64_t r0 = begin / cols, r1 = (end - 1) / cols + 1;
    column_.resize(size_t(r1 - r0));
    for (int64_t c = 0; c < cols; ++c) {
      PSTAR_RETURN_IF_ERROR(Read(hf, c * rows + r0, r1 - r0, column_.data()));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = r * cols + c;
        if (i >= begin && i < end) dst[i - begin] = column_[size_t(r - r0)];
      }
    }
    return Status::Ok();
  }

  // A tied model's lm_head.weight must be the token embedding: each rank
  // compares the range it owns, block by block.
  Status CheckTiedHead(const std::string& embedding, int64_t first, int64_t count, const float* values) {
    const int64_t block = int64_t(staging_.size());
    head_.resize(size_t(std::min(block, count)));
    for (int64_t done = 0; done < count; done += block) {
      const int64_t n = std::min(block, count - done);
      PSTAR_RETURN_IF_ERROR(Read(kTiedHead, first + done, n, head_.data()));
      if (!std::equal(head_.begin(), head_.begin() + n, values + done)) {
        return Status::InvalidArgument(FileOf(kTiedHead) + ": lm_head.weight differs from " + embedding +
                                       " but config.json ties them (tie_word_embeddings)");
      }
    }
    return Status::Ok();
  }

  std::string FileOf(const std::string& hf) const {
    const HfWeights::Tensor* t = weights_.Find(hf);
    return t ? weights_.file_path(t->file) : "the model's files";
  }

 private:
  const HfWeights& weights_;
  std::vector<uint16_t> staging_;
  std::vector<float> column_, head_;
};

}  // namespace

int64_t HfImportBufferBytes(const HfImportOptions& options) {
  return std::max<int64_t>(1, options.staging_elements) * int64_t(sizeof(uint16_t) + sizeof(float));
}

Status ImportHuggingFace(const std::string& dir, const GptConfig& g, ParamStore& store,
                         const HfImportOptions& options) {
  PSTAR_ASSIGN_OR_RETURN(HfModelConfig hf_config, ReadHfConfig(dir));
  hf_config.model.vocab_multiple = g.vocab_multiple;
  if (!SameDescription(hf_config.model, g)) {
    return Status::InvalidArgument(hf_config.path + ": describes another model than the run's (changed since the "
                                   "run's config was read?)");
  }
  PSTAR_ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(dir));
  const auto& files = weights.tensors();

  HfTensorNames names;
  names.gpt2 = g.architecture == Architecture::kGpt2;
  if (names.gpt2) {
    names.prefix = files.count("transformer.wte.weight") ? kGpt2Prefix : "";
    if (!files.count(names.prefix + "wte.weight")) {
      return Status::InvalidArgument(dir + ": holds no wte.weight or transformer.wte.weight: not a GPT-2 model");
    }
  }
  // Every tensor of the model, whole, at its shape in the files.
  std::map<std::string, std::vector<int64_t>> expected;
  std::string embedding;
  for (const TensorSpec& s : GptVisibleTensorSpecs(g)) {
    std::vector<int64_t> shape = s.shape;
    if (names.Transposed(s.name)) std::swap(shape[0], shape[1]);
    expected[names.Of(s.name)] = shape;
    if (s.role == TensorRole::kEmbedding && embedding.empty()) embedding = names.Of(s.name);
  }
  const bool tied_head_in_files = g.tied_embeddings && files.count(kTiedHead) > 0;
  for (const auto& [name, t] : files) {
    if (expected.count(name) || names.Ignored(name) || (tied_head_in_files && name == kTiedHead)) continue;
    return Status::InvalidArgument(weights.file_path(t.file) + ": unknown tensor " + name + " (not part of " +
                                   ArchitectureName(g.architecture) + " as config.json describes it)");
  }
  for (const auto& [name, shape] : expected) {
    const HfWeights::Tensor* t = weights.Find(name);
    if (t == nullptr) return Status::InvalidArgument(dir + ": no tensor " + name + " in the model's files");
    if (t->shape != shape) {
      return Status::InvalidArgument(weights.file_path(t->file) + ": tensor " + name + " has shape " +
                                     ShapeText(t->shape) + ", the model needs " + ShapeText(shape));
    }
  }
  if (tied_head_in_files && weights.Find(kTiedHead)->shape != expected.at(embedding)) {
    return Status::InvalidArgument(weights.file_path(weights.Find(kTiedHead)->file) + ": tensor lm_head.weight has shape " +
                                   ShapeText(weights.Find(kTiedHead)->shape) + ", the tied embedding's is " +
                                   ShapeText(expected.at(embedding)));
  }

  Importer importer(weights, options);
  const ParamLayout& layout = store.layout();
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    float* shard = store.HostShard(StateKind::kParam, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const TensorSpec& spec = layout.spec(id);
      const ParamStore::Slice s = store.OwnedSlice(id);
      if (s.end <= s.begin) continue;
      float* dst = shard + s.shard_offset;
      const std::string hf = names.Of(spec.tensor());
      // Padding rows (only at a tensor's end) stay zero.
      const int64_t visible_end = std::min(s.end, spec.visible_numel());
      if (visible_end > s.begin) {
        if (names.Transposed(spec.name)) {
          const std::vector<int64_t> v = spec.visible_shape();
          PSTAR_RETURN_IF_ERROR(importer.ReadTransposed(hf, v[0], v[1], s.begin, visible_end, dst));
        } else {
          const int64_t first = spec.tensor_offset() + s.begin;
          PSTAR_RETURN_IF_ERROR(importer.Read(hf, first, visible_end - s.begin, dst));
          if (tied_head_in_files && hf == embedding) {
            PSTAR_RETURN_IF_ERROR(importer.CheckTiedHead(embedding, first, visible_end - s.begin, dst));
          }
        }
      }
      std::fill(dst + std::max<int64_t>(0, visible_end - s.begin), dst + (s.end - s.begin), 0.0f);
    }
  }
  return Status::Ok();
}

}  // namespace pstar
