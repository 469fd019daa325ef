#include "worker/runtime/chunk_manager.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "worker/core/bytes.h"
#include "worker/runtime/prefetch.h"
#include "worker/runtime/runtime_error.h"

namespace pstar {

ChunkManager::ChunkManager(const ChunkPlacement& placement, int64_t chunk_bytes,
                           std::unique_ptr<DeviceBackend> backend, const ChunkRuntimeOptions& options,
                           Communicator* comm)
    : placement_(placement),
      num_chunks_(placement.num_chunks),
      chunk_bytes_(chunk_bytes),
      comm_(comm),
      world_(comm != nullptr ? comm->world_size() : 1),
      rank_(comm != nullptr ? comm->rank() : 0),
      shard_bytes_(chunk_bytes / (comm != nullptr ? comm->world_size() : 1)),
      options_(options),
      backend_(std::move(backend)),
      trace_(placement.total()) {}

namespace {

// Each chunk of `chunk_bytes` must split into `world` shards of whole
// aligned lines (in 16 bits too, where params stream so), over a
// communicator that moves the device tier's kind of memory.
Status CheckShards(int64_t chunk_bytes, int world, const ChunkRuntimeOptions& options, const Communicator* comm,
                   const DeviceBackend& backend) {
  if (world <= 1) return Status::Ok();
  constexpr int64_t kAlign = TierLayout::kAlignment;
  const int64_t stride = TierLayout::SlotBytes(chunk_bytes);
  if (stride % (kAlign * world) != 0) {
    return Status::InvalidArgument("chunk of " + std::to_string(chunk_bytes) + " bytes cannot be split into " +
                                   std::to_string(world) + " aligned shards (needs a multiple of " +
                                   std::to_string(kAlign * world) + " bytes)");
  }
  if (options.param_device.has_value() && (stride / 2) % (kAlign * world) != 0) {
    return Status::InvalidArgument("chunk of " + std::to_string(chunk_bytes) +
                                   " bytes cannot be split into aligned 16-bit shards (needs a multiple of " +
                                   std::to_string(2 * kAlign * world) + " bytes)");
  }
  if (comm->device_buffers() == backend.device_is_host_memory()) {
    return Status::FailedPrecondition(
        std::string(backend.device_is_host_memory()
                        ? "the communicator moves GPU memory but the device tier is host memory"
                        : "a GPU device tier with several ranks needs a communicator over GPU memory (NCCL)"));
  }
  return Status::Ok();
}

// The device tier of `capacity` bytes holds what one op pins at once.
Status CheckDeviceFits(int64_t chunk_bytes, int64_t capacity, const ChunkRuntimeOptions& options) {
  const int64_t needed = TierLayout::MinDeviceBytes(chunk_bytes, options);
  if (capacity >= needed) return Status::Ok();
  const int64_t stride = TierLayout::SlotBytes(chunk_bytes);
  return Status::ResourceExhausted(
      "device memory budget too small: need at least " + std::to_string(needed) + " bytes (" + FormatBytes(needed) +
      ": " + FormatBytes(TierLayout::Align(options.non_model_bytes)) + " activations and workspaces + " +
      (options.grad_home.has_value()
           ? FormatBytes(TierLayout::StagingBytes(chunk_bytes, options)) + " staging for 16-bit gradient copies + "
           : std::string()) +
      (options.param_device.has_value()
           ? std::to_string(TierLayout::MinParamChunks(options)) + " 16-bit param chunks of " +
                 FormatBytes(TierLayout::HalfSlotBytes(chunk_bytes)) + " and " +
                 std::to_string(TierLayout::MinGradChunks(options)) + " chunks of " + FormatBytes(stride)
           : std::to_string(options.min_chunks_per_moment) + " chunks of " + FormatBytes(stride)) +
      " in use at once), available " + std::to_string(capacity) + " bytes (" + FormatBytes(capacity) + ")");
}

// Where each chunk of each kind is homed, given the device tier's slots.
Result<ChunkPlacement> PlaceChunks(int32_t num_chunks, const TierLayout::TierSlots& slots,
                                   const ChunkRuntimeOptions& options) {
  ChunkPlacement placement;
  placement.num_chunks = num_chunks;
  placement.device_adam_chunks = slots.device_adam_chunks;
  placement.half_params = options.param_device.has_value();
  placement.half_grads = options.grad_home.has_value();
  placement.disk_chunks = options.disk_moment_chunks;
  placement.disk_master_chunks = options.param_device.has_value() ? options.disk_master_chunks : 0;
  if (placement.disk_master_chunks < 0 || placement.disk_master_chunks > placement.disk_chunks) {
    return Status::InvalidArgument("disk tier: the masters of " + std::to_string(placement.disk_master_chunks) +
                                   " chunks go to disk only with their moments (" +
                                   std::to_string(placement.disk_chunks) + " chunks' moments there)");
  }
  if (options.disk_moment_chunks < 0 || options.disk_moment_chunks > num_chunks - slots.device_adam_chunks) {
    return Status::InvalidArgument("disk tier: the moments of " + std::to_string(options.disk_moment_chunks) +
                                   " chunks cannot be homed on disk: " +
                                   std::to_string(num_chunks - slots.device_adam_chunks) +
                                   " chunks update on the host");
  }
  if (options.disk_moment_chunks > 0 && options.disk_path.empty()) {
    return Status::InvalidArgument("disk tier: moments homed on disk need a directory (runtime.nvme_path)");
  }
  return placement;
}

}  // namespace

Result<std::unique_ptr<ChunkManager>> ChunkManager::Create(int32_t num_chunks, int64_t chunk_bytes,
                                                           std::unique_ptr<DeviceBackend> backend,
                                                           const ChunkRuntimeOptions& options,
                                                           Communicator* comm) {
  if (num_chunks <= 0 || chunk_bytes <= 0) return Status::InvalidArgument("no chunks to manage");
  const int world = comm != nullptr ? comm->world_size() : 1;
  PSTAR_RETURN_IF_ERROR(CheckShards(chunk_bytes, world, options, comm, *backend));
  const int64_t capacity = TierLayout::DeviceCapacity(num_chunks, chunk_bytes, options);
  PSTAR_RETURN_IF_ERROR(CheckDeviceFits(chunk_bytes, capacity, options));
  // With N ranks every update runs on the host shards (device Adam would need
  // the device to hold shards, not gathered chunks).
  ChunkRuntimeOptions laid = options;
  if (world > 1) laid.hybrid_adam = false;
  const TierLayout::TierSlots slots = TierLayout::LayOutSlots(num_chunks, chunk_bytes, laid);
  PSTAR_ASSIGN_OR_RETURN(const ChunkPlacement placement, PlaceChunks(num_chunks, slots, options));
  const int64_t stride = TierLayout::SlotBytes(chunk_bytes);
  auto m = std::unique_ptr<ChunkManager>(new ChunkManager(placement, stride, std::move(backend), options, comm));
  PSTAR_RETURN_IF_ERROR(m->CreateTiers(chunk_bytes, slots, capacity));
  m->InitState();
  m->CountHomes(capacity);
  return m;
}

Status ChunkManager::CreateTiers(int64_t chunk_bytes, const TierLayout::TierSlots& slots, int64_t capacity) {
  DeviceBackend& b = *backend_;
  PSTAR_ASSIGN_OR_RETURN(device_, DeviceTier::Create(b, placement_, chunk_bytes, slots, options_, capacity));
  PSTAR_ASSIGN_OR_RETURN(host_, HostTier::Create(b, placement_, shard_bytes_, options_));
  PSTAR_ASSIGN_OR_RETURN(copier_, TierCopier::Create(b, comm_, placement_, chunk_bytes_, options_, &counters_));
  if (placement_.disk_chunks == 0) return Status::Ok();
  DiskTier::Shape shape;
  shape.directory = options_.disk_path;
  shape.rank = rank_;
  shape.home_bytes = shard_bytes_;
  shape.homes = 2 * placement_.disk_chunks + placement_.disk_master_chunks;
  shape.windows = TierLayout::DiskWindows(options_);
  shape.io_threads = std::max(1, options_.disk_io_threads);
  PSTAR_ASSIGN_OR_RETURN(disk_, DiskTier::Create(shape));
  disk_->SetCounters(&counters_);
  counters_.disk_tier = 1;
  return Status::Ok();
}

void ChunkManager::InitState() {
  const int32_t num_chunks = placement_.num_chunks;
  if (options_.grad_home.has_value()) widen_buffer_.resize(size_t(shard_bytes_) / sizeof(float));
  states_.assign(size_t(placement_.total()), ChunkState{});
  for (int32_t i = num_chunks; i < placement_.total(); ++i) {
    // Grads and moments start as zeros; device-homed moments are zero-filled
    // in place already.
    states_[size_t(i)].zero = !placement_.DeviceHomed(i) || i < 2 * num_chunks;
  }
  compute_done_ = backend_->CreateEvent();
  slot_ticket_.assign(size_t(device_.slot_count()), 0);
  home_read_by_.assign(size_t(placement_.total()), 0);
  home_written_by_.assign(size_t(placement_.total()), 0);
}

void ChunkManager::CountHomes(int64_t capacity) {
  const int32_t num_chunks = placement_.num_chunks;
  RuntimeCounters& c = counters_;
  for (int k = 0; k < kNumStateKinds; ++k) {
    // Each chunk's home: on the device, on disk (a param whose master is
    // there keeps a 16-bit home on the host too), or on the host.
    int32_t on_device = 0, on_disk = 0, on_host = 0;
    int64_t host_bytes = 0;
    for (int32_t chunk = 0; chunk < num_chunks; ++chunk) {
      const int32_t i = k * num_chunks + chunk;
      if (placement_.DeviceHomed(i)) {
        ++on_device;
      } else if (placement_.DiskHomed(i)) {
        ++on_disk;
        if (placement_.HalfParam(i)) ++on_host, host_bytes += shard_bytes_ / 2;
      } else {
        ++on_host;
        host_bytes += host_.HomeBytes(i);
      }
    }
    c.resident_bytes[int(Tier::kHost)][size_t(k)] = host_bytes;
    c.resident_chunks[int(Tier::kHost)][size_t(k)] = on_host;
    c.resident_bytes[int(Tier::kDisk)][size_t(k)] = int64_t(on_disk) * shard_bytes_;
    c.resident_chunks[int(Tier::kDisk)][size_t(k)] = on_disk;
    c.resident_bytes[int(Tier::kDevice)][size_t(k)] = int64_t(on_device) * chunk_bytes_;
    c.resident_chunks[int(Tier::kDevice)][size_t(k)] = on_device;
  }
  c.non_model_bytes[int(Tier::kDevice)] = TierLayout::Align(options_.non_model_bytes);
  c.device_capacity_bytes = capacity;
  c.chunk_budget_bytes = device_.chunk_budget_bytes();
}

float* ChunkManager::DeviceHome(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (!placement_.DeviceHomed(i)) RuntimeBug("device home of a chunk homed on the host");
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0) {
    if (st.pins > 0) RuntimeBug("device home of a param chunk an op is reading");
    DropDeviceCopy(i);
  }
  return device_.Home(i);
}

