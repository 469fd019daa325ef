#include "worker/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "worker/ckpt/crc64.h"
#include "worker/ckpt/safetensors.h"
#include "worker/config/config.h"
#include "worker/core/file_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/model/gpt.h"

namespace pstar {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormatName = "pstar-checkpoint";
constexpr const char* kManifestName = "manifest.json";
// The tokenizers whose file a checkpoint holds, and its name: the
// tokenizer.json (gpt2, hf), or the rank file (tiktoken).
bool TokenizerHasFile(const std::string& tokenizer) { return BpeTokenizer::IsBpeKind(tokenizer); }
std::string TokenizerFileName(const std::string& tokenizer) {
  return tokenizer == "tiktoken" ? "tokenizer.model" : "tokenizer.json";
}
constexpr const char* kModelFilePrefix = "hf.";
constexpr const char* kLatestName = "latest";
constexpr const char* kStagingSuffix = ".tmp";
constexpr int64_t kFloatBytes = int64_t(sizeof(float));
// Rank files are read in blocks of this size; device copies on load come
// from this buffer, so no single copy is larger.
constexpr int64_t kReadBlockBytes = int64_t(4) << 20;

std::string JoinPath(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string RangeText(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

bool ParseKind(std::string_view s, StateKind* kind) {
  for (int k = 0; k < kNumStateKinds; ++k) {
    if (s == StateKindName(StateKind(k))) {
      *kind = StateKind(k);
      return true;
    }
  }
  return false;
}

// "kind/tensor@begin"; the tensor name may itself hold '/' or '@'.
bool ParsePieceName(const std::string& name, StateKind* kind, std::string* tensor, int64_t* begin) {
  const size_t slash = name.find('/');
  const size_t at = name.rfind('@');
  if (slash == std::string::npos || at == std::string::npos || at <= slash + 1 || at + 1 >= name.size()) {
    return false;
  }
  if (!ParseKind(std::string_view(name).substr(0, slash), kind)) return false;
  int64_t v = 0;
  for (size_t i = at + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (name[i] - '0');
  }
  *tensor = name.substr(slash + 1, at - slash - 1);
  *begin = v;
  return true;
}

// One saved piece as a rank file's header places it.
struct SavedPiece {
  StateKind kind;
  std::string tensor;
  int64_t begin = 0, end = 0;  // tensor elements
  int64_t offset = 0;          // file offset of element `begin`
};

// The pieces a rank file holds, from its header; DataLoss names the file
// and anything in it that is not a piece.
Result<std::vector<SavedPiece>> ReadSavedPieces(const std::string& path) {
  auto header = SafetensorsHeader::Read(path);
  if (!header.ok()) {
    if (header.status().code() == StatusCode::kNotFound) return Status::DataLoss(path + ": missing");
    return Status::DataLoss(header.status().message());
  }
  std::vector<SavedPiece> pieces;
  for (const auto& [name, t] : header->tensors) {
    SavedPiece p;
    if (!ParsePieceName(name, &p.kind, &p.tensor, &p.begin) || t.dtype != Dtype::kF32 || t.shape.size() != 1) {
      return Status::DataLoss(path + ": unexpected tensor " + name);
    }
    p.end = p.begin + t.shape[0];
    p.offset = header->data_offset + t.begin;
    pieces.push_back(std::move(p));
  }
  return pieces;
}

bool ParseCrc64Text(const std::string& text, uint64_t* value) {
  constexpr std::string_view kPrefix = "crc64:";
  if (text.size() != kPrefix.size() + 16 || text.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  uint64_t v = 0;
  for (size_t i = kPrefix.size(); i < text.size(); ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | uint64_t(d);
  }
  *value = v;
  return true;
}

Json StateToJson(const TrainingState& s) {
  Json j = Json::object();
  j["step"] = s.step;
  j["data_position"] = s.data_position;
  j["optimizer_steps"] = s.optimizer_steps;
  j["loss_scale"] = s.loss_scale;
  j["layout_fingerprint"] = s.layout_fingerprint;
  const GptConfig& g = s.model;
  j["model"] = {{"n_layer", g.n_layer},
                {"n_head", g.n_head},
                {"n_embd", g.n_embd},
                {"vocab_size", g.vocab_size},
                {"max_seq_len", g.max_seq_len}};
  if (g.architecture != Architecture::kGpt2) {
    // The rest of the description (GPT-2's is implied: manifests before it
    // had none). The kinds follow from the architecture.
    Json& m = j["model"];
    m["architecture"] = ArchitectureName(g.architecture);
    m["n_kv_head"] = g.kv_heads();
    m["head_dim"] = g.head_size();
    m["intermediate_size"] = g.mlp_size();
    m["norm_eps"] = g.norm_eps;
    m["rope_theta"] = g.rope_theta;
    m["rope_scaling"] = nullptr;
    if (g.rope_scaling.llama3) {
      m["rope_scaling"] = {{"type", "llama3"},
                           {"factor", g.rope_scaling.factor},
                           {"low_freq_factor", g.rope_scaling.low_freq_factor},
                           {"high_freq_factor", g.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", g.rope_scaling.original_max_position_embeddings}};
    }
    m["tie_word_embeddings"] = g.tied_embeddings;
  }
  return j;
}

// Throws nlohmann::json::exception on a missing or mistyped field.
TrainingState StateFromJson(const Json& j) {
  TrainingState s;
  s.step = j.at("step").get<int64_t>();
  s.data_position = j.at("data_position").get<int64_t>();
  s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
  s.loss_scale = j.at("loss_scale").get<double>();
  s.layout_fingerprint = j.at("layout_fingerprint").get<std::string>();
  const Json& m = j.at("model");
  if (m.contains("architecture")) {
    const std::string name = m.at("architecture").get<std::string>();
    bool known = false;
    for (Architecture a : {Architecture::kGpt2, Architecture::kLlama, Architecture::kQwen2, Architecture::kMistral}) {
      if (name == ArchitectureName(a)) {
        s.model = ArchitectureDefaults(a);
        known = true;
      }
    }
    if (!known) throw std::invalid_argument("unknown architecture '" + name + "'");
    s.model.n_kv_head = m.at("n_kv_head").get<int64_t>();
    s.model.head_dim = m.at("head_dim").get<int64_t>();
    s.model.intermediate_size = m.at("intermediate_size").get<int64_t>();
    s.model.norm_eps = m.at("norm_eps").get<double>();
    s.model.rope_theta = m.at("rope_theta").get<double>();
    const Json& r = m.at("rope_scaling");
    if (!r.is_null()) {
      if (r.at("type").get<std::string>() != "llama3") throw std::invalid_argument("unknown rope_scaling type");
      s.model.rope_scaling.llama3 = true;
      s.model.rope_scaling.factor = r.at("factor").get<double>();
      s.model.rope_scaling.low_freq_factor = r.at("low_freq_factor").get<double>();
      s.model.rope_scaling.high_freq_factor = r.at("high_freq_factor").get<double>();
      s.model.rope_scaling.original_max_position_embeddings = r.at("original_max_position_embeddings").get<int64_t>();
    }
    s.model.tied_embeddings = m.at("tie_word_embeddings").get<bool>();
  }
  s.model.n_layer = m.at("n_layer").get<int64_t>();
  s.model.n_head = m.at("n_head").get<int64_t>();
  s.model.n_embd = m.at("n_embd").get<int64_t>();
  s.model.vocab_size = m.at("vocab_size").get<int64_t>();
  s.model.max_seq_len = m.at("max_seq_len").get<int64_t>();
  return s;
}

// A state that passed the checksum can still be crafted: every number is
// checked against sane bounds before the trainer or the export uses it.
Status CheckState(const TrainingState& s, const std::string& path) {
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::DataLoss(path + ": bad manifest: state." + field + " " + why);
  };
  if (s.step < 0) return bad("step", "is negative");
  if (s.data_position < 0) return bad("data_position", "is negative");
  if (s.optimizer_steps < 0) return bad("optimizer_steps", "is negative");
  if (!(s.loss_scale > 0) || !std::isfinite(s.loss_scale)) return bad("loss_scale", "is not a positive number");
  const GptConfig& g = s.model;
  for (auto [name, v, limit] : {std::tuple{"n_layer", g.n_layer, kMaxLayers}, {"n_head", g.n_head, kMaxEmbd},
                                {"n_embd", g.n_embd, kMaxEmbd}, {"vocab_size", g.vocab_size, kMaxVocab},
                                {"max_seq_len", g.max_seq_len, kMaxSeqLen}}) {
    if (v < 1 || v > limit) return bad(std::string("model.") + name, "is " + std::to_string(v) + ", not in [1, " + std::to_string(limit) + "]");
  }
  for (auto [name, v, limit] : {std::tuple{"n_kv_head", g.kv_heads(), g.n_head}, {"head_dim", g.head_size(), kMaxEmbd},
                                {"intermediate_size", g.mlp_size(), kMaxIntermediate},
                                {"rope_scaling.original_max_position_embeddings",
                                 g.rope_scaling.original_max_position_embeddings, kMaxSeqLen}}) {
    if (v < 1 || v > limit) return bad(std::string("model.") + name, "is " + std::to_string(v) + ", not in [1, " + std::to_string(limit) + "]");
  }
  if (g.head_dim == 0 && g.n_embd % g.n_head != 0) return bad("model.n_head", "does not divide n_embd");
  if (std::optional<DescriptionProblem> problem = CheckDescription(g)) return bad("model." + problem->field, problem->why);
  if (g.NumParametersApprox() > kMaxParameters) {
    return bad("model", "has more parameters than pstar takes");
  }
  return Status::Ok();
}

// The checksum a manifest carries: CRC-64 of its compact JSON without the
// checksum field, so reformatting the file does not matter but any change of
// content does.
std::string ManifestChecksum(const Json& body) { return FormatCrc64(Crc64::Of(body.dump())); }

// One byte range of a rank file to copy into an owned range.
struct CopyOp {
  int64_t offset;  // in the file
  int64_t bytes;
  char* dest;                    // host ranges
  const OwnedRange* range;       // ranges reached through the DeviceCopier, or null
  int64_t range_offset;          // of the first byte, in `range`
};

// Reads `path` whole in blocks, checking its size and CRC against the
// manifest, and copies the `ops` ranges on the way: into host memory with
// memcpy, into device memory from the same block buffer with `device`.
Status ReadVerifyAndCopy(const std::string& path, const ManifestFile& expect, std::vector<CopyOp> ops,
                         DeviceCopier* device) {
  std::sort(ops.begin(), ops.end(), [](const CopyOp& a, const CopyOp& b) { return a.offset < b.offset; });
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::DataLoss(path + ": cannot open: " + std::strerror(errno));
  std::vector<char> buf(static_cast<size_t>(kReadBlockBytes));
  Crc64 crc;
  int64_t pos = 0;
  size_t next = 0;  // first op not yet copied whole
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::DataLoss(path + ": read error: " + std::strerror(errno));
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    crc.Update(buf.data(), size_t(n));
    const int64_t end = pos + n;
    for (size_t i = next; i < ops.size() && ops[i].offset < end; ++i) {
      const int64_t lo = std::max(ops[i].offset, pos);
      const int64_t hi = std::min(ops[i].offset + ops[i].bytes, end);
      if (lo >= hi) continue;
      const char* src = buf.data() + (lo - pos);
      if (ops[i].range == nullptr) {
        std::memcpy(ops[i].dest + (lo - ops[i].offset), src, size_t(hi - lo));
        continue;
      }
      Status copied = device->ToDevice(*ops[i].range, ops[i].range_offset + (lo - ops[i].offset), src, size_t(hi - lo));
      if (!copied.ok()) {
        ::close(fd);
        return Status::Internal(path + ": copying into device memory failed: " + copied.message());
      }
    }
    while (next < ops.size() && ops[next].offset + ops[next].bytes <= end) ++next;
    pos = end;
  }
  ::close(fd);
  if (pos != expect.bytes) {
    return Status::DataLoss(path + ": " + std::to_string(pos) + " bytes, the manifest says " +
                            std::to_string(expect.bytes) + " (truncated or replaced)");
  }
  if (crc.value() != expect.crc64) {
    return Status::DataLoss(path + ": checksum mismatch (file " + FormatCrc64(crc.value()) + ", manifest " +
                            FormatCrc64(expect.crc64) + ")");
  }
  return Status::Ok();
}

Status RemoveTree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Status::Internal("cannot remove " + path.string() + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

std::string StepDirName(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string RankFileName(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

std::string RankSidecarName(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "rank-%05d.json", rank);
  return buf;
}

std::string PieceName(StateKind kind, const std::string& tensor, int64_t begin) {
  return std::string(StateKindName(kind)) + "/" + tensor + "@" + std::to_string(begin);
}

int64_t ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() < kPrefix.size() + 8 || name.size() > kPrefix.size() + 18 || name.substr(0, 5) != kPrefix) {
    return -1;
  }
  int64_t v = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

Status CheckOwnedRanges(const std::vector<OwnedRange>& ranges, const DeviceCopier* device) {
  std::set<std::tuple<int, std::string, int64_t>> seen;
  for (const OwnedRange& r : ranges) {
    const std::string what = std::string(StateKindName(r.kind)) + "/" + r.tensor + " " + RangeText(r.begin, r.end);
    if (r.tensor.empty()) return Status::InvalidArgument("owned range with no tensor name");
    if (r.begin < 0 || r.end < r.begin) return Status::InvalidArgument("owned range " + what + " is malformed");
    if (r.end > r.begin && r.data == nullptr && !r.on_device) {
      return Status::InvalidArgument("owned range " + what + " has no data");
    }
    if (r.on_device && device == nullptr) {
      return Status::InvalidArgument("owned range " + what + " is in device memory, but no device copier was given");
    }
    if (!seen.insert({int(r.kind), r.tensor, r.begin}).second) {
      return Status::InvalidArgument("owned range " + what + " appears twice");
    }
  }
  return Status::Ok();
}

std::vector<int64_t> ListCompleteSteps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = ParseStepDirName(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

Result<int64_t> ReadLatestStep(const std::string& root) {
  const std::string path = JoinPath(root, kLatestName);
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  const int64_t step = ParseStepDirName(text);
  if (step < 0) return Status::DataLoss(path + ": does not name a step directory");
  return step;
}

Result<std::vector<int64_t>> CheckpointCandidates(const std::string& root, std::vector<std::string>* warnings) {
  auto warn = [&](std::string w) {
    if (warnings != nullptr) warnings->push_back(std::move(w));
  };
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status::NotFound(root + ": no checkpoint directory");
  const std::vector<int64_t> steps = ListCompleteSteps(root);
  auto latest = ReadLatestStep(root);
  if (!latest.ok()) {
    if (steps.empty()) {
      if (latest.status().code() == StatusCode::kNotFound) return Status::NotFound(root + ": no checkpoint");
      return Status::DataLoss(latest.status().message() + ", and there is no step directory");
    }
    warn(latest.status().message() + "; trying the step directories newest first");
    return steps;
  }
  std::vector<int64_t> out = {*latest};
  for (int64_t s : steps) {
    if (s < *latest) out.push_back(s);
    if (s > *latest) {
      warn(JoinPath(root, StepDirName(s)) + ": newer than latest (an interrupted save?); ignored");
    }
  }
  return out;
}

std::string StagingDir(const std::string& root, int64_t step) {
  return JoinPath(root, StepDirName(step) + kStagingSuffix);
}

Status PrepareStagingDir(const std::string& root, int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status::Internal("cannot create checkpoint directory " + root + ": " + ec.message());
  // Leftovers of interrupted saves: staging directories and temp files.
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool staging = name.rfind("step-", 0) == 0 && name.size() > 4 &&
                         name.compare(name.size() - 4, 4, kStagingSuffix) == 0;
    const bool temp_latest = name.rfind(std::string(".") + kLatestName + ".tmp.", 0) == 0;
    if (staging || temp_latest) stale.push_back(it->path());
  }
  if (ec) return Status::Internal("cannot list " + root + ": " + ec.message());
  for (const fs::path& p : stale) PSTAR_RETURN_IF_ERROR(RemoveTree(p));
  const std::string dir = StagingDir(root, step);
  if (!fs::create_directory(dir, ec) || ec) {
    return Status::Internal("cannot create " + dir + ": " + (ec ? ec.message() : "exists"));
  }
  return SyncDirectory(root);
}

Status WriteRankFile(const std::string& staging_dir, int rank, int world_size, int64_t step,
                     const std::vector<OwnedRange>& ranges, DeviceCopier* device) {
  PSTAR_RETURN_IF_ERROR(CheckOwnedRanges(ranges, device));
  SafetensorsWriter writer;
  writer.SetMetadata("format", std::string(kFormatName) + "-shard");
  writer.SetMetadata("format_version", std::to_string(kCheckpointFormatVersion));
  writer.SetMetadata("rank", std::to_string(rank));
  writer.SetMetadata("world_size", std::to_string(world_size));
  writer.SetMetadata("step", std::to_string(step));
  for (const OwnedRange& r : ranges) {
    if (r.end == r.begin) continue;
    const std::string name = PieceName(r.kind, r.tensor, r.begin);
    if (!r.on_device) {
      writer.AddView(name, Dtype::kF32, {r.end - r.begin}, r.data);
      continue;
    }
    writer.AddFetched(name, Dtype::kF32, {r.end - r.begin}, [device, &r](char* dst, int64_t offset, int64_t bytes) {
      return device->ToHost(dst, r, offset, size_t(bytes));
    });
  }
  FileDigest digest;
  PSTAR_RETURN_IF_ERROR(writer.Write(JoinPath(staging_dir, RankFileName(rank)), &digest));
  Json sidecar = {{"file", RankFileName(rank)},
                  {"rank", rank},
                  {"world_size", world_size},
                  {"step", step},
                  {"bytes", digest.bytes},
                  {"checksum", FormatCrc64(digest.crc64)}};
  return WriteFileAtomically(JoinPath(staging_dir, RankSidecarName(rank)), sidecar.dump(2) + "\n");
}

const std::vector<std::string>& CarriedModelFileNames() {
  static const std::vector<std::string> kNames = {"config.json",           "generation_config.json",
                                                  "tokenizer.json",        "tokenizer_config.json",
                                                  "special_tokens_map.json", "tokenizer.model",
                                                  "chat_template.jinja"};
  return kNames;
}

bool IsCarriedModelFile(const std::string& name) {
  const std::vector<std::string>& names = CarriedModelFileNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

Status PublishCheckpoint(const std::string& root, int world_size, const TrainingState& state, int64_t keep,
                         const std::string& tokenizer_file, const std::vector<NamedFile>& model_files) {
  const std::string staging = StagingDir(root, state.step);
  const std::string final_dir = JoinPath(root, StepDirName(state.step));

  // The manifest, from what every rank reported.
  Json files = Json::array();
  for (int r = 0; r < world_size; ++r) {
    const std::string path = JoinPath(staging, RankSidecarName(r));
    auto text = ReadRegularFile(path);
    if (!text.ok()) return Status::Internal("rank " + std::to_string(r) + " left no sidecar: " + text.status().message());
    int64_t bytes = 0;
    std::string checksum;
    uint64_t crc = 0;
    try {
      const Json j = Json::parse(*text);
      if (j.at("file").get<std::string>() != RankFileName(r) || j.at("step").get<int64_t>() != state.step ||
          j.at("world_size").get<int64_t>() != world_size) {
        return Status::Internal(path + ": written for another rank, step or world size");
      }
      bytes = j.at("bytes").get<int64_t>();
      checksum = j.at("checksum").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      return Status::Internal(path + ": bad sidecar: " + e.what());
    }
    if (!ParseCrc64Text(checksum, &crc)) return Status::Internal(path + ": bad checksum " + checksum);
    std::error_code ec;
    const std::string file = JoinPath(staging, RankFileName(r));
    if (int64_t(fs::file_size(file, ec)) != bytes || ec) {
      return Status::Internal(file + ": missing or not the size its sidecar says");
    }
    files.push_back({{"name", RankFileName(r)}, {"bytes", bytes}, {"checksum", FormatCrc64(crc)}});
  }
  Json manifest = Json::object();
  manifest["format"] = kFormatName;
  manifest["format_version"] = kCheckpointFormatVersion;
  manifest["world_size"] = world_size;
  manifest["state"] = StateToJson(state);
  manifest["files"] = files;
  Json tokenizer = {{"type", state.tokenizer}};
  if (TokenizerHasFile(state.tokenizer)) {
    const std::string name = TokenizerFileName(state.tokenizer);
    if (tokenizer_file.empty()) return Status::Internal("state.tokenizer is " + state.tokenizer + " but no " + name + " was given");
    PSTAR_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(staging, name), tokenizer_file));
    tokenizer["file"] = {{"name", name},
                         {"bytes", int64_t(tokenizer_file.size())},
                         {"checksum", FormatCrc64(Crc64::Of(tokenizer_file))}};
  }
  manifest["tokenizer"] = tokenizer;
  if (!model_files.empty()) {
    Json carried = Json::array();
    for (const NamedFile& f : model_files) {
      if (!IsCarriedModelFile(f.name)) return Status::Internal("not a model file a checkpoint carries: " + f.name);
      const std::string name = kModelFilePrefix + f.name;
      PSTAR_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(staging, name), f.contents));
      carried.push_back({{"name", name},
                         {"bytes", int64_t(f.contents.size())},
                         {"checksum", FormatCrc64(Crc64::Of(f.contents))}});
    }
    manifest["model_files"] = carried;
  }
  manifest["manifest_checksum"] = ManifestChecksum(manifest);
  PSTAR_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(staging, kManifestName), manifest.dump(2) + "\n"));

