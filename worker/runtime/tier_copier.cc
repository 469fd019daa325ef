#include "worker/runtime/tier_copier.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "worker/runtime/nvtx_range.h"
#include "worker/runtime/runtime_error.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

TierCopier::TierCopier(DeviceBackend& backend, Communicator* comm, const ChunkPlacement& placement,
                       int64_t chunk_bytes, const ChunkRuntimeOptions& options, RuntimeCounters* counters)
    : backend_(backend),
      comm_(comm),
      placement_(placement),
      chunk_bytes_(chunk_bytes),
      world_(comm != nullptr ? comm->world_size() : 1),
      rank_(comm != nullptr ? comm->rank() : 0),
      shard_bytes_(chunk_bytes / (comm != nullptr ? comm->world_size() : 1)),
      options_(options),
      counters_(counters) {}

Result<std::unique_ptr<TierCopier>> TierCopier::Create(DeviceBackend& backend, Communicator* comm,
                                                       const ChunkPlacement& placement, int64_t chunk_bytes,
                                                       const ChunkRuntimeOptions& options,
                                                       RuntimeCounters* counters) {
  auto c = std::unique_ptr<TierCopier>(new TierCopier(backend, comm, placement, chunk_bytes, options, counters));
  if (const int64_t bytes =
          TierLayout::ParamStagingBytes(c->shard_bytes_, options, backend.device_is_host_memory());
      bytes > 0) {
    PSTAR_ASSIGN_OR_RETURN(c->param_staging_, backend.AllocateHost(size_t(bytes)));
    for (auto& e : c->param_staged_) e = backend.CreateEvent();
  }
  if (c->world_ > 1) {
    PSTAR_ASSIGN_OR_RETURN(c->scratch_, backend.AllocateHost(size_t(c->shard_bytes_)));
  }
  for (int32_t i = 0; i < placement.total(); ++i) c->home_written_.push_back(backend.CreateEvent());
  c->compute_done_ = backend.CreateEvent();
  return c;
}

