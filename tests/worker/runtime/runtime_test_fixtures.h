// Helpers the chunk runtime's unit tests share.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_trace.h"

namespace pstar::test {

// A placement of `n` chunks per kind, the first `homed` with their Adam on the device.
inline ChunkPlacement Placement(int32_t n, int32_t homed, bool half_params, bool half_grads) {
  ChunkPlacement p;
  p.num_chunks = n;
  p.device_adam_chunks = homed;
  p.half_params = half_params;
  p.half_grads = half_grads;
  return p;
}

// Records one step of the given moments.
inline void RecordStep(ChunkTrace& t, const std::vector<std::vector<int32_t>>& moments) {
  t.BeginStep();
  for (const auto& m : moments) {
    t.Observe(m);
    t.Advance();
  }
  t.EndStep();
}

}  // namespace pstar::test
