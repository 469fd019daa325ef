#include "worker/runtime/eviction.h"

namespace pstar {

const char* EvictionPolicyName(EvictionPolicy policy) {
  return policy == EvictionPolicy::kOpt ? "opt" : "lru";
}

int32_t ChooseVictim(std::span<const EvictionCandidate> candidates, EvictionPolicy policy, const ChunkTrace& trace,
                     int64_t must_outlive) {
  const bool opt = policy == EvictionPolicy::kOpt && trace.valid();
  if (must_outlive > 0 && !opt) return -1;
  int32_t best = -1;
  int64_t best_score = 0;
  bool best_dirty = true;
  for (const EvictionCandidate& c : candidates) {
    int64_t score;
    if (opt) {
      score = trace.NextUseDistance(c.index);  // farther is better
      if (score <= must_outlive) continue;
    } else {
      score = -c.last_use;  // older is better
    }
    // Higher score wins; on a tie a clean copy, then the lower index.
    if (best < 0 || score > best_score || (score == best_score && best_dirty && !c.dirty) ||
        (score == best_score && best_dirty == c.dirty && c.index < best)) {
      best = c.index;
      best_score = score;
      best_dirty = c.dirty;
    }
  }
  return best;
}

}  // namespace pstar