float* ChunkManager::HostReadableHome(int32_t index) {
  if (backend_->device_is_host_memory()) return device_.Home(index);  // ops complete when issued
  if (peek_buffer_.data() == nullptr) {
    auto block = backend_->AllocateHost(size_t(chunk_bytes_));
    if (!block.ok()) RuntimeBug("host buffer for reading a device-homed chunk: " + block.status().message());
    peek_buffer_ = std::move(block).value();
  }
  SynchronizeCompute();
  backend_->Copy(peek_buffer_.data(), device_.Home(index), size_t(chunk_bytes_), StreamKind::kDeviceToHost);
  backend_->Record(*compute_done_, StreamKind::kDeviceToHost);
  backend_->Synchronize(*compute_done_);
  return reinterpret_cast<float*>(peek_buffer_.data());
}

void ChunkManager::SynchronizeCompute() {
  FlushHostWindow();
  backend_->Record(*compute_done_, StreamKind::kCompute);
  backend_->Synchronize(*compute_done_);
}

void ChunkManager::UpdateResidency(int32_t index, Tier tier, int sign) {
  const size_t kind = size_t(placement_.KindOf(index));
  const int64_t device_bytes = placement_.HalfParam(index) ? device_.half_slot_stride() : chunk_bytes_;
  const int64_t delta = sign * (tier == Tier::kHost ? host_.HomeBytes(index) : device_bytes);
  counters_.resident_bytes[int(tier)][kind] += delta;
  step_residency_.OnResidencyChange(tier, delta);
  counters_.resident_chunks[int(tier)][kind] += sign;
}

