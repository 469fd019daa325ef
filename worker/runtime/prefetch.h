// Prefetch: which chunks to bring to the device before their moment, in what
// order, read from the trace (nothing without a valid one or with depth 0).
// `load(index, must_outlive)` brings one chunk (or finds it there already)
// and returns false when no slot can be had without evicting a chunk needed
// within `must_outlive` moments: prefetch then stops.
#pragma once

#include <cstdint>
#include <functional>

#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_trace.h"

namespace pstar {

using PrefetchLoad = std::function<bool(int32_t index, int64_t must_outlive)>;

// The chunks of this step's next `depth` moments, nearest first; never
// beyond the step (the optimizer rewrites params between steps).
void PrefetchWithinStep(const ChunkTrace& trace, int32_t depth, const PrefetchLoad& load);

// Between steps: the chunks of the next step's first `depth` moments, less
// its gradients (every step starts them as zeros, a fill, not a copy).
// Distances count from just before that step's first moment.
void PrefetchNextStep(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement, const PrefetchLoad& load);

// The same walk in pieces, for chunks that become ready one by one (their
// optimizer updates end): each Advance goes on from where the last one
// stopped and stops at the first chunk `ready` refuses; the walk ends for
// good at the depth or at a chunk without room. The trace's moment is -1
// from the first Advance until Finish, which walks the rest as ready and
// sets it to 0.
class NextStepPrefetch {
 public:
  using Ready = std::function<bool(int32_t index)>;
  void Reset() { moment_ = 0, position_ = 0, ended_ = false; }
  void Advance(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement, const PrefetchLoad& load,
               const Ready& ready);
  void Finish(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement, const PrefetchLoad& load);
  bool ended() const { return ended_; }

 private:
  int64_t moment_ = 0;   // the next moment to load
  size_t position_ = 0;  // within it
  bool ended_ = false;
};

}  // namespace pstar
