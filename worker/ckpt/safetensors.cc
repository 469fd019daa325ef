#include "worker/ckpt/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "worker/ckpt/crc64.h"
#include "worker/core/file_util.h"
#include "worker/runtime/half_format.h"

namespace pstar {

namespace {

// Safetensors caps the header at 100 MB; a larger length is a corrupt file.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

// Parses a header's JSON against a data section of `data_bytes`.
Status ParseHeader(const std::string& path, std::string_view json, int64_t data_bytes,
                   std::map<std::string, SafetensorsFile::Tensor>* tensors,
                   std::map<std::string, std::string>* metadata) {
  nlohmann::json header;
  // A name given twice would otherwise keep its last entry silently.
  std::set<std::string> names;
  std::string duplicate;
  const auto note_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    header = nlohmann::json::parse(json, note_keys);
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(path + ": bad safetensors header: " + e.what());
  }
  if (!header.is_object()) return Status::DataLoss(path + ": safetensors header is not an object");
  if (!duplicate.empty()) return Status::DataLoss(path + ": tensor " + duplicate + " is named twice in the header");
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it->begin(); m != it->end(); ++m) (*metadata)[m.key()] = m->get<std::string>();
        continue;
      }
      SafetensorsFile::Tensor t;
      std::string dtype = it->at("dtype").get<std::string>();
      if (dtype == "F32") t.dtype = Dtype::kF32;
      else if (dtype == "F64") t.dtype = Dtype::kF64;
      else if (dtype == "I32") t.dtype = Dtype::kI32;
      else if (dtype == "F16") t.dtype = Dtype::kF16;
      else if (dtype == "BF16") t.dtype = Dtype::kBF16;
      else return Status::DataLoss(path + ": tensor " + it.key() + " has unsupported dtype " + dtype);
      t.shape = it->at("shape").get<std::vector<int64_t>>();
      // The elements, counted without overflow: past the data section's
      // bytes the shape cannot match anything in this file.
      int64_t elements = 1;
      for (int64_t d : t.shape) {
        if (d < 0) return Status::DataLoss(path + ": tensor " + it.key() + " has a negative dimension");
        if (d > 0 && elements > data_bytes / d) {
          return Status::DataLoss(path + ": tensor " + it.key() + " has a shape larger than the file");
        }
        elements *= d;
      }
      auto offsets = it->at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] || offsets[1] > data_bytes) {
        return Status::DataLoss(path + ": tensor " + it.key() + " lies outside the file (truncated?)");
      }
      t.begin = offsets[0];
      t.end = offsets[1];
      if (t.end - t.begin != t.numel() * DtypeBytes(t.dtype)) {
        return Status::DataLoss(path + ": tensor " + it.key() + " size does not match its shape");
      }
      (*tensors)[it.key()] = t;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(path + ": bad safetensors header: " + e.what());
  }
  // No two tensors share a byte (a writer lays them end to end).
  std::vector<std::pair<int64_t, const std::string*>> by_start;
  for (const auto& [name, t] : *tensors) {
    if (t.end > t.begin) by_start.emplace_back(t.begin, &name);
  }
  std::sort(by_start.begin(), by_start.end());
  for (size_t i = 1; i < by_start.size(); ++i) {
    const SafetensorsFile::Tensor& prev = tensors->at(*by_start[i - 1].second);
    if (prev.end > by_start[i].first) {
      return Status::DataLoss(path + ": tensors " + *by_start[i - 1].second + " and " + *by_start[i].second +
                              " overlap in the file");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "F32";
    case Dtype::kF64: return "F64";
    case Dtype::kI32: return "I32";
    case Dtype::kF16: return "F16";
    case Dtype::kBF16: return "BF16";
  }
  return "?";
}

int DtypeBytes(Dtype d) { return d == Dtype::kF64 ? 8 : d == Dtype::kF16 || d == Dtype::kBF16 ? 2 : 4; }

int64_t SafetensorsFile::Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void SafetensorsWriter::Add(const std::string& name, Dtype dtype, std::vector<int64_t> shape,
                            const void* data) {
  AddView(name, dtype, std::move(shape), data);
  Entry& e = entries_.back();
  e.owned.assign(e.view, size_t(e.bytes));
  e.view = nullptr;
}