void ChunkManager::Access(std::span<const ChunkAccess> accesses) {
  FlushHostWindow();
  CloseDiskChunk();  // masters written on the host (init, a checkpoint) reach their 16-bit homes
  ++tick_;
  // The chunks that stream through slots; device-homed ones are always there
  // and stay out of the trace.
  std::vector<int32_t> moment;
  moment.reserve(accesses.size());
  for (size_t k = 0; k < accesses.size(); ++k) {
    const int32_t i = Index(accesses[k].key);
    for (size_t j = 0; j < k; ++j) {
      if (Index(accesses[j].key) == i) RuntimeBug("chunk listed twice in one moment");
    }
    if (placement_.HalfParam(i) && accesses[k].writes) RuntimeBug("a 16-bit param copy is read-only on the device");
    if (placement_.DiskHomed(i) && !placement_.HalfParam(i)) RuntimeBug("an op on a chunk homed on disk");
    if (!placement_.Streams(i)) {
      ++states_[size_t(i)].pins;
      continue;
    }
    moment.push_back(i);
  }
  // Checked against the trace before any eviction consults it.
  trace_.Observe(moment);
  // Pin what is already here first, so loading the rest cannot evict it.
  for (int32_t i : moment) {
    ChunkState& st = states_[size_t(i)];
    if (st.slot < 0) continue;
    if (st.prefetched) {
      ++counters_.prefetch_hits;
      st.prefetched = false;
    }
    ++st.pins;
  }
  for (const ChunkAccess& a : accesses) {
    const int32_t i = Index(a.key);
    if (!placement_.Streams(i)) continue;
    ChunkState& st = states_[size_t(i)];
    if (st.slot < 0) {
      if (!Load(i, /*prefetch=*/false, /*must_outlive=*/0)) {
        int32_t pinned = 0;
        for (int32_t s = 0; s < device_.slot_count(); ++s) {
          pinned += device_.owner(s) >= 0 && states_[size_t(device_.owner(s))].pins > 0;
        }
        RuntimeBug("no device slot for chunk " + std::to_string(a.key.chunk) + " (" + StateKindName(a.key.kind) +
                   "): " + std::to_string(pinned) + " of " + std::to_string(streaming_slots()) + " slots pinned");
      }
      ++st.pins;
    }
    if (a.writes) st.device_dirty = true;
    st.last_use = tick_;
  }
  // Compute reads the chunks only after their copies landed, and writes one
  // only after any copy home of its earlier contents read them.
  // With N ranks, a chunk's gather (or its slot's last collective) is done
  // first: the step waits for the chunks it needs now, not those ahead.
  for (const ChunkAccess& a : accesses) {
    if (!placement_.Streams(Index(a.key))) continue;
    WaitTicket(slot_ticket_[size_t(state(a.key).slot)]);
    const DeviceTier::SlotEvents& ev = device_.events(state(a.key).slot);
    backend_->StreamWait(StreamKind::kCompute, *ev.loaded);
    if (a.writes) backend_->StreamWait(StreamKind::kCompute, *ev.copied_out);
  }

  PrefetchWithinStep(trace_, options_.prefetch_depth,
                     [this](int32_t index, int64_t must_outlive) { return PrefetchLoad(index, must_outlive); });
  if (observer_) observer_(*this);
  trace_.Advance();
}

