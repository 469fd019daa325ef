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

}  // namespace pstar
