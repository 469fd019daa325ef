// Eviction: which unpinned device copy gives up its slot. With a valid trace
// and OPT, the one whose next use is farthest away (Belady); otherwise the
// least recently used. Ties go to a clean copy (no write-back), then to the
// lower chunk index.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "worker/runtime/chunk_runtime_options.h"
#include "worker/runtime/chunk_trace.h"

namespace pstar {

struct EvictionCandidate {
  int32_t index = 0;
  bool dirty = false;      // its device copy is newer than its home
  int64_t last_use = 0;    // access tick
};

// The chunk to evict among `candidates`, or -1. A prefetch passes
// `must_outlive` > 0: only chunks next used more than that many moments
// ahead may go, and without OPT's prediction none does (it never evicts
// blindly).
int32_t ChooseVictim(std::span<const EvictionCandidate> candidates, EvictionPolicy policy, const ChunkTrace& trace,
                     int64_t must_outlive);

// Whether OPT, serving the trace's moments from the current one on with
// `slots` slots, would drop `victim` before its next use anyway: some moment
// before that use needs every slot for chunks used both then-or-earlier and
// again before it, each taken `prefetch_depth` moments before its first use
// (`resident` lists the chunks in the slots now, pinned ones included;
// `in_pool` says which chunks share those slots), except a chunk `filled`
// says is zeros written at its use, not a copy brought ahead: it takes its
// slot at that use. Dropping such a victim now costs nothing it would not
// cost later. Needs a valid trace.
bool OptDropsBeforeNextUse(const ChunkTrace& trace, std::span<const int32_t> resident, int32_t slots,
                           int32_t prefetch_depth, int32_t victim, const std::function<bool(int32_t index)>& in_pool,
                           const std::function<bool(int32_t index)>& filled = nullptr);

}  // namespace pstar
