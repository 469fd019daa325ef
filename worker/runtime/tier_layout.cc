#include "worker/runtime/tier_layout.h"

#include <algorithm>

#include "worker/runtime/runtime_counters.h"

namespace pstar {

namespace {

// The kinds that can be on the device: all four with the hybrid Adam
// placement, else params and grads (the moments never leave the host).
int64_t DeviceKinds(const ChunkRuntimeOptions& options) { return options.hybrid_adam ? kNumStateKinds : 2; }

// Params narrowed on the host go up in pieces of at most this many bytes, two
// pinned buffers in turn: one is filled while the other's copy runs.
constexpr int64_t kParamStagingPiece = int64_t{16} << 20;

}  // namespace

int64_t TierLayout::MinParamChunks(const ChunkRuntimeOptions& o) {
  return o.min_param_chunks_per_moment > 0 ? o.min_param_chunks_per_moment : o.min_chunks_per_moment;
}

int64_t TierLayout::MinGradChunks(const ChunkRuntimeOptions& o) {
  return o.min_grad_chunks_per_moment > 0 ? o.min_grad_chunks_per_moment : o.min_chunks_per_moment;
}

int64_t TierLayout::StagingBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  // Half a chunk per copy direction.
  return options.grad_home.has_value() ? 2 * Align(SlotBytes(chunk_bytes) / 2) : 0;
}

int64_t TierLayout::ParamStagingBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options,
                                      bool device_is_host) {
  if (!options.param_device.has_value() || device_is_host) return 0;
  return 2 * std::min(Align(shard_bytes / 2), kParamStagingPiece);
}

int64_t TierLayout::DeviceCapacity(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t n = num_chunks, slot = SlotBytes(chunk_bytes);
  const int64_t chunks = options.param_device.has_value()
                             ? n * HalfSlotBytes(chunk_bytes) + n * slot + (options.hybrid_adam ? 3 * n * slot : 0)
                             : DeviceKinds(options) * n * slot;
  const int64_t everything = Align(options.non_model_bytes) + StagingBytes(chunk_bytes, options) + chunks;
  // More than everything would be memory nothing uses: the tier is never larger.
  if (options.device_capacity_bytes > 0) return std::min(options.device_capacity_bytes, everything);
  return everything;
}

int64_t TierLayout::DeviceSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t room = DeviceCapacity(num_chunks, chunk_bytes, options) - Align(options.non_model_bytes) -
                       StagingBytes(chunk_bytes, options);
  if (room <= 0) return 0;
  return std::min(room / SlotBytes(chunk_bytes), DeviceKinds(options) * num_chunks);
}

int64_t TierLayout::StreamingReserve(int32_t num_chunks, const ChunkRuntimeOptions& options) {
  // The chunks one moment pins, for this moment and each one prefetched
  // ahead of it; never more than every param and grad chunk.
  const int64_t working = int64_t(options.min_chunks_per_moment) * (1 + std::max(0, options.prefetch_depth));
  return std::min<int64_t>(working, 2 * int64_t(num_chunks));
}

int32_t TierLayout::DeviceAdamChunks(int32_t num_chunks, int64_t slots, const ChunkRuntimeOptions& options) {
  if (!options.hybrid_adam) return 0;
  // Room for every chunk of every kind: everything stays, no margin is needed
  // (slots are exact, nothing fragments).
  if (slots >= int64_t(kNumStateKinds) * num_chunks) return num_chunks;
  // Otherwise a share of the room beyond what params and grads stream
  // through homes optimizer moments, two slots per chunk.
  const int64_t spare = slots - StreamingReserve(num_chunks, options);
  if (spare < 2) return 0;
  const int64_t n = int64_t(double(spare) * options.margin_use_ratio) / 2;
  return int32_t(std::min<int64_t>(n, num_chunks));
}

