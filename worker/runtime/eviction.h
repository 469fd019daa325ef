// Eviction: which unpinned device copy gives up its slot. With a valid trace
// and OPT, the one whose next use is farthest away (Belady); otherwise the
// least recently used. Ties go to a clean copy (no write-back), then to the
// lower chunk index.
#pragma once

#include <cstdint>
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

}  // namespace pstar
