// ParamLayout: the table that maps every model tensor to (chunk, offset).
// Tensors are packed into fixed-size chunks in order of first use; a tensor never
// straddles two chunks, nor does a group of joined tensors (one GEMM's operand
// made of several named tensors, such as q|k|v). Every state kind (param, grad, Adam moments) shares this
// one layout, so a tensor has the same chunk index and offset in each kind.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

using TensorId = int32_t;

// How a tensor is initialized and whether weight decay applies to it.
enum class TensorRole {
  kEmbedding,       // normal(0, std), decayed
  kWeight,          // normal(0, std), decayed
  kBias,            // zeros, not decayed
  kNormWeight,      // ones, not decayed
  kNormBias,        // zeros, not decayed
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::kWeight;
  float init_std = 0.0f;  // for kEmbedding / kWeight
  // Trailing rows of shape[0] that only pad the tensor for the kernels (the
  // vocabulary rounded up to a multiple of 64): always zero, never given a
  // gradient, and left out of checkpoints, exports and the layout fingerprint.
  int64_t padded_rows = 0;
  // Placed right after the tensor before it, in the same chunk: the two (and
  // any joined after them) are one contiguous operand, each still named and
  // checkpointed alone (q_proj|k_proj|v_proj, gate_proj|up_proj).
  bool joined = false;
  // A row part: rows [part_row, part_row + shape[0]) of the tensor `part_of`
  // (empty: the tensor is whole). A 128k vocabulary's embedding and
  // classifier are stored as parts no larger than a block's tensors, so that
  // the chunk size follows the blocks; checkpoints, exports and users see
  // the whole tensor (`tensor()`), of which each part is an element range.
  // Only the last part has padded rows.
  std::string part_of;
  int64_t part_row = 0;

  int64_t numel() const;
  // The tensor as checkpoints name it: the whole tensor a part belongs to,
  // and where the part's first element is in it.
  const std::string& tensor() const { return part_of.empty() ? name : part_of; }
  int64_t tensor_offset() const;
  // The tensor as users see it: shape[0] without the padded rows.
  std::vector<int64_t> visible_shape() const;
  int64_t visible_numel() const;
  bool decayed() const { return role == TensorRole::kEmbedding || role == TensorRole::kWeight; }
};

struct TensorPlacement {
  int32_t chunk = 0;
  int64_t offset = 0;  // elements from the chunk start
};

class ParamLayout {
 public:
  // Packs `specs` (in first-use order) into chunks of `chunk_elems` elements;
  // 0 picks the size with the least padding (see ChooseChunkElems).
  static Result<ParamLayout> Build(std::vector<TensorSpec> specs, int64_t chunk_elems);

  // The chunk size with the least padding among sizes >= the largest tensor
  // group (ties go to the smaller chunk); rounded to 1024 elements.
  static int64_t ChooseChunkElems(const std::vector<TensorSpec>& specs);

  int32_t num_tensors() const { return int32_t(specs_.size()); }
  const TensorSpec& spec(TensorId id) const { return specs_[size_t(id)]; }
  const TensorPlacement& placement(TensorId id) const { return placements_[size_t(id)]; }
  // Id of the tensor called `name`, or -1.
  TensorId Find(const std::string& name) const;

  int32_t num_chunks() const { return num_chunks_; }
  int64_t chunk_elems() const { return chunk_elems_; }
  int64_t num_elements() const { return num_elements_; }       // sum of tensor sizes
  int64_t padded_elements() const { return int64_t(num_chunks_) * chunk_elems_; }
  // Tensors in chunk `c`, in offset order.
  const std::vector<TensorId>& chunk_tensors(int32_t c) const { return chunk_tensors_[size_t(c)]; }

 private:
  std::vector<TensorSpec> specs_;
  std::unordered_map<std::string, TensorId> ids_;  // name -> id: Find is O(1)
  std::vector<TensorPlacement> placements_;
  std::vector<std::vector<TensorId>> chunk_tensors_;
  int32_t num_chunks_ = 0;
  int64_t chunk_elems_ = 0;
  int64_t num_elements_ = 0;
};

}  // namespace pstar
