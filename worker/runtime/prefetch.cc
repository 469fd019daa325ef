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
  NextStepPrefetch walk;
  walk.Finish(trace, depth, placement, load);
}

void NextStepPrefetch::Advance(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement,
                               const PrefetchLoad& load, const Ready& ready) {
  if (ended_) return;
  if (depth <= 0 || !trace.valid()) {
    ended_ = true;
    return;
  }
  trace.set_moment(-1);
  for (; moment_ < depth && moment_ < trace.size(); ++moment_, position_ = 0) {
    const std::vector<int32_t>& moment = trace.MomentAt(moment_);
    for (; position_ < moment.size(); ++position_) {
      const int32_t index = moment[position_];
      if (placement.KindOf(index) == StateKind::kGrad) continue;
      if (ready && !ready(index)) return;
      if (!load(index, moment_ + 1)) {
        ended_ = true;
        return;
      }
    }
  }
  ended_ = true;
}

void NextStepPrefetch::Finish(ChunkTrace& trace, int32_t depth, const ChunkPlacement& placement,
                              const PrefetchLoad& load) {
  if (depth <= 0 || !trace.valid()) {  // nothing walked: the moment stays
    ended_ = true;
    return;
  }
  Advance(trace, depth, placement, load, nullptr);
  trace.set_moment(0);
}

}  // namespace pstar
