#include "worker/ckpt/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>

#include "worker/core/file_util.h"

namespace pstar {

const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "F32";
    case Dtype::kF64: return "F64";
    case Dtype::kI32: return "I32";
  }
  return "?";
}

int DtypeBytes(Dtype d) { return d == Dtype::kF64 ? 8 : 4; }

int64_t SafetensorsFile::Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void SafetensorsWriter::Add(const std::string& name, Dtype dtype, std::vector<int64_t> shape,
                            const void* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Entry e{name, dtype, std::move(shape), std::string(static_cast<const char*>(data),
                                                     size_t(n) * size_t(DtypeBytes(dtype)))};
  entries_.push_back(std::move(e));
}

Status SafetensorsWriter::Write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  int64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", DtypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + int64_t(e.bytes.size())}}};
    offset += int64_t(e.bytes.size());
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');  // keeps the data 8-byte aligned
  std::string out;
  uint64_t len = json.size();
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += json;
  for (const auto& e : entries_) out += e.bytes;
  return WriteFileAtomically(path, out);
}

Result<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  PSTAR_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  if (raw.size() < 8) return Status::DataLoss(path + ": truncated safetensors file (no header length)");
  uint64_t len;
  std::memcpy(&len, raw.data(), 8);
  if (len > raw.size() - 8) return Status::DataLoss(path + ": truncated safetensors header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(raw.substr(8, len));
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(path + ": bad safetensors header: " + e.what());
  }
  if (!header.is_object()) return Status::DataLoss(path + ": safetensors header is not an object");
  SafetensorsFile f;
  f.path_ = path;
  f.data_ = raw.substr(8 + len);
  const int64_t data_bytes = int64_t(f.data_.size());
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it->begin(); m != it->end(); ++m) f.metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      Tensor t;
      std::string dtype = it->at("dtype").get<std::string>();
      if (dtype == "F32") t.dtype = Dtype::kF32;
      else if (dtype == "F64") t.dtype = Dtype::kF64;
      else if (dtype == "I32") t.dtype = Dtype::kI32;
      else return Status::DataLoss(path + ": tensor " + it.key() + " has unsupported dtype " + dtype);
      t.shape = it->at("shape").get<std::vector<int64_t>>();
      auto offsets = it->at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] || offsets[1] > data_bytes) {
        return Status::DataLoss(path + ": tensor " + it.key() + " lies outside the file (truncated?)");
      }
      t.begin = offsets[0];
      t.end = offsets[1];
      if (t.end - t.begin != t.numel() * DtypeBytes(t.dtype)) {
        return Status::DataLoss(path + ": tensor " + it.key() + " size does not match its shape");
      }
      f.tensors_[it.key()] = t;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(path + ": bad safetensors header: " + e.what());
  }
  return f;
}

Result<std::vector<double>> SafetensorsFile::ToDoubles(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Status::NotFound(path_ + ": no tensor " + name);
  const Tensor& t = it->second;
  std::vector<double> out(size_t(t.numel()));
  const char* p = data_.data() + t.begin;
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case Dtype::kF32: { float v; std::memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
      case Dtype::kF64: { double v; std::memcpy(&v, p + 8 * i, 8); out[i] = v; break; }
      case Dtype::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
    }
  }
  return out;
}

}  // namespace pstar
