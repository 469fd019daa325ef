// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data.
// Used for checkpoints, model export and exchanging tensors with PyTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

enum class Dtype { kF32, kF64, kI32 };
const char* DtypeName(Dtype d);  // "F32", "F64", "I32"
int DtypeBytes(Dtype d);

class SafetensorsWriter {
 public:
  void Add(const std::string& name, Dtype dtype, std::vector<int64_t> shape, const void* data);
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Written atomically (temp file, fsync, rename).
  Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
    std::string bytes;
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

 private:
  std::string path_;
  std::string data_;  // the data section
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pstar
