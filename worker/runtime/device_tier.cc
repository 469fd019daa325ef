#include "worker/runtime/device_tier.h"

#include <algorithm>
#include <string>

#include "worker/runtime/runtime_error.h"

namespace pstar {

Result<DeviceTier> DeviceTier::Create(DeviceBackend& backend, const ChunkPlacement& placement, int64_t chunk_bytes,
                                      const TierLayout::TierSlots& slots, const ChunkRuntimeOptions& options,
                                      int64_t capacity) {
  DeviceTier t;
  t.placement_ = placement;
  t.chunk_bytes_ = TierLayout::SlotBytes(chunk_bytes);
  t.capacity_ = capacity;
  t.non_model_bytes_ = TierLayout::Align(options.non_model_bytes);
  t.slots_offset_ = t.non_model_bytes_ + TierLayout::StagingBytes(chunk_bytes, options);
  const int64_t stride = t.chunk_bytes_;
  const int64_t half_stride = placement.half_params ? TierLayout::HalfSlotBytes(chunk_bytes) : 0;
  t.pools_.push_back({t.slots_offset_, stride, 0, int32_t(slots.full), {}});
  if (placement.half_params) {
    t.pools_.push_back({t.slots_offset_ + slots.full * stride, half_stride, int32_t(slots.full),
                        int32_t(slots.half), {}});
  }
  t.homes_offset_ = t.slots_offset_ + slots.full * stride + slots.half * half_stride;
  t.homed_bytes_ = TierLayout::HomedKinds(options) * int64_t(placement.device_adam_chunks) * stride;
  PSTAR_ASSIGN_OR_RETURN(t.block_, backend.AllocateDevice(size_t(t.homes_offset_ + t.homed_bytes_)));
  const int64_t streaming = slots.full + slots.half;
  t.owner_.assign(size_t(streaming), -1);
  for (int64_t s = 0; s < streaming; ++s) {
    t.events_.push_back({backend.CreateEvent(), backend.CreateEvent(), backend.CreateEvent()});
  }
  for (SlotPool& pool : t.pools_) {
    for (int32_t s = pool.first + pool.count - 1; s >= pool.first; --s) pool.free.push_back(s);
  }
  // Device-homed moments start at zero, like every moment (masters are
  // written before use, as host param homes are).
  if (t.homed_bytes_ > 0) {
    backend.Zero(t.block_.data() + t.homes_offset_, size_t(t.homed_bytes_), StreamKind::kCompute);
  }
  t.peak_bytes_ = t.bytes_in_use();
  return t;
}

float* DeviceTier::SlotData(int32_t slot) const {
  const SlotPool& pool = PoolOfSlot(slot);
  return reinterpret_cast<float*>(block_.data() + pool.offset + int64_t(slot - pool.first) * pool.stride);
}

int32_t DeviceTier::TakeFreeSlot(int pool, const std::function<bool(int32_t slot)>& ready) {
  std::vector<int32_t>& free = pools_[size_t(pool)].free;
  if (free.empty()) return -1;
  size_t at = free.size() - 1;
  if (ready) {
    for (size_t k = free.size(); k-- > 0;) {
      if (ready(free[k])) {
        at = k;
        break;
      }
    }
  }
  const int32_t slot = free[at];
  free.erase(free.begin() + std::ptrdiff_t(at));
  return slot;
}

void DeviceTier::Occupy(int32_t slot, int32_t index) {
  owner_[size_t(slot)] = index;
  streaming_in_use_ += SlotStride(slot);
  if (bytes_in_use() > capacity_) RuntimeBug("device tier over budget");
  peak_bytes_ = std::max(peak_bytes_, bytes_in_use());
}

bool DeviceTier::HasFreeSlot(int pool, const std::function<bool(int32_t slot)>& ready) const {
  const std::vector<int32_t>& free = pools_[size_t(pool)].free;
  return std::any_of(free.begin(), free.end(), ready);
}

void DeviceTier::Vacate(int32_t slot) {
  owner_[size_t(slot)] = -1;
  streaming_in_use_ -= SlotStride(slot);
  pools_[size_t(&PoolOfSlot(slot) - pools_.data())].free.push_back(slot);
}

float* DeviceTier::Home(int32_t index) const {
  const int32_t n = placement_.num_chunks;
  const int64_t kind = index < n ? 2 : index / n - 2, chunk = index % n;
  return reinterpret_cast<float*>(block_.data() + homes_offset_ +
                                  (kind * placement_.device_adam_chunks + chunk) * chunk_bytes_);
}

}  // namespace pstar
