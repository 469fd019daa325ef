// DeviceTier: the device block as TierLayout lays it out (the non-model
// region, the 16-bit staging area, the pools of streaming slots, the homes of
// device-Adam chunks), which chunk occupies each slot, the free slots of each
// pool, the events that order each slot's copies and compute, and the bytes
// in use against the capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/core/status.h"
#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_runtime_options.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

class DeviceTier {
 public:
  // Per slot: the ends of the last compute on it, of the last write into it
  // by a copy or fill (h2d stream), and of the last copy out of it (d2h
  // stream). Readers on compute wait for `loaded` only, so reading a gradient
  // in place (the norm) never waits for its copy home; whatever writes into
  // the slot waits for `copied_out` too.
  struct SlotEvents {
    std::unique_ptr<Event> computed;
    std::unique_ptr<Event> loaded;
    std::unique_ptr<Event> copied_out;
  };

  DeviceTier() = default;
  // Carves `capacity` bytes' worth of the tier for `slots` (streaming slots
  // of both pools and device-Adam homes; the homes start zero-filled).
  static Result<DeviceTier> Create(DeviceBackend& backend, const ChunkPlacement& placement, int64_t chunk_bytes,
                                   const TierLayout::TierSlots& slots, const ChunkRuntimeOptions& options,
                                   int64_t capacity);

  std::byte* non_model_memory() const { return block_.data(); }
  int64_t non_model_bytes() const { return non_model_bytes_; }
  int64_t capacity() const { return capacity_; }
  // The staging area for 16-bit gradient copies: a half for each direction.
  int64_t staging_bytes() const { return slots_offset_ - non_model_bytes_; }
  void* upward_staging() const { return block_.data() + non_model_bytes_; }
  void* downward_staging() const { return block_.data() + non_model_bytes_ + staging_bytes() / 2; }

  // Streaming slots: [0] chunk-sized, then (half_params) [1] half-size.
  int32_t slot_count() const { return int32_t(owner_.size()); }
  int pool_count() const { return int(pools_.size()); }
  int32_t pool_first(int pool) const { return pools_[size_t(pool)].first; }
  int32_t pool_size(int pool) const { return pools_[size_t(pool)].count; }
  float* SlotData(int32_t slot) const;
  int64_t SlotStride(int32_t slot) const { return PoolOfSlot(slot).stride; }
  int64_t half_slot_stride() const { return pools_.back().stride; }
  // The chunk in `slot`, or -1.
  int32_t owner(int32_t slot) const { return owner_[size_t(slot)]; }
  // A free slot of `pool`, or -1: the one freed most recently of those
  // `ready` accepts (null: all), else the one freed most recently.
  int32_t TakeFreeSlot(int pool, const std::function<bool(int32_t slot)>& ready = nullptr);
  // Whether `pool` has a free slot that `ready` accepts.
  bool HasFreeSlot(int pool, const std::function<bool(int32_t slot)>& ready) const;
  // `index` moves into `slot` (taken), or out of it (the slot is freed).
  void Occupy(int32_t slot, int32_t index);
  void Vacate(int32_t slot);
  SlotEvents& events(int32_t slot) { return events_[size_t(slot)]; }

  // The home of a chunk homed on the device: exp_avg, exp_avg_sq, then (16-bit
  // params) the masters, each for the device-Adam chunks in order.
  float* Home(int32_t index) const;
  int64_t homed_bytes() const { return homed_bytes_; }
  // Bytes the streaming slots and the homes take (the chunk budget).
  int64_t chunk_budget_bytes() const { return homes_offset_ + homed_bytes_ - slots_offset_; }

  // Non-model, staging, resident streaming copies and homes; the most so far.
  int64_t bytes_in_use() const { return slots_offset_ + streaming_in_use_ + homed_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct SlotPool {
    int64_t offset = 0;  // of its first slot in the device block
    int64_t stride = 0;
    int32_t first = 0, count = 0;
    std::vector<int32_t> free;  // a stack, lowest slot on top
  };
  const SlotPool& PoolOfSlot(int32_t slot) const {
    return pools_.size() > 1 && slot >= pools_[1].first ? pools_[1] : pools_[0];
  }

  ChunkPlacement placement_;
  int64_t chunk_bytes_ = 0;
  MemoryBlock block_;
  int64_t capacity_ = 0;
  int64_t non_model_bytes_ = 0;
  int64_t slots_offset_ = 0;
  int64_t homes_offset_ = 0;
  int64_t homed_bytes_ = 0;
  std::vector<SlotPool> pools_;
  std::vector<int32_t> owner_;
  std::vector<SlotEvents> events_;
  int64_t streaming_in_use_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace pstar
