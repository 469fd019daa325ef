// ChunkPlacement: where each chunk's home is and in what form, as fixed at
// start-up. Chunks are numbered kind-major (index = kind * num_chunks +
// chunk). The optimizer moments of the first device_adam_chunks chunks (and,
// with 16-bit params, their fp32 masters) are homed on the device; every
// other chunk is homed on the host, gradients in 16 bits with half_grads.
// The moments of the last disk_chunks chunks are homed on disk instead, and
// with 16-bit params the masters of the last disk_master_chunks; those params
// keep a 16-bit home on the host, which is what streams.
// With 16-bit params, a param chunk's device copy is a read-only 16-bit
// narrowing of its master that streams through half-size slots.
#pragma once

#include <cstdint>

#include "worker/runtime/runtime_counters.h"

namespace pstar {

struct ChunkKey {
  StateKind kind;
  int32_t chunk;
};

struct ChunkPlacement {
  int32_t num_chunks = 0;
  int32_t device_adam_chunks = 0;
  bool half_params = false;  // params stream to the device in 16 bits
  bool half_grads = false;   // gradients are homed on the host in 16 bits
  int32_t disk_chunks = 0;   // the last chunks, whose moments are homed on disk
  int32_t disk_master_chunks = 0;  // the last chunks, whose fp32 masters are (half_params)

  int32_t total() const { return kNumStateKinds * num_chunks; }
  int32_t Index(ChunkKey key) const { return int32_t(key.kind) * num_chunks + key.chunk; }
  ChunkKey KeyOf(int32_t index) const { return {StateKind(index / num_chunks), index % num_chunks}; }
  StateKind KindOf(int32_t index) const { return StateKind(index / num_chunks); }

  // Whether the chunk's optimizer update runs on the device (hybrid Adam).
  bool DeviceAdam(int32_t chunk) const { return chunk < device_adam_chunks; }
  // Moments of device-Adam chunks, and with half_params their masters.
  bool DeviceHomed(int32_t index) const {
    return DeviceAdam(index % num_chunks) && (index >= 2 * num_chunks || (half_params && index < num_chunks));
  }
  // Moments of the last disk_chunks chunks and masters of the last
  // disk_master_chunks, and their number in the disk tier: chunk by chunk
  // (its master, then exp_avg, then exp_avg_sq), so that a sweep over the
  // chunks reads and writes the file front to back.
  bool DiskHomed(int32_t index) const {
    if (index < num_chunks) return index >= num_chunks - disk_master_chunks;
    return index >= 2 * num_chunks && index % num_chunks >= num_chunks - disk_chunks;
  }
  int32_t DiskHome(int32_t index) const {
    const int32_t chunk = index % num_chunks - (num_chunks - disk_chunks);  // among the disk chunks
    const int32_t two = disk_chunks - disk_master_chunks;  // the first ones home only their moments
    const int32_t kind = index / num_chunks;  // 0 (the master), 2 or 3
    if (chunk < two) return 2 * chunk + (kind - 2);
    return 2 * two + 3 * (chunk - two) + (kind == 0 ? 0 : kind - 1);
  }
  // Whether a 16-bit param copy: read-only, in the half-slot pool.
  bool HalfParam(int32_t index) const { return half_params && index < num_chunks; }
  // Whether the chunk's device copies stream through slots: everything not
  // homed on the device, and every 16-bit param copy.
  bool Streams(int32_t index) const { return (!DeviceHomed(index) && !DiskHomed(index)) || HalfParam(index); }
  // Whether the chunk's host home is 16-bit.
  bool HalfHomed(int32_t index) const { return half_grads && index >= num_chunks && index < 2 * num_chunks; }
  // The slot pool a streaming copy takes: 0 chunk-sized, 1 half-size.
  int PoolOf(int32_t index) const { return HalfParam(index) ? 1 : 0; }
};

}  // namespace pstar
