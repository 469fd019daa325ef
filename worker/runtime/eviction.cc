#include "worker/runtime/eviction.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

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

bool OptDropsBeforeNextUse(const ChunkTrace& trace, std::span<const int32_t> resident, int32_t slots,
                           int32_t prefetch_depth, int32_t victim, const std::function<bool(int32_t index)>& in_pool,
                           const std::function<bool(int32_t index)>& filled) {
  const int64_t distance = trace.NextUseDistance(victim);
  if (distance == std::numeric_limits<int64_t>::max()) return true;  // never used again
  const int64_t size = trace.size();
  if (size == 0) return false;
  // Each other chunk used before the victim's next use holds a slot from its
  // first use in that window, less the prefetch's lookahead (from now if it
  // is resident), to its last one: OPT keeps it over the victim, whose next
  // use is farther, and drops it first once those uses are over. The victim
  // goes when such spans alone fill every slot at some moment.
  struct Span {
    int64_t first, last;
  };
  std::unordered_map<int32_t, Span> spans;
  const int64_t now = trace.moment();
  for (int32_t index : resident) {
    if (index != victim) spans[index] = Span{-1, -1};
  }
  for (int64_t d = 0; d < distance; ++d) {
    const int64_t at = now + d;
    if (at < 0) continue;  // prefetching for the next step: its moments start at 0
    for (int32_t index : trace.MomentAt(at % size)) {
      if (index == victim || !in_pool(index)) continue;
      const int64_t lead = filled != nullptr && filled(index) ? 0 : prefetch_depth;
      auto [it, added] = spans.try_emplace(index, Span{std::max<int64_t>(0, d - lead), d});
      if (!added && it->second.first < 0) it->second.first = 0;  // resident: holds its slot from now
      it->second.last = d;
    }
  }
  // The most spans open at once, by a sweep over their ends.
  std::vector<std::pair<int64_t, int>> ends;
  for (const auto& [index, span] : spans) {
    if (span.last < 0) continue;  // resident but not used before the victim: OPT drops it first
    ends.push_back({span.first, +1});
    ends.push_back({span.last + 1, -1});
  }
  std::sort(ends.begin(), ends.end());
  int open = 0;
  for (const auto& [at, change] : ends) {
    open += change;
    if (open >= slots) return true;
  }
  return false;
}

}  // namespace pstar