  // Publish: the complete directory appears under its final name at once.
  std::error_code ec;
  if (fs::exists(final_dir, ec)) PSTAR_RETURN_IF_ERROR(RemoveTree(final_dir));
  fs::rename(staging, final_dir, ec);
  if (ec) return Status::Internal("cannot rename " + staging + " to " + final_dir + ": " + ec.message());
  PSTAR_RETURN_IF_ERROR(SyncDirectory(root));
  PSTAR_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(root, kLatestName), StepDirName(state.step) + "\n"));

  // Prune: the newest `keep` up to this step stay; newer ones belong to an
  // abandoned run (this one resumed from an older step).
  int64_t kept = 0;
  for (int64_t s : ListCompleteSteps(root)) {
    if (s <= state.step && (keep <= 0 || kept < keep)) {
      ++kept;
      continue;
    }
    Status st = RemoveTree(JoinPath(root, StepDirName(s)));
    if (!st.ok()) return st.WithPrefix("checkpoint " + StepDirName(state.step) + " saved, but pruning failed");
  }
  return Status::Ok();
}

Result<std::vector<std::vector<float>>> LoadWholeParams(const std::string& step_dir, const GptConfig& model) {
  const std::vector<TensorSpec> specs = GptVisibleTensorSpecs(model);
  std::vector<std::vector<float>> values(specs.size());
  std::vector<OwnedRange> ranges;
  for (size_t i = 0; i < specs.size(); ++i) {
    values[i].resize(size_t(specs[i].numel()));
    ranges.push_back({StateKind::kParam, specs[i].name, 0, specs[i].numel(), values[i].data()});
  }
  PSTAR_RETURN_IF_ERROR(LoadCheckpointDir(step_dir, "", ranges).status());
  return values;
}