void ChunkManager::Release(std::span<const ChunkAccess> accesses) {
  for (const ChunkAccess& a : accesses) {
    ChunkState& st = state(a.key);
    if (st.pins <= 0) RuntimeBug("release of an unpinned chunk");
    --st.pins;
    if (!placement_.Streams(Index(a.key))) continue;  // read by the host only after SynchronizeCompute
    // The slot may be copied out or reused only after the op's work on it.
    backend_->Record(*device_.events(st.slot).computed, StreamKind::kCompute);
  }
}

float* ChunkManager::DeviceData(ChunkKey key) const {
  const ChunkState& st = state(key);
  const int32_t i = Index(key);
  if (placement_.HalfParam(i)) RuntimeBug("fp32 device data of a 16-bit param copy");
  const bool homed = placement_.DeviceHomed(i);
  if (st.pins <= 0 || (st.slot < 0 && !homed)) RuntimeBug("device data of a chunk that is not pinned");
  return homed ? device_.Home(i) : device_.SlotData(st.slot);
}

const uint16_t* ChunkManager::HalfParamData(int32_t chunk) const {
  const ChunkState& st = state({StateKind::kParam, chunk});
  if (!half_params()) RuntimeBug("16-bit device data of an fp32 param");
  if (st.pins <= 0 || st.slot < 0) RuntimeBug("device data of a chunk that is not pinned");
  return reinterpret_cast<const uint16_t*>(device_.SlotData(st.slot));
}

float* ChunkManager::DeviceMasterForUpdate(int32_t chunk) {
  FlushHostWindow();
  const int32_t i = Index({StateKind::kParam, chunk});
  if (!half_params() || !placement_.DeviceHomed(i)) RuntimeBug("device master of a chunk homed on the host");
  ChunkState& st = states_[size_t(i)];
  if (st.pins > 0) RuntimeBug("update of a param chunk an op is reading");
  if (st.slot >= 0) DropDeviceCopy(i);  // stale once the master moves
  return device_.Home(i);
}

ChunkManager::~ChunkManager() {
  // Started collectives read and write the tiers' memory: they end first.
  if (comm_ != nullptr) (void)comm_->Wait(last_ticket_);
  FlushHostWindow();
}

void ChunkManager::WaitTicket(CollectiveTicket ticket) {
  if (ticket <= done_ticket_) return;
  const Status s = comm_->Wait(ticket);
  if (!s.ok()) CollectiveFailed(rank_, s.message());
  done_ticket_ = ticket;
}

void ChunkManager::NoteCollective(CollectiveTicket ticket, int32_t slot, int32_t index, bool writes_home) {
  if (ticket == 0) return;
  last_ticket_ = ticket;
  slot_ticket_[size_t(slot)] = ticket;
  (writes_home ? home_written_by_ : home_read_by_)[size_t(index)] = ticket;
  if (!options_.comm_overlap) WaitTicket(ticket);
}

void ChunkManager::FlushHostWindow() {
  if (host_window_index_ < 0) return;
  const int32_t i = std::exchange(host_window_index_, -1);
  backend_->Copy(device_.Home(i), peek_buffer_.data(), size_t(chunk_bytes_), StreamKind::kHostToDevice);
  backend_->Record(*compute_done_, StreamKind::kHostToDevice);
  backend_->Synchronize(*compute_done_);
}