void SafetensorsWriter::AddView(const std::string& name, Dtype dtype, std::vector<int64_t> shape,
                                const void* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Entry e{name, dtype, std::move(shape), {}, static_cast<const char*>(data), {}, n * DtypeBytes(dtype)};
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::AddFetched(const std::string& name, Dtype dtype, std::vector<int64_t> shape, Fetch fetch) {
  AddView(name, dtype, std::move(shape), nullptr);
  entries_.back().fetch = std::move(fetch);
}

Status SafetensorsWriter::Write(const std::string& path, FileDigest* digest) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  int64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", DtypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');  // keeps the data 8-byte aligned
  const uint64_t len = json.size();
  std::string prefix(reinterpret_cast<const char*>(&len), 8);
  prefix += json;

  PSTAR_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  Crc64 crc;
  int64_t written = 0;
  auto append = [&](const char* p, int64_t n) {
    crc.Update(p, size_t(n));
    written += n;
    return file.Append(std::string_view(p, size_t(n)));
  };
  PSTAR_RETURN_IF_ERROR(append(prefix.data(), int64_t(prefix.size())));
  // Fetched tensors pass through one staging buffer, sized for the largest.
  int64_t staging_bytes = 0;
  for (const auto& e : entries_) {
    if (e.fetch) staging_bytes = std::max(staging_bytes, std::min(e.bytes, kFetchBlockBytes));
  }
  std::vector<char> staging(static_cast<size_t>(staging_bytes));
  for (const auto& e : entries_) {
    if (!e.fetch) {
      PSTAR_RETURN_IF_ERROR(append(e.data(), e.bytes));
      continue;
    }
    for (int64_t at = 0; at < e.bytes; at += staging_bytes) {
      const int64_t n = std::min(staging_bytes, e.bytes - at);
      Status fetched = e.fetch(staging.data(), at, n);
      if (!fetched.ok()) return fetched.WithPrefix(path + ": fetching " + e.name);
      PSTAR_RETURN_IF_ERROR(append(staging.data(), n));
    }
  }
  PSTAR_RETURN_IF_ERROR(file.Commit());
  if (digest != nullptr) *digest = FileDigest{written, crc.value()};
  return Status::Ok();
}

Result<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  PSTAR_ASSIGN_OR_RETURN(std::string raw, ReadRegularFile(path));
  if (raw.size() < 8) return Status::DataLoss(path + ": truncated safetensors file (no header length)");
  uint64_t len;
  std::memcpy(&len, raw.data(), 8);
  if (len > raw.size() - 8) return Status::DataLoss(path + ": truncated safetensors header");
  SafetensorsFile f;
  f.path_ = path;
  f.data_ = raw.substr(8 + len);
  PSTAR_RETURN_IF_ERROR(ParseHeader(path, std::string_view(raw).substr(8, len), int64_t(f.data_.size()),
                                    &f.tensors_, &f.metadata_));
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
      case Dtype::kF16:
      case Dtype::kBF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        float v;
        WidenFromHalf(&v, &h, 1, t.dtype == Dtype::kF16 ? HalfFormat::kFp16 : HalfFormat::kBf16);
        out[i] = v;
        break;
      }
    }
  }
  return out;
}

Result<std::vector<float>> SafetensorsFile::ToFloats(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Status::NotFound(path_ + ": no tensor " + name);
  const Tensor& t = it->second;
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);
  const char* p = data_.data() + t.begin;
  switch (t.dtype) {
    case Dtype::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case Dtype::kF64:
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = float(v);
      }
      break;
    case Dtype::kF16:
    case Dtype::kBF16: {
      std::vector<uint16_t> h(n);
      std::memcpy(h.data(), p, n * 2);
      WidenFromHalf(out.data(), h.data(), int64_t(n), t.dtype == Dtype::kF16 ? HalfFormat::kFp16 : HalfFormat::kBf16);
      break;
    }
    case Dtype::kI32:
      return Status::InvalidArgument(path_ + ": tensor " + name + " holds integers, not floats");
  }
  return out;
}

Result<SafetensorsHeader> SafetensorsHeader::Read(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::NotFound(path + ": no such file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::NotFound(path + ": cannot stat: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  SafetensorsHeader h;
  h.file_bytes = int64_t(size);
  uint64_t len = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&len), 8)) {
    return Status::DataLoss(path + ": truncated safetensors file (no header length)");
  }
  if (len > size - 8 || len > kMaxHeaderBytes) return Status::DataLoss(path + ": truncated safetensors header");
  std::string json(size_t(len), '\0');
  if (!in.read(json.data(), std::streamsize(len))) return Status::DataLoss(path + ": cannot read the header");
  h.data_offset = int64_t(8 + len);
  PSTAR_RETURN_IF_ERROR(ParseHeader(path, json, h.file_bytes - h.data_offset, &h.tensors, &h.metadata));
  return h;
}

}  // namespace pstar
