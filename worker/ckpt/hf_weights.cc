#include "worker/ckpt/hf_weights.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "worker/ckpt/hf_config.h"
#include "worker/runtime/half_format.h"

namespace pstar {
namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// The index's weight_map, in the order its files first appear.
struct WeightMap {
  std::map<std::string, std::string> file_of;  // tensor -> file name
  std::vector<std::string> files;
};

Result<WeightMap> ReadIndex(const std::string& path) {
  PSTAR_ASSIGN_OR_RETURN(RandomAccessFile file, RandomAccessFile::Open(path));
  PSTAR_ASSIGN_OR_RETURN(std::string text, file.ReadAll(kMaxHfJsonBytes));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::DataLoss(path + ": not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) return Status::DataLoss(path + ": no weight_map object");
  WeightMap m;
  std::set<std::string> seen;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string()) return Status::DataLoss(path + ": weight_map[" + it.key() + "] is not a file name");
    const std::string file = it->get<std::string>();
    // A shard lies in the directory itself: no path may lead out of it.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return Status::DataLoss(path + ": weight_map[" + it.key() + "] names '" + file +
                              "', not a file in the model's directory");
    }
    m.file_of[it.key()] = file;
    if (seen.insert(file).second) m.files.push_back(file);
  }
  if (m.files.empty()) return Status::DataLoss(path + ": weight_map names no tensor");
  return m;
}

}  // namespace

Result<HfWeights> HfWeights::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string index_path = (fs::path(dir) / kIndexName).string();
  const std::string single_path = (fs::path(dir) / kSingleName).string();
  std::optional<WeightMap> index;
  std::vector<std::string> names;
  if (Exists(index_path)) {
    PSTAR_ASSIGN_OR_RETURN(WeightMap m, ReadIndex(index_path));
    names = m.files;
    index = std::move(m);
  } else if (Exists(single_path)) {
    names = {kSingleName};
  } else {
    return Status::NotFound(dir + ": no " + kSingleName + " and no " + kIndexName + " (not a Hugging Face model directory?)");
  }

  HfWeights w;
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    if (index && !Exists(path)) {
      return Status::NotFound(index_path + ": names " + name + ", which is not in " + dir);
    }
    PSTAR_ASSIGN_OR_RETURN(RandomAccessFile file, RandomAccessFile::Open(path));
    PSTAR_ASSIGN_OR_RETURN(SafetensorsHeader header, SafetensorsHeader::Read(path));
    if (header.file_bytes != file.size()) return Status::DataLoss(path + ": changed while it was opened");
    const int file_index = int(w.files_.size());
    for (const auto& [tensor, t] : header.tensors) {
      if (t.dtype != Dtype::kF32 && t.dtype != Dtype::kBF16 && t.dtype != Dtype::kF16) {
        return Status::InvalidArgument(path + ": tensor " + tensor + " is " + DtypeName(t.dtype) +
                                       "; pstar imports BF16, F16 and F32");
      }
      auto earlier = w.tensors_.find(tensor);
      if (earlier != w.tensors_.end()) {
        return Status::DataLoss(path + ": tensor " + tensor + " is also in " + w.file_path(earlier->second.file));
      }
      if (index) {
        auto listed = index->file_of.find(tensor);
        if (listed == index->file_of.end()) {
          return Status::DataLoss(path + ": holds tensor " + tensor + ", which " + kIndexName + " does not list");
        }
        if (listed->second != name) {
          return Status::DataLoss(path + ": holds tensor " + tensor + ", which " + kIndexName + " places in " +
                                  listed->second);
        }
      }
      w.tensors_[tensor] = Tensor{file_index, t.dtype, t.shape, header.data_offset + t.begin, t.numel()};
    }
    w.files_.push_back(std::move(file));
  }
  if (index) {
    for (const auto& [tensor, file] : index->file_of) {
      if (!w.tensors_.count(tensor)) {
        return Status::DataLoss(index_path + ": places tensor " + tensor + " in " + file + ", which does not hold it");
      }
    }
  }
  return w;
}

const HfWeights::Tensor* HfWeights::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status HfWeights::ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst,
                             std::vector<uint16_t>& staging) const {
  const Tensor* t = Find(name);
  if (t == nullptr) return Status::NotFound("no tensor " + name);
  if (first < 0 || count < 0 || first > t->numel - count) {
    return Status::InvalidArgument(name + ": elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") are outside its " + std::to_string(t->numel));
  }
  const RandomAccessFile& file = files_[size_t(t->file)];
  if (t->dtype == Dtype::kF32) {
    return file.ReadAt(t->offset + first * 4, count * 4, reinterpret_cast<char*>(dst));
  }
  if (staging.empty()) staging.resize(1);
  const HalfFormat format = t->dtype == Dtype::kBF16 ? HalfFormat::kBf16 : HalfFormat::kFp16;
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min<int64_t>(int64_t(staging.size()), count - done);
    PSTAR_RETURN_IF_ERROR(file.ReadAt(t->offset + (first + done) * 2, n * 2, reinterpret_cast<char*>(staging.data())));
    WidenFromHalf(dst + done, staging.data(), n, format);
    done += n;
  }
  return Status::Ok();
}

}  // namespace pstar