bool ChunkManager::Load(int32_t index, bool prefetch, int64_t must_outlive) {
  // A copy or gather reads the home after an update on another thread; the
  // collectives the home waits for are ordered before this one already.
  FenceUpdates(index, /*writes=*/false);
  ChunkState& st = states_[size_t(index)];
  // The slot's last collective (a reduce-scatter reading it, or a gather
  // never used) is done before anything writes it. A gather of host-memory
  // shards writes the slot from the communicator's thread, after that
  // collective already: the step does not wait for it here.
  const bool gathered_on_queue =
      world_ > 1 && !comm_->device_buffers() && !placement_.HalfParam(index) && !AccumulatesHome(index) && !st.zero;
  const bool fill = LoadsAsFill(index);
  const int32_t slot = TakeSlot(placement_.PoolOf(index), must_outlive, /*waits=*/!gathered_on_queue, fill);
  if (slot < 0) return false;
  if (!gathered_on_queue) WaitTicket(slot_ticket_[size_t(slot)]);
  DeviceTier::SlotEvents& ev = device_.events(slot);
  st.slot = slot;
  device_.Occupy(slot, index);
  // The slot's previous contents must be read by compute and copied home first.
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.computed);
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.copied_out);
  if (placement_.HalfParam(index)) {
    NoteCollective(copier_->LoadHalfParam(index, slot, device_, host_), slot, index, /*writes_home=*/false);
    st.device_dirty = false;
  } else if (fill) {
    // A fill, not a transfer: nothing to count as prefetched. With N ranks a
    // gradient's home holds reduced sums and this rank's new partial starts
    // at zero.
    backend_->Zero(device_.SlotData(slot), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    if (!AccumulatesHome(index)) st.zero = false;
    st.device_dirty = true;
    prefetch = false;
  } else {
    NoteCollective(copier_->LoadHome(index, slot, device_, host_), slot, index, /*writes_home=*/false);
    st.device_dirty = false;
  }
  backend_->Record(*ev.loaded, StreamKind::kHostToDevice);
  st.prefetched = prefetch;
  if (prefetch) ++counters_.prefetches;
  UpdateResidency(index, Tier::kDevice, +1);
  return true;
}

bool ChunkManager::PrefetchLoad(int32_t index, int64_t must_outlive) {
  if (states_[size_t(index)].slot >= 0) return true;
  return Load(index, /*prefetch=*/true, must_outlive);
}

int32_t ChunkManager::TakeSlot(int pool, int64_t must_outlive, bool waits, bool fill) {
  const bool opt = trace_.valid() && options_.eviction == EvictionPolicy::kOpt;
  const bool prefetch = must_outlive > 0;
  // A fill (a gradient's zeros) costs nothing at its use: loaded ahead, it
  // gains nothing and may evict a copy that must come back this step (a
  // transfer, or a gather with N ranks) for one it could have had later,
  // when the chunks done by then free their slots. So a prefetched fill
  // takes only a free slot past its collectives, or a victim no use this
  // step needs again (or one OPT drops before that use anyway); else it
  // waits for its use. With N ranks the victim is clean too: a dirty one's
  // reduce-scatter would hold the fill, and this thread, until it ends.
  if (fill && prefetch && opt) {
    const auto past_collectives = [this](int32_t s) {
      return comm_ == nullptr || slot_ticket_[size_t(s)] <= done_ticket_;
    };
    if (device_.HasFreeSlot(pool, past_collectives)) return device_.TakeFreeSlot(pool, past_collectives);
    CollectVictims(pool, /*clean_only=*/clean_victims_only_ || world_ > 1);
    const int32_t victim = ChooseVictim(candidates_, options_.eviction, trace_, must_outlive);
    if (victim < 0 || (UsedAgainThisStep(victim) && !OptDropsBeforeItsUse(pool, victim))) return -1;
    Evict(victim);
    return device_.TakeFreeSlot(pool);
  }
  // A caller that waits for the slot's last collective stalls compute on
  // the link when no free slot is past its collectives (a gradient's
  // reduce-scatter still reads it) or a dirty victim must be written home
  // first. A clean copy that would not live to its next use anyway gives up
  // its slot instead, which costs nothing now or later: one next used in a
  // later step (with N ranks the update writes every param's home shard and
  // drops its device copy), or one OPT would drop before that use. Failing
  // that, a prefetch never waits (the use itself may find the collective
  // over); a use takes what the rules below give and waits. The choice reads
  // only the tickets this thread has waited for and the trace, so every
  // rank, and the payload simulation, makes it alike.
  if (waits && world_ > 1 && opt &&
      !device_.HasFreeSlot(pool, [this](int32_t s) { return slot_ticket_[size_t(s)] <= done_ticket_; })) {
    CollectVictims(pool, /*clean_only=*/true);
    const int32_t victim = ChooseVictim(candidates_, options_.eviction, trace_, must_outlive);
    const bool take = victim >= 0 && (!UsedAgainThisStep(victim) || OptDropsBeforeItsUse(pool, victim) ||
                                      // a prefetch's usual clean victim, with no free slot at all
                                      (prefetch && !device_.HasFreeSlot(pool, [](int32_t) { return true; }) &&
                                       !HeldChunkGoesFirst(pool, victim, must_outlive)));
    if (take) {
      Evict(victim);
      return device_.TakeFreeSlot(pool);
    }
    if (prefetch) return -1;
  }
  // A free slot no collective still reads or writes, if there is one.
  const int32_t free =
      device_.TakeFreeSlot(pool, [this](int32_t s) { return comm_ == nullptr || comm_->Done(slot_ticket_[size_t(s)]); });
  if (free >= 0) return free;
  // Between steps the dirty copies are gradients the next step zeroes:
  // writing them home for a prefetch would copy dead data.
  CollectVictims(pool, /*clean_only=*/clean_victims_only_);
  const int32_t victim = ChooseVictim(candidates_, options_.eviction, trace_, must_outlive);
  if (victim < 0) return -1;
  // A prefetch does not evict a copy this step needs again while a chunk an
  // op holds now would be OPT's victim once released: waiting a few moments
  // saves bringing the copy back (a second gather with N ranks).
  if (prefetch && opt && UsedAgainThisStep(victim) && HeldChunkGoesFirst(pool, victim, must_outlive)) return -1;
  Evict(victim);  // frees its slot, now on top of the pool's free stack
  return device_.TakeFreeSlot(pool);
}

