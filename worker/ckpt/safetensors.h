// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data.
// Used for checkpoints, model export and exchanging tensors with PyTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

// F16 and BF16 are read (Hugging Face models often come in them), not written.
enum class Dtype { kF32, kF64, kI32, kF16, kBF16 };
const char* DtypeName(Dtype d);  // "F32", "F64", "I32", "F16", "BF16"
int DtypeBytes(Dtype d);

// Size and CRC-64 (worker/ckpt/crc64.h) of every byte of a written file.
struct FileDigest {
  int64_t bytes = 0;
  uint64_t crc64 = 0;
};

class SafetensorsWriter {
 public:
  // Produces bytes [offset, offset + bytes) of a tensor's data into `dst`.
  using Fetch = std::function<Status(char* dst, int64_t offset, int64_t bytes)>;
  // The most bytes one Fetch call asks for: the size of Write's staging buffer.
  static constexpr int64_t kFetchBlockBytes = int64_t(4) << 20;

  // Copies the tensor's bytes.
  void Add(const std::string& name, Dtype dtype, std::vector<int64_t> shape, const void* data);
  // Refers to the bytes at `data`, which must stay valid until Write returns.
  void AddView(const std::string& name, Dtype dtype, std::vector<int64_t> shape, const void* data);
  // Bytes produced by `fetch` while Write runs (memory the host cannot read
  // directly, say), in order, at most kFetchBlockBytes per call, into one
  // staging buffer that Write allocates once. A fetch error aborts Write.
  void AddFetched(const std::string& name, Dtype dtype, std::vector<int64_t> shape, Fetch fetch);
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Written atomically (temp file, fsync, rename), streaming the tensors in
  // order of addition. `digest`, when given, receives the file's size and CRC.
  // On any error (a fetch's, prefixed with the path and tensor) nothing is
  // written at `path`.
  Status Write(const std::string& path, FileDigest* digest = nullptr) const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
    std::string owned;           // Add
    const char* view = nullptr;  // AddView
    Fetch fetch;                 // AddFetched
    int64_t bytes = 0;
    const char* data() const { return view != nullptr ? view : owned.data(); }
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsFile {
 public:
  struct Tensor {
    Dtype dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // byte range in the data section
    int64_t numel() const;
  };

  // Reads and validates a file; DataLoss names the file and what is wrong.
  static Result<SafetensorsFile> Read(const std::string& path);

  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A tensor's values converted to double; NotFound when absent.
  Result<std::vector<double>> ToDoubles(const std::string& name) const;
  // A floating-point tensor's values as floats (F16 and BF16 widen exactly;
  // F64 rounds); InvalidArgument for an integer tensor.
  Result<std::vector<float>> ToFloats(const std::string& name) const;

 private:
  std::string path_;
  std::string data_;  // the data section
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Only the header of a safetensors file, read without its data: where each
// tensor's bytes lie in the file. Validated as SafetensorsFile::Read does,
// against the file's size on disk.
struct SafetensorsHeader {
  std::map<std::string, SafetensorsFile::Tensor> tensors;
  std::map<std::string, std::string> metadata;
  int64_t data_offset = 0;  // file offset of the data section
  int64_t file_bytes = 0;

  static Result<SafetensorsHeader> Read(const std::string& path);
};

}  // namespace pstar