TierLayout::TierSlots TierLayout::LayOutSlots(int32_t num_chunks, int64_t chunk_bytes,
                                              const ChunkRuntimeOptions& options) {
  TierSlots t;
  if (!options.param_device.has_value()) {
    const int64_t slots = DeviceSlots(num_chunks, chunk_bytes, options);
    t.device_adam_chunks = DeviceAdamChunks(num_chunks, slots, options);
    t.full = slots - 2 * int64_t(t.device_adam_chunks);
    return t;
  }
  const int64_t n = num_chunks, full = SlotBytes(chunk_bytes), half = HalfSlotBytes(chunk_bytes);
  int64_t room = DeviceCapacity(num_chunks, chunk_bytes, options) - Align(options.non_model_bytes) -
                 StagingBytes(chunk_bytes, options);
  // Room for every chunk: everything stays, no margin is needed.
  if (room >= n * (half + full) + (options.hybrid_adam ? 3 * n * full : 0)) {
    return {n, n, options.hybrid_adam ? num_chunks : 0};
  }
  // Each pool's minimum, then the streaming reserve (this moment and each one
  // prefetched ahead), grown a param and a grad slot at a time.
  const int64_t depth = 1 + std::max(0, options.prefetch_depth);
  const int64_t min_p = std::min(n, MinParamChunks(options)), min_g = std::min(n, MinGradChunks(options));
  t.half = std::min(room / half, min_p);
  room -= t.half * half;
  t.full = std::min(room / full, min_g);
  room -= t.full * full;
  auto grow = [&](int64_t want_half, int64_t want_full) {
    while (t.half < want_half || t.full < want_full) {
      const bool add_half = t.half < want_half && room >= half;
      if (add_half) {
        ++t.half;
        room -= half;
      }
      const bool add_full = t.full < want_full && room >= full;
      if (add_full) {
        ++t.full;
        room -= full;
      }
      if (!add_half && !add_full) return;
    }
  };
  const int64_t reserve_p = std::min(n, min_p * depth), reserve_g = std::min(n, min_g * depth);
  grow(reserve_p, reserve_g);
  // A share of the room beyond the reserve homes the masters and moments of
  // device-Adam chunks (three chunk slots each); what is left streams.
  if (options.hybrid_adam && t.half == reserve_p && t.full == reserve_g) {
    const int64_t k = int64_t(double(room) * options.margin_use_ratio) / (3 * full);
    t.device_adam_chunks = int32_t(std::min(k, n));
    room -= 3 * int64_t(t.device_adam_chunks) * full;
  }
  grow(n, n);
  return t;
}

int64_t TierLayout::HostHomeBytes(int32_t num_chunks, int64_t shard_bytes, int32_t device_adam_chunks,
                                  const ChunkRuntimeOptions& options) {
  const int64_t n = num_chunks, homed = device_adam_chunks, on_disk = options.disk_moment_chunks;
  const int64_t masters_on_disk = options.param_device.has_value() ? options.disk_master_chunks : 0;
  const int64_t grads = Align(n * (options.grad_home.has_value() ? shard_bytes / 2 : shard_bytes));
  // fp32 param homes (the masters with 16-bit params, less those on the
  // device or on disk, which have a 16-bit home instead).
  const int64_t params = options.param_device.has_value() ? n - homed - masters_on_disk : n;
  return (params + 2 * (n - homed - on_disk)) * shard_bytes + grads + masters_on_disk * Align(shard_bytes / 2);
}

int64_t TierLayout::DiskHomeStride(int64_t shard_bytes) {
  constexpr int64_t kDiskAlignment = 4096;  // O_DIRECT's
  return (shard_bytes + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment;
}

int64_t TierLayout::DiskBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options) {
  return (2 * int64_t(options.disk_moment_chunks) + options.disk_master_chunks) * DiskHomeStride(shard_bytes);
}

int32_t TierLayout::DiskWindows(const ChunkRuntimeOptions& options) {
  if (options.disk_moment_chunks <= 0) return 0;
  const int32_t kinds = options.disk_master_chunks > 0 ? 3 : 2;  // the moments, and the master
  return kinds * (1 + std::max(0, options.disk_read_ahead)) + kinds;
}

int64_t TierLayout::DiskWindowBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options) {
  return int64_t(DiskWindows(options)) * DiskHomeStride(shard_bytes);
}

int64_t TierLayout::MinDeviceBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t chunks = options.param_device.has_value()
                             ? MinParamChunks(options) * HalfSlotBytes(chunk_bytes) +
                                   MinGradChunks(options) * SlotBytes(chunk_bytes)
                             : int64_t(options.min_chunks_per_moment) * SlotBytes(chunk_bytes);
  return Align(options.non_model_bytes) + StagingBytes(chunk_bytes, options) + chunks;
}

}  // namespace pstar