bool ChunkManager::UsedAgainThisStep(int32_t index) const {
  return trace_.NextUseDistance(index) < trace_.size() - trace_.moment();
}

bool ChunkManager::HeldChunkGoesFirst(int pool, int32_t victim, int64_t must_outlive) const {
  const int64_t victim_use = trace_.NextUseDistance(victim);
  for (int32_t s = device_.pool_first(pool); s < device_.pool_first(pool) + device_.pool_size(pool); ++s) {
    const int32_t owner = device_.owner(s);
    if (owner < 0 || owner == victim || states_[size_t(owner)].pins == 0) continue;
    const ChunkTrace::HeldRun run = trace_.CurrentRun(owner);
    if (run.release > 0 && run.release < must_outlive && run.next_use > victim_use) return true;
  }
  return false;
}

bool ChunkManager::OptDropsBeforeItsUse(int pool, int32_t victim) const {
  std::vector<int32_t> resident;
  for (int32_t s = device_.pool_first(pool); s < device_.pool_first(pool) + device_.pool_size(pool); ++s) {
    if (device_.owner(s) >= 0) resident.push_back(device_.owner(s));
  }
  return OptDropsBeforeNextUse(
      trace_, resident, device_.pool_size(pool), options_.prefetch_depth, victim,
      [this, pool](int32_t i) { return placement_.PoolOf(i) == pool; }, [this](int32_t i) { return LoadsAsFill(i); });
}

void ChunkManager::CollectVictims(int pool, bool clean_only) {
  candidates_.clear();
  for (int32_t s = device_.pool_first(pool); s < device_.pool_first(pool) + device_.pool_size(pool); ++s) {
    const int32_t owner = device_.owner(s);
    if (owner < 0) continue;
    const ChunkState& st = states_[size_t(owner)];
    if (st.pins > 0 || (clean_only && st.device_dirty)) continue;
    candidates_.push_back({owner, st.device_dirty, st.last_use});
  }
}

void ChunkManager::Evict(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  if (st.device_dirty) WriteHome(index);
  ++counters_.evictions[size_t(placement_.KindOf(index))];
  DropDeviceCopy(index);
}

void ChunkManager::WriteHome(int32_t index) {
  if ((world_ > 1 && !AccumulatesHome(index)) || placement_.HalfParam(index)) {
    RuntimeBug("a sharded chunk other than a gradient, or a 16-bit param copy, was written on the device");
  }
  // A copy home is ordered after the host's uses by this thread, a
  // reduce-scatter after the collectives before it: only updates on
  // another thread are waited for.
  FenceUpdates(index, /*writes=*/true);
  ChunkState& st = states_[size_t(index)];
  NoteCollective(copier_->WriteHome(index, st.slot, device_, host_, st.zero), st.slot, index, /*writes_home=*/true);
  st.device_dirty = false;
}

void ChunkManager::DropDeviceCopy(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  device_.Vacate(st.slot);
  st.slot = -1;
  st.device_dirty = false;
  st.prefetched = false;
  UpdateResidency(index, Tier::kDevice, -1);
}

void ChunkManager::MakeHomeCurrent(int32_t i) {
  FenceHost(i, /*writes=*/false);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0 && st.device_dirty) {
    if (st.pins > 0) RuntimeBug("host read of a chunk an op is writing on the device");
    WriteHome(i);
    if (AccumulatesHome(i)) DropDeviceCopy(i);
    WaitTicket(home_written_by_[size_t(i)]);
  }
  // This write-home, or one from an eviction still in flight.
  backend_->Synchronize(copier_->home_written(i));
  if (st.zero) {
    FenceHost(i, /*writes=*/true);
    std::memset(host_.Home(i), 0, size_t(host_.HomeBytes(i)));
    st.zero = false;
  }
}

void ChunkManager::StartGradReduce(int32_t chunk) {
  FlushHostWindow();
  const int32_t i = Index({StateKind::kGrad, chunk});
  if (!AccumulatesHome(i)) RuntimeBug("a reduce-scatter of a gradient with one rank");
  ChunkState& st = states_[size_t(i)];
  if (st.slot < 0 || !st.device_dirty) return;
  if (st.pins > 0) RuntimeBug("reduce-scatter of a gradient an op is writing");
  WriteHome(i);
  DropDeviceCopy(i);
}