void TierCopier::CheckCollective(const Status& status) const {
  if (status.ok()) return;
  std::fprintf(stderr, "pstar: error: rank %d: %s\n", rank_, status.message().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

void TierCopier::CountMove(int32_t index, Direction direction, int64_t bytes) {
  ++counters_->moves[int(direction)];
  counters_->moved_bytes[int(direction)] += bytes;
  counters_->moved_kind_bytes[int(direction)][size_t(placement_.KindOf(index))] += bytes;
}

void TierCopier::LoadHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host) {
  DeviceTier::SlotEvents& ev = device.events(slot);
  float* dst = device.SlotData(slot);
  NvtxRange range("h2d");
  if (world_ == 1) {
    backend_.StreamWait(StreamKind::kHostToDevice, home_written(index));
    const int64_t move = BeginMove(Direction::kHostToDevice);
    const int64_t bytes = host.HomeBytes(index);
    if (placement_.HalfHomed(index)) {
      backend_.CopyWidened(dst, host.HalfHome(index), chunk_bytes_ / int64_t(sizeof(float)), *options_.grad_home,
                           device.upward_staging(), StreamKind::kHostToDevice);
    } else {
      backend_.Copy(dst, host.Fp32Home(index), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    }
    EndMove(move, Direction::kHostToDevice, bytes);
    CountMove(index, Direction::kHostToDevice, bytes);
    return;
  }
  // Each rank's home shard lands in its place; the gather fills the rest.
  // The collective runs on this thread, so the host waits for the slot first.
  const int64_t n = shard_bytes_ / int64_t(sizeof(float));
  float* own = dst + int64_t(rank_) * n;
  if (comm_->device_buffers()) {
    // NCCL reads GPU memory: the home shard is copied up first and gathered in place.
    backend_.StreamWait(StreamKind::kHostToDevice, home_written(index));
    const int64_t move = BeginMove(Direction::kHostToDevice);
    backend_.Copy(own, host.Fp32Home(index), size_t(shard_bytes_), StreamKind::kHostToDevice);
    backend_.Record(*ev.loaded, StreamKind::kHostToDevice);
    backend_.Synchronize(*ev.loaded);
    backend_.Synchronize(*ev.computed);
    {
      NvtxRange gather("all_gather");
      CheckCollective(comm_->AllGather(own, dst, n));
    }
    EndMove(move, Direction::kHostToDevice, shard_bytes_);
  } else {
    backend_.Synchronize(*ev.computed);
    backend_.Synchronize(*ev.copied_out);
    const int64_t move = BeginMove(Direction::kHostToDevice);
    {
      NvtxRange gather("all_gather");
      CheckCollective(comm_->AllGather(host.Fp32Home(index), dst, n));
    }
    EndMove(move, Direction::kHostToDevice, shard_bytes_);
  }
  CountMove(index, Direction::kHostToDevice, shard_bytes_);
}

void TierCopier::LoadHalfParam(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host) {
  const HalfFormat format = *options_.param_device;
  uint16_t* dst = reinterpret_cast<uint16_t*>(device.SlotData(slot));
  NvtxRange range("h2d");
  if (placement_.DeviceHomed(index)) {
    // The master is on the device: narrowed there after the ops before it
    // (the optimizer's update), nothing crosses the bus.
    backend_.Record(*compute_done_, StreamKind::kCompute);
    backend_.StreamWait(StreamKind::kHostToDevice, *compute_done_);
    backend_.Narrow(dst, device.Home(index), chunk_bytes_ / int64_t(sizeof(float)), format,
                    StreamKind::kHostToDevice);
    return;
  }
  const int64_t shard = shard_bytes_ / int64_t(sizeof(float));
  uint16_t* own = dst + int64_t(rank_) * shard;
  if (placement_.DiskHomed(index)) {
    // The master is on disk: its 16-bit host home (narrowed after each
    // update) goes up as it is, half the master's bytes.
    const int64_t move = BeginMove(Direction::kHostToDevice);
    backend_.Copy(own, host.HalfParamHome(index), size_t(shard_bytes_ / 2), StreamKind::kHostToDevice);
    if (world_ > 1) {
      // The gather reads this rank's part on this thread: it must have landed.
      backend_.Record(*compute_done_, StreamKind::kHostToDevice);
      backend_.Synchronize(*compute_done_);
      backend_.Synchronize(*device.events(slot).computed);
      NvtxRange gather("all_gather");
      CheckCollective(
          comm_->AllGather(reinterpret_cast<const float*>(own), reinterpret_cast<float*>(dst), shard / 2));
    }
    EndMove(move, Direction::kHostToDevice, shard_bytes_ / 2);
    CountMove(index, Direction::kHostToDevice, shard_bytes_ / 2);
    return;
  }
  // The master is on the host: narrowed there (into the slot where the device
  // is host memory, else into a pinned buffer copied up), half its bytes moved.
  const float* master = host.Fp32Home(index);
  const int64_t move = BeginMove(Direction::kHostToDevice);
  if (backend_.device_is_host_memory()) {
    NarrowToHalf(own, master, shard, format);
  } else {
    // Piece by piece through the two buffers: narrowing one piece overlaps
    // the copy of the one before.
    const int64_t piece = int64_t(param_staging_.bytes() / 2) / int64_t(sizeof(uint16_t));
    for (int64_t first = 0; first < shard; first += piece) {
      const int64_t n = std::min(piece, shard - first);
      const int b = std::exchange(param_staging_next_, 1 - param_staging_next_);
      uint16_t* staged = reinterpret_cast<uint16_t*>(param_staging_.data() + b * (param_staging_.bytes() / 2));
      backend_.Synchronize(*param_staged_[b]);  // its last copy up has read it
      NarrowToHalf(staged, master + first, n, format);
      backend_.Copy(own + first, staged, size_t(n) * sizeof(uint16_t), StreamKind::kHostToDevice);
      backend_.Record(*param_staged_[b], StreamKind::kHostToDevice);
    }
  }
  if (world_ > 1) {
    // Every rank narrowed its own shard into place; the gather fills the rest
    // (16-bit pairs travel as floats, bit for bit).
    if (!backend_.device_is_host_memory()) backend_.Synchronize(*param_staged_[1 - param_staging_next_]);
    backend_.Synchronize(*device.events(slot).computed);
    NvtxRange gather("all_gather");
    CheckCollective(comm_->AllGather(reinterpret_cast<const float*>(own), reinterpret_cast<float*>(dst), shard / 2));
  }
  EndMove(move, Direction::kHostToDevice, shard_bytes_ / 2);
  CountMove(index, Direction::kHostToDevice, shard_bytes_ / 2);
}

void TierCopier::WriteHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host,
                           bool& home_zero) {
  DeviceTier::SlotEvents& ev = device.events(slot);
  float* src = device.SlotData(slot);
  backend_.StreamWait(StreamKind::kDeviceToHost, *ev.computed);  // the last writes landed
  backend_.StreamWait(StreamKind::kDeviceToHost, *ev.loaded);    // and a fill or load into the slot
  NvtxRange range("d2h");
  const int64_t move = BeginMove(Direction::kDeviceToHost);
  if (world_ > 1) {
    // home += this step's partials of every rank, reduced; the device copy is
    // then spent (it is in the home sum) and the caller drops it.
    const int64_t n = shard_bytes_ / int64_t(sizeof(float));
    float* sum = reinterpret_cast<float*>(scratch_.data());
    backend_.Synchronize(*ev.computed);  // the collective reads the slot on this thread
    backend_.Synchronize(*ev.loaded);
    if (comm_->device_buffers()) {
      // NCCL writes GPU memory: reduce into this rank's place in the slot,
      // then copy that part down.
      float* own = src + int64_t(rank_) * n;
      {
        NvtxRange scatter("reduce_scatter");
        CheckCollective(comm_->ReduceScatter(src, own, n));
      }
      backend_.Copy(sum, own, size_t(shard_bytes_), StreamKind::kDeviceToHost);
      backend_.Record(*ev.copied_out, StreamKind::kDeviceToHost);
      backend_.Synchronize(*ev.copied_out);
    } else {
      NvtxRange scatter("reduce_scatter");
      CheckCollective(comm_->ReduceScatter(src, sum, n));
    }
    float* home = host.Fp32Home(index);
    if (home_zero) {
      std::memcpy(home, sum, size_t(shard_bytes_));
      home_zero = false;
    } else {
      for (int64_t i = 0; i < n; ++i) home[i] += sum[i];
    }
    counters_->moved_bytes[int(Direction::kDeviceToHost)] += shard_bytes_;
    counters_->moved_kind_bytes[int(Direction::kDeviceToHost)][size_t(placement_.KindOf(index))] += shard_bytes_;
    EndMove(move, Direction::kDeviceToHost, shard_bytes_);
  } else {
    const int64_t bytes = host.HomeBytes(index);
    if (placement_.HalfHomed(index)) {
      backend_.CopyNarrowed(host.HalfHome(index), src, chunk_bytes_ / int64_t(sizeof(float)), *options_.grad_home,
                            device.downward_staging(), StreamKind::kDeviceToHost);
    } else {
      backend_.Copy(host.Fp32Home(index), src, size_t(chunk_bytes_), StreamKind::kDeviceToHost);
    }
    backend_.Record(home_written(index), StreamKind::kDeviceToHost);
    counters_->moved_bytes[int(Direction::kDeviceToHost)] += bytes;
    counters_->moved_kind_bytes[int(Direction::kDeviceToHost)][size_t(placement_.KindOf(index))] += bytes;
    EndMove(move, Direction::kDeviceToHost, bytes);
  }
  backend_.Record(*ev.copied_out, StreamKind::kDeviceToHost);
  ++counters_->moves[int(Direction::kDeviceToHost)];
}

}  // namespace pstar