Result<CheckpointParamReader> CheckpointParamReader::Open(const std::string& step_dir) {
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) return Status::DataLoss(step_dir + ": missing");
  CheckpointParamReader r;
  r.step_dir_ = step_dir;
  PSTAR_ASSIGN_OR_RETURN(r.manifest_, ReadManifest(step_dir));
  for (size_t i = 0; i < r.manifest_.files.size(); ++i) {
    const ManifestFile& f = r.manifest_.files[i];
    const std::string path = JoinPath(step_dir, f.name);
    PSTAR_RETURN_IF_ERROR(ReadVerifyAndCopy(path, f, {}, nullptr));
    auto file = RandomAccessFile::Open(path);
    if (!file.ok()) return Status::DataLoss(file.status().message());
    PSTAR_ASSIGN_OR_RETURN(std::vector<SavedPiece> pieces, ReadSavedPieces(path));
    for (const SavedPiece& p : pieces) {
      if (p.kind == StateKind::kParam) r.pieces_[p.tensor].push_back({int(i), p.begin, p.end, p.offset});
    }
    r.files_.push_back(std::move(file).value());
  }
  for (auto& [tensor, pieces] : r.pieces_) {
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  }
  return r;
}

Status CheckpointParamReader::Read(const std::string& tensor, int64_t begin, int64_t count, float* dst) const {
  const int64_t end = begin + count;
  int64_t reached = begin;
  auto it = pieces_.find(tensor);
  if (it != pieces_.end()) {
    for (const Piece& p : it->second) {
      if (p.end <= reached) continue;
      if (p.begin > reached || reached >= end) break;
      const int64_t hi = std::min(end, p.end);
      PSTAR_RETURN_IF_ERROR(files_[size_t(p.file)].ReadAt(p.offset + (reached - p.begin) * kFloatBytes,
                                                          (hi - reached) * kFloatBytes,
                                                          reinterpret_cast<char*>(dst + (reached - begin))));
      reached = hi;
    }
  }
  if (reached < end) {
    return Status::DataLoss(step_dir_ + ": no saved piece holds param/" + tensor + " elements " +
                            RangeText(reached, end));
  }
  return Status::Ok();
}