ChunkManager::GradHome ChunkManager::StartGradHome(int32_t chunk) {
  FlushHostWindow();
  const int32_t i = Index({StateKind::kGrad, chunk});
  if (world_ > 1 || placement_.DeviceHomed(i)) RuntimeBug("a gradient's home for an update on another thread");
  ChunkState& st = states_[size_t(i)];
  GradHome home;
  if (st.slot >= 0 && st.device_dirty) {
    if (st.pins > 0) RuntimeBug("host read of a chunk an op is writing on the device");
    WriteHome(i);  // queued; the copy's end is home_written
  }
  if (st.zero) {
    FenceHost(i, /*writes=*/true);
    std::memset(host_.Home(i), 0, size_t(host_.HomeBytes(i)));
    st.zero = false;
  }
  home.ready = &copier_->home_written(i);
  if (placement_.HalfHomed(i)) {
    home.half = host_.HalfHome(i);
  } else {
    home.fp32 = host_.Fp32Home(i);
  }
  return home;
}

void ChunkManager::CloseDiskChunk() {
  if (disk_ == nullptr || disk_open_chunk_ < 0) return;
  // Masters the host wrote: their 16-bit homes, what streams, narrowed now.
  for (int32_t index : disk_written_masters_) {
    const float* master = disk_->Open(placement_.DiskHome(index), false, false);
    NarrowToHalf(host_.HalfParamHome(index), master, shard_bytes_ / int64_t(sizeof(float)), *options_.param_device);
  }
  disk_written_masters_.clear();
  disk_->UnpinAll();  // the chunk's windows are done with: written behind
  disk_open_chunk_ = -1;
}

float* ChunkManager::OpenOnDisk(int32_t index, bool write) {
  FenceHost(index, write);
  const int32_t chunk = index % num_chunks_;
  if (chunk != disk_open_chunk_) {
    CloseDiskChunk();
    disk_open_chunk_ = chunk;
  }
  ChunkState& st = states_[size_t(index)];
  float* window = disk_->Open(placement_.DiskHome(index), st.zero, write);
  st.zero = false;
  if (write && placement_.HalfParam(index) &&
      std::find(disk_written_masters_.begin(), disk_written_masters_.end(), index) == disk_written_masters_.end()) {
    // The 16-bit copy on the device, if any, is stale once the master changes.
    if (st.slot >= 0) {
      if (st.pins > 0) RuntimeBug("host write to a chunk pinned on the device");
      DropDeviceCopy(index);
    }
    disk_written_masters_.push_back(index);
  }
  // Host sweeps go in chunk order: the same kind's next chunks are read ahead.
  for (int32_t ahead = 1; ahead <= options_.disk_read_ahead && chunk + ahead < num_chunks_; ++ahead) {
    if (!states_[size_t(index + ahead)].zero) disk_->ReadAhead(placement_.DiskHome(index + ahead));
  }
  return window;
}

const uint16_t* ChunkManager::HalfHostRead(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (!placement_.HalfHomed(i)) {
    RuntimeBug(std::string("16-bit read of a chunk homed in fp32 (") + StateKindName(key.kind) + ")");
  }
  MakeHomeCurrent(i);
  return host_.HalfHome(i);
}

const float* ChunkManager::HostRead(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (placement_.DeviceHomed(i)) return HostReadableHome(i);
  if (placement_.DiskHomed(i)) return OpenOnDisk(i, /*write=*/false);
  MakeHomeCurrent(i);
  if (placement_.HalfHomed(i)) {
    // Widened into the one-shard buffer, exactly (the values are 16-bit ones).
    WidenFromHalf(widen_buffer_.data(), host_.HalfHome(i), shard_bytes_ / int64_t(sizeof(float)),
                  *options_.grad_home);
    return widen_buffer_.data();
  }
  return host_.Fp32Home(i);
}

float* ChunkManager::HostWrite(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (placement_.DeviceHomed(i)) {
    ChunkState& st = states_[size_t(i)];
    if (st.pins > 0) RuntimeBug("host write to a chunk pinned on the device");
    if (st.slot >= 0) DropDeviceCopy(i);  // a 16-bit param copy, stale once the master is written
    if (backend_->device_is_host_memory()) return device_.Home(i);
    // On a GPU the host writes a copy, put back at the next call into the manager.
    float* window = HostReadableHome(i);
    host_window_index_ = i;
    return window;
  }
  if (placement_.DiskHomed(i)) return OpenOnDisk(i, /*write=*/true);
  if (placement_.HalfHomed(i)) {
    RuntimeBug(std::string("host write to a chunk homed in 16 bits (") + StateKindName(key.kind) + ")");
  }
  HostRead(key);
  FenceHost(i, /*writes=*/true);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0) {
    if (st.pins > 0) RuntimeBug("host write to a chunk pinned on the device");
    DropDeviceCopy(i);
  }
  return host_.Fp32Home(i);
}

