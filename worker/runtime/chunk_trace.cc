#include "worker/runtime/chunk_trace.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

namespace pstar {

void ChunkTrace::BeginStep() {
  moment_ = 0;
  step_moments_.clear();
}

void ChunkTrace::Observe(std::vector<int32_t> moment) {
  // A moment beyond or unlike the recorded sequence means the trace no
  // longer predicts anything: LRU until this step is re-recorded.
  if (valid_ && (moment_ >= int64_t(trace_.size()) || trace_[size_t(moment_)] != moment)) valid_ = false;
  step_moments_.push_back(std::move(moment));
}

void ChunkTrace::EndStep() {
  if (valid_ && moment_ == int64_t(trace_.size())) return;
  trace_ = std::move(step_moments_);
  step_moments_.clear();
  uses_.assign(size_t(total_chunks_), {});
  for (size_t m = 0; m < trace_.size(); ++m) {
    for (int32_t index : trace_[m]) uses_[size_t(index)].push_back(int32_t(m));
  }
  valid_ = true;
  ++recordings_;
}

int64_t ChunkTrace::NextUseDistance(int32_t index) const {
  const std::vector<int32_t>& uses = uses_[size_t(index)];
  if (uses.empty() || moment_ >= int64_t(trace_.size())) return std::numeric_limits<int64_t>::max();
  auto it = std::upper_bound(uses.begin(), uses.end(), int32_t(moment_));
  if (it != uses.end()) return *it - moment_;
  return int64_t(trace_.size()) - moment_ + uses.front();
}

ChunkTrace::HeldRun ChunkTrace::CurrentRun(int32_t index) const {
  const std::vector<int32_t>& uses = uses_[size_t(index)];
  if (moment_ < 0 || moment_ >= int64_t(trace_.size())) return {};
  auto it = std::lower_bound(uses.begin(), uses.end(), int32_t(moment_));
  if (it == uses.end() || *it != moment_) return {};
  while (std::next(it) != uses.end() && *std::next(it) == *it + 1) ++it;
  HeldRun run;
  run.release = *it + 1 - moment_;
  if (std::next(it) != uses.end()) {
    run.next_use = *std::next(it) - moment_;
  } else {
    run.next_use = int64_t(trace_.size()) - moment_ + uses.front();  // the next step's first use
  }
  return run;
}

}  // namespace pstar
