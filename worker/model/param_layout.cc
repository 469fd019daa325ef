#include "worker/model/param_layout.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace pstar {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorSpec::tensor_offset() const {
  if (part_of.empty()) return 0;
  int64_t row = 1;
  for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
  return part_row * row;
}

std::vector<int64_t> TensorSpec::visible_shape() const {
  std::vector<int64_t> v = shape;
  if (!v.empty()) v[0] -= padded_rows;
  return v;
}

int64_t TensorSpec::visible_numel() const {
  int64_t n = 1;
  for (int64_t d : visible_shape()) n *= d;
  return n;
}

namespace {

constexpr int64_t kChunkAlign = 1024;

int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Number of chunks greedy first-use packing needs at chunk size `s`, every
// tensor at most `s`: each chunk takes the longest run of tensors that fits.
// `prefix[i]` is the elements of tensors [0, i); a run's end is found by
// galloping from its start, so a count costs O(chunks log(tensors per
// chunk)), not O(tensors) (the planner counts for some 2000 sizes, and
// `pstar plan --scale` plans models of up to 10000 layers).
int64_t CountChunks(const std::vector<int64_t>& prefix, int64_t s) {
  const size_t n = prefix.size() - 1;
  int64_t chunks = 0;
  for (size_t i = 0; i < n; ++chunks) {
    const int64_t limit = prefix[i] + s;  // the run [i, j) fits while prefix[j] <= limit
    size_t fits = i + 1, step = 1;        // prefix[fits] <= limit: one tensor always fits
    while (fits + step <= n && prefix[fits + step] <= limit) {
      fits += step;
      step *= 2;
    }
    const size_t end = std::min(n, fits + step);
    i = size_t(
            std::upper_bound(prefix.begin() + std::ptrdiff_t(fits), prefix.begin() + std::ptrdiff_t(end) + 1, limit) -
            prefix.begin()) -
        1;
  }
  return chunks;
}

}  // namespace

namespace {

// The elements of each run of joined tensors (a tensor alone is a run of one),
// in order: the units packing places.
std::vector<int64_t> GroupSizes(const std::vector<TensorSpec>& specs) {
  std::vector<int64_t> groups;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].joined && !groups.empty()) {
      groups.back() += specs[i].numel();
    } else {
      groups.push_back(specs[i].numel());
    }
  }
  return groups;
}

}  // namespace

int64_t ParamLayout::ChooseChunkElems(const std::vector<TensorSpec>& specs) {
  const std::vector<int64_t> groups = GroupSizes(specs);
  int64_t largest = 0, total = 0;
  for (int64_t n : groups) {
    largest = std::max(largest, n);
    total += n;
  }
  std::vector<int64_t> prefix(groups.size() + 1, 0);
  for (size_t i = 0; i < groups.size(); ++i) prefix[i + 1] = prefix[i] + groups[i];
  int64_t lo = RoundUp(std::max<int64_t>(largest, 1), kChunkAlign);
  int64_t hi = std::max(lo, RoundUp(std::min(total, 2 * lo), kChunkAlign));
  // Scan about 2000 candidates between the largest group and twice that.
  int64_t step = std::max(kChunkAlign, RoundUp((hi - lo) / 2000 + 1, kChunkAlign));
  int64_t best = lo, best_waste = CountChunks(prefix, lo) * lo - total;
  for (int64_t s = lo + step; s <= hi; s += step) {
    int64_t waste = CountChunks(prefix, s) * s - total;
    if (waste < best_waste) {
      best = s;
      best_waste = waste;
    }
  }
  return best;
}

Result<ParamLayout> ParamLayout::Build(std::vector<TensorSpec> specs, int64_t chunk_elems) {
  if (specs.empty()) return Status::InvalidArgument("model has no tensors");
  if (specs[0].joined) return Status::InvalidArgument("tensor " + specs[0].name + " is joined to no tensor before it");
  ParamLayout layout;
  // The largest group, named by its first tensor.
  size_t largest = 0, first = 0;
  int64_t largest_elems = 0, group_elems = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].numel() <= 0) {
      return Status::InvalidArgument("tensor " + specs[i].name + " has no elements");
    }
    if (!specs[i].joined) {
      first = i;
      group_elems = 0;
    }
    group_elems += specs[i].numel();
    if (group_elems > largest_elems) {
      largest = first;
      largest_elems = group_elems;
    }
  }
  if (chunk_elems < 0) return Status::InvalidArgument("chunk size must not be negative");
  if (chunk_elems == 0) chunk_elems = ChooseChunkElems(specs);
  if (chunk_elems < largest_elems) {
    const bool group = largest + 1 < specs.size() && specs[largest + 1].joined;
    return Status::InvalidArgument("chunk size " + std::to_string(chunk_elems) + " elements is smaller than the largest tensor " +
                                   std::string(group ? "group, from " : "") + specs[largest].name + " (" +
                                   std::to_string(largest_elems) + " elements)");
  }
  layout.chunk_elems_ = chunk_elems;
  int64_t used = chunk_elems;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].joined) {
      // A new chunk when this tensor and the ones joined to it do not fit.
      int64_t n = specs[i].numel();
      for (size_t j = i + 1; j < specs.size() && specs[j].joined; ++j) n += specs[j].numel();
      if (used + n > chunk_elems) {
        layout.chunk_tensors_.emplace_back();
        ++layout.num_chunks_;
        used = 0;
      }
    }
    layout.placements_.push_back({layout.num_chunks_ - 1, used});
    layout.chunk_tensors_.back().push_back(TensorId(i));
    used += specs[i].numel();
    layout.num_elements_ += specs[i].numel();
  }
  layout.specs_ = std::move(specs);
  layout.ids_.reserve(layout.specs_.size());
  for (size_t i = 0; i < layout.specs_.size(); ++i) layout.ids_.emplace(layout.specs_[i].name, TensorId(i));
  return layout;
}

TensorId ParamLayout::Find(const std::string& name) const {
  const auto it = ids_.find(name);
  return it == ids_.end() ? -1 : it->second;
}

}  // namespace pstar
