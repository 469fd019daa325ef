#include "worker/runtime/chunk_event_log.h"

#include <cstdio>

#include "worker/core/file_util.h"

namespace pstar {

const char* ChunkEventKindName(ChunkEventKind kind) {
  switch (kind) {
    case ChunkEventKind::kStepBegin: return "step_begin";
    case ChunkEventKind::kForwardUse: return "forward_use";
    case ChunkEventKind::kBackwardUse: return "backward_use";
    case ChunkEventKind::kGradFinal: return "grad_final";
    case ChunkEventKind::kUpdateBegin: return "update_begin";
    case ChunkEventKind::kUpdateEnd: return "update_end";
    case ChunkEventKind::kUpdateUndone: return "update_undone";
    case ChunkEventKind::kUpdateWait: return "update_wait";
    case ChunkEventKind::kStepEnd: return "step_end";
    case ChunkEventKind::kGatherBegin: return "gather_begin";
    case ChunkEventKind::kGatherEnd: return "gather_end";
    case ChunkEventKind::kReduceScatterBegin: return "reduce_scatter_begin";
    case ChunkEventKind::kReduceScatterEnd: return "reduce_scatter_end";
  }
  return "?";
}

void ChunkEventLog::Record(int64_t step, ChunkEventKind kind, int32_t chunk) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  ChunkEvent event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event = {int64_t(events_.size()), step, kind, chunk, t};
    events_.push_back(event);
  }
  if (listener_) listener_(event);
}

std::vector<ChunkEvent> ChunkEventLog::Events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::string ChunkEventLog::ToCsv() const {
  std::string out = "seq,step,event,chunk,time_s\n";
  char line[128];
  for (const ChunkEvent& e : Events()) {
    std::snprintf(line, sizeof line, "%lld,%lld,%s,%d,%.9f\n", static_cast<long long>(e.seq),
                  static_cast<long long>(e.step), ChunkEventKindName(e.kind), e.chunk, e.time_s);
    out += line;
  }
  return out;
}

Status ChunkEventLog::WriteCsv(const std::string& path) const { return WriteFileAtomically(path, ToCsv()); }

}  // namespace pstar
