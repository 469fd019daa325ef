// The weights of a Hugging Face model directory, opened without reading
// them: DIR/model.safetensors, or the shards DIR/model.safetensors.index.json
// names. Opening reads and checks every file's header (a tensor named twice,
// in one file or in two, one the index misplaces, a file the index names
// that is not there, a header that overlaps or overruns its file, a dtype
// other than BF16, F16 and F32); tensors' element ranges are then read on
// demand through a caller's bounded buffer, so a model far larger than
// memory streams in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/ckpt/safetensors.h"
#include "worker/core/file_util.h"
#include "worker/core/status.h"

namespace pstar {

class HfWeights {
 public:
  struct Tensor {
    int file = 0;  // index into files()
    Dtype dtype = Dtype::kF32;
    std::vector<int64_t> shape;
    int64_t offset = 0;  // file offset of element 0
    int64_t numel = 0;
  };

  // DataLoss / NotFound / InvalidArgument name the file and what is wrong.
  static Result<HfWeights> Open(const std::string& dir);

  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const Tensor* Find(const std::string& name) const;
  // The path of file `file` (for errors).
  const std::string& file_path(int file) const { return files_[size_t(file)].path(); }
  int num_files() const { return int(files_.size()); }

  // Elements [first, first + count) of tensor `name` as floats into `dst`.
  // F32 is read straight into dst; BF16 and F16 through `staging` (at most
  // its size at a time, which must be at least 1), widened exactly.
  Status ReadFloats(const std::string& name, int64_t first, int64_t count, float* dst,
                    std::vector<uint16_t>& staging) const;

 private:
  std::vector<RandomAccessFile> files_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace pstar