Result<std::vector<NamedFile>> ReadCheckpointModelFiles(const std::string& step_dir) {
  PSTAR_ASSIGN_OR_RETURN(Manifest m, ReadManifest(step_dir));
  std::vector<NamedFile> files;
  for (const ManifestFile& f : m.model_files) {
    const std::string path = JoinPath(step_dir, f.name);
    auto text = ReadRegularFile(path);
    if (!text.ok()) return Status::DataLoss(text.status().message());
    if (int64_t(text->size()) != f.bytes || Crc64::Of(*text) != f.crc64) {
      return Status::DataLoss(path + ": size or checksum differs from the manifest's");
    }
    files.push_back({f.name.substr(std::strlen(kModelFilePrefix)), std::move(*text)});
  }
  return files;
}

Result<std::string> ReadCheckpointTokenizer(const std::string& step_dir) {
  PSTAR_ASSIGN_OR_RETURN(Manifest m, ReadManifest(step_dir));
  if (!TokenizerHasFile(m.state.tokenizer)) {
    return Status::NotFound(step_dir + ": the run's tokens were not made by a BPE tokenizer it carries (tokenizer: " +
                            m.state.tokenizer + ")");
  }
  const std::string path = JoinPath(step_dir, m.tokenizer_file.name);
  auto text = ReadRegularFile(path);
  if (!text.ok()) return Status::DataLoss(text.status().message());
  if (int64_t(text->size()) != m.tokenizer_file.bytes || Crc64::Of(*text) != m.tokenizer_file.crc64) {
    return Status::DataLoss(path + ": size or checksum differs from the manifest's");
  }
  return std::move(*text);
}

