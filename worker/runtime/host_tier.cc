#include "worker/runtime/host_tier.h"

#include "worker/runtime/runtime_error.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

Result<HostTier> HostTier::Create(DeviceBackend& backend, const ChunkPlacement& placement, int64_t shard_bytes,
                                  const ChunkRuntimeOptions& options) {
  HostTier tier;
  tier.placement_ = placement;
  tier.shard_bytes_ = shard_bytes;
  PSTAR_ASSIGN_OR_RETURN(tier.block_,
                         backend.AllocateHost(size_t(TierLayout::HostHomeBytes(
                             placement.num_chunks, shard_bytes, placement.device_adam_chunks, options))));
  return tier;
}

std::byte* HostTier::Home(int32_t index) const {
  const ChunkPlacement& p = placement_;
  if (p.DeviceHomed(index)) RuntimeBug("host copy of a chunk homed on the device");
  if (p.DiskHomed(index)) RuntimeBug("host copy of a chunk homed on disk");
  const int64_t n = p.num_chunks, chunk = index % p.num_chunks, homed = p.device_adam_chunks;
  const int64_t grad_bytes = HomeBytes(int32_t(n));
  // Masters homed on the device or on disk (16-bit params) have no host
  // param home.
  const int64_t first_param = p.half_params ? homed : 0;
  const int64_t params = (n - first_param - p.disk_master_chunks) * shard_bytes_;
  if (index < n) return block_.data() + (chunk - first_param) * shard_bytes_;
  if (index < 2 * n) return block_.data() + params + chunk * grad_bytes;
  const int64_t kind = index / n - 2;
  const int64_t slot = kind * (n - homed - p.disk_chunks) + (chunk - homed);
  // The moments start on a cache line (16-bit gradients may end mid-line).
  return block_.data() + params + TierLayout::Align(n * grad_bytes) + slot * shard_bytes_;
}

float* HostTier::Fp32Home(int32_t index) const {
  if (placement_.HalfHomed(index)) RuntimeBug("fp32 host copy of a chunk homed in 16 bits");
  return reinterpret_cast<float*>(Home(index));
}

uint16_t* HostTier::HalfHome(int32_t index) const { return reinterpret_cast<uint16_t*>(Home(index)); }

uint16_t* HostTier::HalfParamHome(int32_t index) const {
  const ChunkPlacement& p = placement_;
  const int64_t n = p.num_chunks, first = n - p.disk_master_chunks;
  if (index >= n || index < first) RuntimeBug("16-bit param home of a param whose master is not on disk");
  const int64_t params = (n - (p.half_params ? p.device_adam_chunks : 0) - p.disk_master_chunks) * shard_bytes_;
  const int64_t moments = 2 * (n - p.device_adam_chunks - p.disk_chunks) * shard_bytes_;
  return reinterpret_cast<uint16_t*>(block_.data() + params + TierLayout::Align(n * HomeBytes(int32_t(n))) + moments +
                                     (index - first) * TierLayout::Align(shard_bytes_ / 2));
}

}  // namespace pstar
