#include "worker/runtime/tier_copier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "worker/runtime/nvtx_range.h"
#include "worker/runtime/runtime_error.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

TierCopier::TierCopier(DeviceBackend& backend, Communicator* comm, const ChunkPlacement& placement, int64_t chunk_bytes,
                       const ChunkRuntimeOptions& options, RuntimeCounters* counters)
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
                                                       const ChunkRuntimeOptions& options, RuntimeCounters* counters) {
  auto c = std::unique_ptr<TierCopier>(new TierCopier(backend, comm, placement, chunk_bytes, options, counters));
  if (const int64_t bytes = TierLayout::ParamStagingBytes(c->shard_bytes_, options, backend.device_is_host_memory());
      bytes > 0) {
    PSTAR_ASSIGN_OR_RETURN(c->param_staging_, backend.AllocateHost(size_t(bytes)));
    for (auto& e : c->param_staged_) e = backend.CreateEvent();
  }
  if (c->world_ > 1) {
    PSTAR_ASSIGN_OR_RETURN(c->scratch_, backend.AllocateHost(size_t(c->shard_bytes_)));
    if (comm->device_buffers()) {
      constexpr int kStartEvents = 16;
      for (int e = 0; e < kStartEvents; ++e) c->start_events_.push_back(backend.CreateEvent());
      c->start_event_tickets_.assign(kStartEvents, 0);
      c->comm_copied_ = backend.CreateEvent();
    }
  }
  for (int32_t i = 0; i < placement.total(); ++i) c->home_written_.push_back(backend.CreateEvent());
  c->compute_done_ = backend.CreateEvent();
  return c;
}

void TierCopier::CheckCollective(const Status& status) const {
  if (!status.ok()) CollectiveFailed(rank_, status.message());
}

CollectiveTicket TierCopier::StartAfter(StreamKind stream, std::function<Status(Communicator&)> work) {
  if (!comm_->device_buffers()) return comm_->Start(std::move(work));  // the device is host memory: done
  const size_t e = next_start_event_;
  next_start_event_ = (next_start_event_ + 1) % start_events_.size();
  CheckCollective(comm_->Wait(start_event_tickets_[e]));  // the work that waited for it has
  Event& ready = *start_events_[e];
  backend_.Record(ready, stream);
  const CollectiveTicket ticket = comm_->Start([backend = &backend_, &ready, work = std::move(work)](Communicator& c) {
    backend->BindThread();
    backend->Synchronize(ready);
    return work(c);
  });
  start_event_tickets_[e] = ticket;
  return ticket;
}

std::function<Status(Communicator&)> TierCopier::Traced(int32_t index, std::function<Status(Communicator&)> work) {
  if (event_log_ == nullptr) return work;
  const bool gather = placement_.KindOf(index) == StateKind::kParam;
  const ChunkEventKind begin = gather ? ChunkEventKind::kGatherBegin : ChunkEventKind::kReduceScatterBegin;
  const ChunkEventKind end = gather ? ChunkEventKind::kGatherEnd : ChunkEventKind::kReduceScatterEnd;
  return
      [log = event_log_, begin, end, chunk = placement_.KeyOf(index).chunk, work = std::move(work)](Communicator& c) {
        log->Record(log->step(), begin, chunk);
        Status s = work(c);
        log->Record(log->step(), end, chunk);
        return s;
      };
}

void TierCopier::CountMove(int32_t index, Direction direction, int64_t bytes) {
  ++counters_->moves[int(direction)];
  counters_->moved_bytes[int(direction)] += bytes;
  counters_->moved_kind_bytes[int(direction)][size_t(placement_.KindOf(index))] += bytes;
}

CollectiveTicket TierCopier::LoadHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host) {
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
    return 0;
  }
  // Each rank's home shard lands in its place; the gather fills the rest.
  const int64_t n = shard_bytes_ / int64_t(sizeof(float));
  float* own = dst + int64_t(rank_) * n;
  const int64_t move = BeginMove(Direction::kHostToDevice);
  CollectiveTicket ticket = 0;
  if (comm_->device_buffers()) {
    // NCCL reads GPU memory: the home shard is copied up first and gathered
    // in place, after that copy (and the slot's earlier users, which the
    // h2d stream already waits for).
    backend_.Copy(own, host.Fp32Home(index), size_t(shard_bytes_), StreamKind::kHostToDevice);
    ticket = StartAfter(StreamKind::kHostToDevice, Traced(index, [own, dst, n](Communicator& c) {
                          NvtxRange gather("all_gather");
                          return c.AllGather(own, dst, n);
                        }));
  } else {
    const float* home = host.Fp32Home(index);
    ticket = comm_->Start(Traced(index, [home, dst, n](Communicator& c) {
      NvtxRange gather("all_gather");
      return c.AllGather(home, dst, n);
    }));
  }
  LogCall(CollectiveOp::kAllGather, n);
  EndMove(move, Direction::kHostToDevice, shard_bytes_);
  CountMove(index, Direction::kHostToDevice, shard_bytes_);
  return ticket;
}

