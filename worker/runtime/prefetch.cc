#include "worker/runtime/prefetch.h"

namespace pstar {

void PrefetchWithinStep(const ChunkTrace& trace, int32_t depth, const PrefetchLoad& load) {
  if (depth <= 0 || !trace.valid()) return;
  for (int64_t j = 1; j <= depth && trace.moment() + j < trace.size(); ++j) {
    for (int32_t index : trace.MomentAt(trace.moment() + j)) {
      if (!load(index, j)) return;
    }
  }
}

void PrefetchNextStep(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement, const PrefetchLoad& load) {
  if (depth <= 0 || !trace.valid()) return;
  trace.set_moment(-1);
  for (int64_t j = 0; j < depth && j < trace.size(); ++j) {
    bool room = true;
    for (int32_t index : trace.MomentAt(j)) {
      if (placement.KindOf(index) == StateKind::kGrad) continue;
      if (!(room = load(index, j + 1))) break;
    }
    if (!room) break;
  }
  trace.set_moment(0);
}

}  // namespace pstar