ChunkManager::CurrentCopy ChunkManager::Current(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (placement_.DeviceHomed(i)) return {device_.Home(i), true};
  FenceHost(i, /*writes=*/false);
  if (placement_.DiskHomed(i)) return {OpenOnDisk(i, /*write=*/false), false};
  const ChunkState& st = states_[size_t(i)];
  // A 16-bit param copy is not the param: its master is.
  if (st.zero || AccumulatesHome(i) || placement_.HalfParam(i)) return {HostRead(key), false};
  // With one rank a device copy is current, dirty or not (a clean one may
  // still be on its way home: reading it in place does not wait for that
  // copy). With N ranks the device holds whole chunks, the home this rank's
  // shard, which is what callers index.
  if (world_ == 1 && st.slot >= 0) {
    // A prefetched copy may still be on its way in: device readers wait for it.
    backend_->StreamWait(StreamKind::kCompute, *device_.events(st.slot).loaded);
    return {device_.SlotData(st.slot), true};
  }
  if (placement_.HalfHomed(i)) return {HostRead(key), false};  // widened for the host
  backend_->Synchronize(copier_->home_written(i));
  return {host_.Fp32Home(i), false};
}

const float* ChunkManager::Peek(ChunkKey key) {
  const CurrentCopy current = Current(key);
  if (current.on_device && !backend_->device_is_host_memory()) return HostRead(key);
  return current.data;
}

void ChunkManager::ZeroFill(StateKind kind) {
  FlushHostWindow();
  for (int32_t c = 0; c < num_chunks_; ++c) {
    const int32_t i = Index({kind, c});
    ChunkState& st = states_[size_t(i)];
    if (st.pins > 0) RuntimeBug("zero fill of a pinned chunk");
    if (placement_.DeviceHomed(i)) {
      backend_->Zero(device_.Home(i), size_t(chunk_bytes_), StreamKind::kCompute);
      if (st.slot >= 0) DropDeviceCopy(i);
      continue;
    }
    if (st.slot >= 0) DropDeviceCopy(i);  // its contents are discarded, no copy home
    st.zero = true;
  }
}

void ChunkManager::Flush(StateKind kind) {
  FlushHostWindow();
  if (world_ > 1) {
    // Every reduce-scatter started, then waited for.
    for (int32_t c = 0; c < num_chunks_; ++c) {
      const int32_t i = Index({kind, c});
      const ChunkState& st = states_[size_t(i)];
      if (!AccumulatesHome(i) || st.slot < 0 || !st.device_dirty) continue;
      if (st.pins > 0) RuntimeBug("flush of a chunk pinned on the device");
      WriteHome(i);
      DropDeviceCopy(i);
    }
    for (int32_t c = 0; c < num_chunks_; ++c) HostRead({kind, c});
    return;
  }
  for (int32_t c = placement_.device_adam_chunks; c < num_chunks_; ++c) {
    const int32_t i = Index({kind, c});
    const ChunkState& st = states_[size_t(i)];
    if (placement_.DeviceHomed(i) || st.slot < 0 || !st.device_dirty) continue;
    if (st.pins > 0) RuntimeBug("flush of a chunk pinned on the device");
    WriteHome(i);
  }
}

void ChunkManager::BeginStep() {
  trace_.BeginStep();
  step_residency_.BeginStep(counters_);
}

void ChunkManager::BeginUpdates() {
  if (world_ == 1 || !options_.comm_overlap || placement_.disk_chunks > 0 || placement_.disk_master_chunks > 0) return;
  trace_.EndStep();
  updates_begun_ = true;
  updated_.assign(size_t(num_chunks()), 0);
  next_prefetch_.Reset();
}

void ChunkManager::UpdateDone(int32_t chunk) {
  if (!updates_begun_) return;
  updated_[size_t(chunk)] = 1;
  clean_victims_only_ = true;
  next_prefetch_.Advance(
      trace_, options_.prefetch_depth, placement_,
      [this](int32_t index, int64_t must_outlive) { return PrefetchLoad(index, must_outlive); },
      [this](int32_t index) { return updated_[size_t(placement_.KeyOf(index).chunk)] != 0; });
  clean_victims_only_ = false;
}

void ChunkManager::EndStep() {
  FlushHostWindow();
  CloseDiskChunk();  // the optimizer's last chunk, written behind
  if (!std::exchange(updates_begun_, false)) {
    trace_.EndStep();
    next_prefetch_.Reset();
  }
  // The params of the next step's first moments (those BeginUpdates did not
  // start already): after the optimizer they are current, and their copies
  // overlap whatever runs until it starts.
  clean_victims_only_ = true;
  next_prefetch_.Finish(trace_, options_.prefetch_depth, placement_,
                        [this](int32_t index, int64_t must_outlive) { return PrefetchLoad(index, must_outlive); });
  clean_victims_only_ = false;
  step_residency_.EndStep(&counters_);
}

}  // namespace pstar
