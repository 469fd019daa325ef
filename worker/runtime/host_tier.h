// HostTier: the host homes of every chunk not homed on the device, in one
// block from the backend (pinned on a GPU). With N ranks each home is this
// rank's shard. In order: params (fp32; with 16-bit params the fp32 masters,
// less those homed on the device), grads (fp32, or 16-bit with half_grads),
// then each moment kind less its device- and disk-homed chunks, starting on
// a cache line, then the 16-bit param homes of the chunks whose masters are
// on disk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/core/status.h"
#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_runtime_options.h"
#include "worker/runtime/device_backend.h"

namespace pstar {

class HostTier {
 public:
  HostTier() = default;
  static Result<HostTier> Create(DeviceBackend& backend, const ChunkPlacement& placement, int64_t shard_bytes,
                                 const ChunkRuntimeOptions& options);

  // The home of a chunk homed on the host, and its bytes (half a shard for a
  // 16-bit home).
  std::byte* Home(int32_t index) const;
  int64_t HomeBytes(int32_t index) const { return placement_.HalfHomed(index) ? shard_bytes_ / 2 : shard_bytes_; }
  // The home as fp32 (not a 16-bit home), or as 16-bit values (one).
  float* Fp32Home(int32_t index) const;
  uint16_t* HalfHome(int32_t index) const;
  // The 16-bit home of a param whose fp32 master is on disk: its master
  // narrowed, what streams to the device.
  uint16_t* HalfParamHome(int32_t index) const;
  int64_t bytes() const { return int64_t(block_.bytes()); }

 private:
  MemoryBlock block_;
  ChunkPlacement placement_;
  int64_t shard_bytes_ = 0;
};

}  // namespace pstar
