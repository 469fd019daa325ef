// TierLayout: the arithmetic that sizes the device tier and the host homes,
// shared by the chunk manager (what it carves) and the planner (what it
// promises), so the two can never disagree. Pure functions of the chunk
// count, the chunk bytes and the options.
//
// The device block, in order: the non-model region (activations and
// workspaces), the staging area for 16-bit gradient conversions, the pools of
// streaming slots (chunk-sized; half-size for 16-bit params), then the homes
// of the chunks whose Adam runs on the device.
#pragma once

#include <cstdint>

#include "worker/runtime/chunk_runtime_options.h"

namespace pstar {

class TierLayout {
 public:
  // Every slot, region and home starts on this boundary.
  static constexpr int64_t kAlignment = 64;
  static int64_t Align(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // A chunk-sized slot, and a 16-bit param copy's.
  static int64_t SlotBytes(int64_t chunk_bytes) { return Align(chunk_bytes); }
  static int64_t HalfSlotBytes(int64_t chunk_bytes) { return Align(SlotBytes(chunk_bytes) / 2); }
  // The param and grad chunks one moment pins at most (param_device: each pool's minimum).
  static int64_t MinParamChunks(const ChunkRuntimeOptions& options);
  static int64_t MinGradChunks(const ChunkRuntimeOptions& options);

  // How the streaming room divides (what ChunkManager::Create carves):
  // chunk-sized slots, half-size slots for 16-bit params (param_device only),
  // and the chunks whose Adam runs on the device (their moments, and with
  // param_device their masters, homed there: HomedKinds slots each).
  struct TierSlots {
    int64_t full = 0;
    int64_t half = 0;
    int32_t device_adam_chunks = 0;
  };
  static TierSlots LayOutSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  static int64_t HomedKinds(const ChunkRuntimeOptions& options) { return options.param_device.has_value() ? 3 : 2; }
  // Host staging for narrowing params on their way to a GPU (two pieces of
  // pinned memory, with param_device; 0 where the device is host memory).
  static int64_t ParamStagingBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options, bool device_is_host);
  // The device tier's capacity: the budget, never more than everything.
  static int64_t DeviceCapacity(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  // Chunk slots of the tier (streaming and homed together), fp32 params.
  static int64_t DeviceSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  // The slots params and grads keep to stream through.
  static int64_t StreamingReserve(int32_t num_chunks, const ChunkRuntimeOptions& options);
  // How many chunks' optimizer moments the hybrid placement homes on the
  // device (two slots each), fp32 params.
  static int32_t DeviceAdamChunks(int32_t num_chunks, int64_t slots, const ChunkRuntimeOptions& options);
  // Host bytes one rank's home shards take when `device_adam_chunks` chunks
  // have their moments homed on the device (gradients at half size with
  // 16-bit homes).
  static int64_t HostHomeBytes(int32_t num_chunks, int64_t shard_bytes, int32_t device_adam_chunks,
                               const ChunkRuntimeOptions& options);
  // Device bytes for the 16-bit conversions (one chunk; 0 with fp32 homes).
  static int64_t StagingBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  // Bytes the device tier needs at least: non-model, staging, and the chunks one moment pins.
  static int64_t MinDeviceBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  // The disk tier (disk_moment_chunks > 0): the bytes of one rank's file
  // (every disk home on a 4 KiB boundary), its host windows (each disk-homed
  // kind of the pinned chunk, of each chunk read ahead, and of the one written
  // behind) and their bytes.
  static int64_t DiskHomeStride(int64_t shard_bytes);
  static int64_t DiskBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options);
  static int32_t DiskWindows(const ChunkRuntimeOptions& options);
  static int64_t DiskWindowBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options);
};

}  // namespace pstar