Result<Manifest> ReadManifest(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kManifestName);
  auto text = ReadRegularFile(path);
  if (!text.ok()) return Status::DataLoss(text.status().message());
  Manifest m;
  try {
    Json j = Json::parse(*text);
    if (!j.is_object() || !j.contains("manifest_checksum")) {
      return Status::DataLoss(path + ": not a checkpoint manifest");
    }
    const std::string checksum = j["manifest_checksum"].get<std::string>();
    j.erase("manifest_checksum");
    if (ManifestChecksum(j) != checksum) return Status::DataLoss(path + ": checksum mismatch (manifest edited or corrupt)");
    if (j.at("format").get<std::string>() != kFormatName) return Status::DataLoss(path + ": not a pstar checkpoint");
    const int version = j.at("format_version").get<int>();
    if (version != kCheckpointFormatVersion) {
      return Status::DataLoss(path + ": format version " + std::to_string(version) + " is not supported (this build reads " +
                              std::to_string(kCheckpointFormatVersion) + ")");
    }
    m.world_size = j.at("world_size").get<int>();
    m.state = StateFromJson(j.at("state"));
    PSTAR_RETURN_IF_ERROR(CheckState(m.state, path));
    for (const Json& f : j.at("files")) {
      ManifestFile file;
      file.name = f.at("name").get<std::string>();
      file.bytes = f.at("bytes").get<int64_t>();
      if (!ParseCrc64Text(f.at("checksum").get<std::string>(), &file.crc64)) {
        return Status::DataLoss(path + ": bad checksum for " + file.name);
      }
      m.files.push_back(std::move(file));
    }
    // Absent in checkpoints from before tokenizers were recorded: bytes.
    m.state.tokenizer = "byte";
    if (j.contains("tokenizer")) {
      const Json& t = j.at("tokenizer");
      m.state.tokenizer = t.at("type").get<std::string>();
      if (m.state.tokenizer != "byte" && m.state.tokenizer != "none" && !TokenizerHasFile(m.state.tokenizer)) {
        return Status::DataLoss(path + ": bad manifest: unknown tokenizer '" + m.state.tokenizer + "'");
      }
      if (TokenizerHasFile(m.state.tokenizer)) {
        const Json& f = t.at("file");
        m.tokenizer_file.name = f.at("name").get<std::string>();
        m.tokenizer_file.bytes = f.at("bytes").get<int64_t>();
        if (m.tokenizer_file.name != TokenizerFileName(m.state.tokenizer) || m.tokenizer_file.bytes < 0 ||
            !ParseCrc64Text(f.at("checksum").get<std::string>(), &m.tokenizer_file.crc64)) {
          return Status::DataLoss(path + ": bad manifest: bad tokenizer file entry");
        }
      }
    }
    // Absent in checkpoints from before they were carried: none.
    if (j.contains("model_files")) {
      for (const Json& f : j.at("model_files")) {
        ManifestFile file;
        file.name = f.at("name").get<std::string>();
        file.bytes = f.at("bytes").get<int64_t>();
        const std::string prefix = kModelFilePrefix;
        if (file.name.rfind(prefix, 0) != 0 || !IsCarriedModelFile(file.name.substr(prefix.size())) || file.bytes < 0 ||
            !ParseCrc64Text(f.at("checksum").get<std::string>(), &file.crc64)) {
          return Status::DataLoss(path + ": bad manifest: bad model file entry " + file.name);
        }
        m.model_files.push_back(std::move(file));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(path + ": bad manifest: " + e.what());
  } catch (const std::invalid_argument& e) {
    return Status::DataLoss(path + ": bad manifest: state.model: " + e.what());
  }
  if (m.world_size < 1 || int64_t(m.files.size()) != m.world_size) {
    return Status::DataLoss(path + ": lists " + std::to_string(m.files.size()) + " rank files for world size " +
                            std::to_string(m.world_size));
  }
  for (int r = 0; r < m.world_size; ++r) {
    if (m.files[size_t(r)].name != RankFileName(r)) return Status::DataLoss(path + ": bad file name " + m.files[size_t(r)].name);
  }
  const int64_t dir_step = ParseStepDirName(fs::path(step_dir).lexically_normal().filename().string());
  if (dir_step >= 0 && dir_step != m.state.step) {
    return Status::DataLoss(path + ": records step " + std::to_string(m.state.step) + ", not the directory's");
  }
  return m;
}

Result<TrainingState> LoadCheckpointDir(const std::string& step_dir, const std::string& layout_fingerprint,
                                        const std::vector<OwnedRange>& ranges, DeviceCopier* device) {
  PSTAR_RETURN_IF_ERROR(CheckOwnedRanges(ranges, device));
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) return Status::DataLoss(step_dir + ": missing");
  PSTAR_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(step_dir));
  if (!layout_fingerprint.empty() && manifest.state.layout_fingerprint != layout_fingerprint) {
    return Status::FailedPrecondition(step_dir + ": checkpoint was written for a different model (layout " +
                                      manifest.state.layout_fingerprint + ", this model " + layout_fingerprint + ")");
  }

  // Where every saved piece lies, from the rank files' headers.
  struct Piece {
    int file;
    int64_t begin, end;  // tensor elements
    int64_t offset;      // file offset of element `begin`
  };
  std::map<std::pair<int, std::string>, std::vector<Piece>> index;
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    const ManifestFile& f = manifest.files[i];
    const std::string path = JoinPath(step_dir, f.name);
    const auto bytes = fs::file_size(path, ec);
    if (ec) return Status::DataLoss(path + ": missing");
    if (int64_t(bytes) != f.bytes) {
      return Status::DataLoss(path + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                              std::to_string(f.bytes) + " (truncated or replaced)");
    }
    PSTAR_ASSIGN_OR_RETURN(std::vector<SavedPiece> pieces, ReadSavedPieces(path));
    for (const SavedPiece& p : pieces) index[{int(p.kind), p.tensor}].push_back({int(i), p.begin, p.end, p.offset});
  }

  // What to copy from which file; every owned element must be covered.
  std::vector<std::vector<CopyOp>> ops(manifest.files.size());
  for (const OwnedRange& r : ranges) {
    if (r.end == r.begin) continue;
    std::vector<std::pair<int64_t, int64_t>> covered;
    auto it = index.find({int(r.kind), r.tensor});
    if (it != index.end()) {
      for (const Piece& p : it->second) {
        const int64_t lo = std::max(r.begin, p.begin), hi = std::min(r.end, p.end);
        if (lo >= hi) continue;
        if (r.on_device) {
          ops[size_t(p.file)].push_back(
              {p.offset + (lo - p.begin) * kFloatBytes, (hi - lo) * kFloatBytes, nullptr, &r, (lo - r.begin) * kFloatBytes});
        } else {
          ops[size_t(p.file)].push_back({p.offset + (lo - p.begin) * kFloatBytes, (hi - lo) * kFloatBytes,
                                         reinterpret_cast<char*>(r.data + (lo - r.begin)), nullptr, 0});
        }
        covered.push_back({lo, hi});
      }
    }
    std::sort(covered.begin(), covered.end());
    int64_t reached = r.begin;
    for (const auto& [lo, hi] : covered) {
      if (lo > reached) break;
      reached = std::max(reached, hi);
    }
    if (reached < r.end) {
      int64_t gap_end = r.end;
      for (const auto& c : covered) {
        if (c.first > reached) {
          gap_end = c.first;
          break;
        }
      }
      return Status::DataLoss(step_dir + ": no saved piece holds " + StateKindName(r.kind) + "/" + r.tensor +
                              " elements " + RangeText(reached, gap_end));
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].empty()) continue;
    PSTAR_RETURN_IF_ERROR(ReadVerifyAndCopy(JoinPath(step_dir, manifest.files[i].name), manifest.files[i],
                                            std::move(ops[i]), device));
  }
  return manifest.state;
}

}  // namespace pstar