CollectiveTicket TierCopier::LoadHalfParam(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host) {
  const HalfFormat format = *options_.param_device;
  uint16_t* dst = reinterpret_cast<uint16_t*>(device.SlotData(slot));
  NvtxRange range("h2d");
  if (placement_.DeviceHomed(index)) {
    // The master is on the device: narrowed there after the ops before it
    // (the optimizer's update), nothing crosses the bus.
    backend_.Record(*compute_done_, StreamKind::kCompute);
    backend_.StreamWait(StreamKind::kHostToDevice, *compute_done_);
    backend_.Narrow(dst, device.Home(index), chunk_bytes_ / int64_t(sizeof(float)), format, StreamKind::kHostToDevice);
    return 0;
  }
  const int64_t shard = shard_bytes_ / int64_t(sizeof(float));
  uint16_t* own = dst + int64_t(rank_) * shard;
  if (placement_.DiskHomed(index)) {
    // The master is on disk: its 16-bit host home (narrowed after each
    // update) goes up as it is, half the master's bytes.
    const int64_t move = BeginMove(Direction::kHostToDevice);
    backend_.Copy(own, host.HalfParamHome(index), size_t(shard_bytes_ / 2), StreamKind::kHostToDevice);
    // The gather reads this rank's part: it starts once that has landed.
    const CollectiveTicket ticket =
        world_ > 1 ? StartAfter(StreamKind::kHostToDevice, Traced(index, GatherHalf(own, dst, shard))) : 0;
    EndMove(move, Direction::kHostToDevice, shard_bytes_ / 2);
    CountMove(index, Direction::kHostToDevice, shard_bytes_ / 2);
    return ticket;
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
  // Every rank narrowed its own shard into place; the gather fills the rest,
  // once the copies up have landed.
  const CollectiveTicket ticket =
      world_ > 1 ? StartAfter(StreamKind::kHostToDevice, Traced(index, GatherHalf(own, dst, shard))) : 0;
  EndMove(move, Direction::kHostToDevice, shard_bytes_ / 2);
  CountMove(index, Direction::kHostToDevice, shard_bytes_ / 2);
  return ticket;
}

std::function<Status(Communicator&)> TierCopier::GatherHalf(const uint16_t* own, uint16_t* dst, int64_t shard) {
  LogCall(CollectiveOp::kAllGather, shard / 2);
  // 16-bit pairs travel as floats, bit for bit.
  return [own, dst, shard](Communicator& c) {
    NvtxRange gather("all_gather");
    return c.AllGather(reinterpret_cast<const float*>(own), reinterpret_cast<float*>(dst), shard / 2);
  };
}

Status TierCopier::ReduceHalfHome(Communicator& c, const float* src, uint16_t* staging, uint16_t* home, bool replace) {
  const HalfFormat format = *options_.grad_home;
  const int64_t chunk = chunk_bytes_ / int64_t(sizeof(float)), n = chunk / world_;
  uint16_t* sum = reinterpret_cast<uint16_t*>(scratch_.data());
  if (comm_->device_buffers()) {
    // On the device: narrowed into the staging area, reduced into this
    // rank's part of it, and that part copied down.
    backend_.BindThread();
    backend_.Narrow(staging, src, chunk, format, StreamKind::kComm);
    backend_.Record(*comm_copied_, StreamKind::kComm);
    backend_.Synchronize(*comm_copied_);
    uint16_t* own = staging + int64_t(rank_) * n;
    {
      NvtxRange scatter("reduce_scatter");
      PSTAR_RETURN_IF_ERROR(c.ReduceScatterHalf(staging, own, n, format));
    }
    backend_.Copy(sum, own, size_t(n) * sizeof(uint16_t), StreamKind::kComm);
    backend_.Record(*comm_copied_, StreamKind::kComm);
    backend_.Synchronize(*comm_copied_);
  } else {
    NarrowToHalf(staging, src, chunk, format);
    NvtxRange scatter("reduce_scatter");
    PSTAR_RETURN_IF_ERROR(c.ReduceScatterHalf(staging, sum, n, format));
  }
  if (replace) {
    std::memcpy(home, sum, size_t(n) * sizeof(uint16_t));
    return Status();
  }
  // home = round(home + sum), a piece at a time.
  constexpr int64_t kPiece = 1024;
  float a[kPiece], b[kPiece];
  for (int64_t first = 0; first < n; first += kPiece) {
    const int64_t m = std::min(kPiece, n - first);
    WidenFromHalf(a, home + first, m, format);
    WidenFromHalf(b, sum + first, m, format);
    for (int64_t i = 0; i < m; ++i) a[i] += b[i];
    NarrowToHalf(home + first, a, m, format);
  }
  return Status();
}

CollectiveTicket TierCopier::WriteHome(int32_t index, int32_t slot, DeviceTier& device, const HostTier& host,
                                       bool& home_zero) {
  DeviceTier::SlotEvents& ev = device.events(slot);
  float* src = device.SlotData(slot);
  backend_.StreamWait(StreamKind::kDeviceToHost, *ev.computed);  // the last writes landed
  backend_.StreamWait(StreamKind::kDeviceToHost, *ev.loaded);    // and a fill or load into the slot
  NvtxRange range("d2h");
  const int64_t move = BeginMove(Direction::kDeviceToHost);
  CollectiveTicket ticket = 0;
  if (world_ > 1) {
    // home += this step's partials of every rank, reduced; the device copy is
    // then spent (it is in the home sum) and the caller drops it. The sum
    // lands in the scratch shard: the communicator runs one piece of work at
    // a time, so one is enough.
    const int64_t n = shard_bytes_ / int64_t(sizeof(float));
    const bool replace = std::exchange(home_zero, false);
    if (placement_.HalfHomed(index)) {
      // 16-bit gradients: reduced in 16 bits, half the bytes on the wire.
      uint16_t* staging = reinterpret_cast<uint16_t*>(device.downward_staging());
      uint16_t* home = host.HalfHome(index);
      ticket =
          StartAfter(StreamKind::kDeviceToHost, Traced(index, [this, src, staging, home, replace](Communicator& c) {
                       return ReduceHalfHome(c, src, staging, home, replace);
                     }));
      LogCall(CollectiveOp::kReduceScatter, n, /*half=*/true);
      counters_->moved_bytes[int(Direction::kDeviceToHost)] += shard_bytes_ / 2;
      counters_->moved_kind_bytes[int(Direction::kDeviceToHost)][size_t(StateKind::kGrad)] += shard_bytes_ / 2;
      EndMove(move, Direction::kDeviceToHost, shard_bytes_ / 2);
      backend_.Record(*ev.copied_out, StreamKind::kDeviceToHost);
      ++counters_->moves[int(Direction::kDeviceToHost)];
      return ticket;
    }
    float* sum = reinterpret_cast<float*>(scratch_.data());
    float* home = host.Fp32Home(index);
    auto add_home = [home, sum, n, replace] {
      if (replace) {
        std::memcpy(home, sum, size_t(n) * sizeof(float));
      } else {
        for (int64_t i = 0; i < n; ++i) home[i] += sum[i];
      }
    };
    if (comm_->device_buffers()) {
      // NCCL writes GPU memory: reduced into this rank's place in the slot,
      // that part copied down on the communicator's own stream.
      float* own = src + int64_t(rank_) * n;
      ticket = StartAfter(StreamKind::kDeviceToHost, Traced(index, [this, src, own, sum, n, add_home](Communicator& c) {
                            {
                              NvtxRange scatter("reduce_scatter");
                              PSTAR_RETURN_IF_ERROR(c.ReduceScatter(src, own, n));
                            }
                            backend_.Copy(sum, own, size_t(n) * sizeof(float), StreamKind::kComm);
                            backend_.Record(*comm_copied_, StreamKind::kComm);
                            backend_.Synchronize(*comm_copied_);
                            add_home();
                            return Status();
                          }));
    } else {
      ticket = comm_->Start(Traced(index, [src, sum, n, add_home](Communicator& c) {
        {
          NvtxRange scatter("reduce_scatter");
          PSTAR_RETURN_IF_ERROR(c.ReduceScatter(src, sum, n));
        }
        add_home();
        return Status();
      }));
    }
    LogCall(CollectiveOp::kReduceScatter, n);
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
  return ticket;
}

}  // namespace pstar
