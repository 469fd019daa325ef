#include "worker/runtime/chunk_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "worker/core/bytes.h"
#include "worker/runtime/nvtx_range.h"

namespace pstar {

namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

int64_t RoundUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void InternalError(const std::string& what) {
  // A runtime bug, not a user error: the start-up checks rule these states out.
  std::fprintf(stderr, "pstar: internal error: %s\n", what.c_str());
  std::abort();
}

}  // namespace

const char* EvictionPolicyName(EvictionPolicy policy) {
  return policy == EvictionPolicy::kOpt ? "opt" : "lru";
}

ChunkManager::ChunkManager(int32_t num_chunks, int64_t chunk_bytes,
                           std::unique_ptr<DeviceBackend> backend, const ChunkRuntimeOptions& options,
                           Communicator* comm)
    : num_chunks_(num_chunks),
      chunk_bytes_(chunk_bytes),
      comm_(comm),
      world_(comm != nullptr ? comm->world_size() : 1),
      rank_(comm != nullptr ? comm->rank() : 0),
      shard_bytes_(chunk_bytes / (comm != nullptr ? comm->world_size() : 1)),
      options_(options),
      backend_(std::move(backend)) {}

void ChunkManager::CheckCollective(const Status& status) const {
  if (status.ok()) return;
  std::fprintf(stderr, "pstar: error: rank %d: %s\n", rank_, status.message().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

int64_t ChunkManager::SlotBytes(int64_t chunk_bytes) { return RoundUp(chunk_bytes); }

namespace {

// The kinds that can be on the device: all four with the hybrid Adam
// placement, else params and grads (the moments never leave the host).
int64_t DeviceKinds(const ChunkRuntimeOptions& options) { return options.hybrid_adam ? kNumStateKinds : 2; }

}  // namespace

int64_t ChunkManager::DeviceCapacity(int32_t num_chunks, int64_t chunk_bytes,
                                     const ChunkRuntimeOptions& options) {
  const int64_t everything =
      RoundUp(options.non_model_bytes) + DeviceKinds(options) * num_chunks * SlotBytes(chunk_bytes);
  // More than everything would be memory nothing uses: the tier is never larger.
  if (options.device_capacity_bytes > 0) return std::min(options.device_capacity_bytes, everything);
  return everything;
}

int64_t ChunkManager::DeviceSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t room = DeviceCapacity(num_chunks, chunk_bytes, options) - RoundUp(options.non_model_bytes);
  if (room <= 0) return 0;
  return std::min(room / SlotBytes(chunk_bytes), DeviceKinds(options) * num_chunks);
}

int32_t ChunkManager::DeviceAdamChunks(int32_t num_chunks, int64_t slots, const ChunkRuntimeOptions& options) {
  if (!options.hybrid_adam) return 0;
  // Room for every chunk of every kind: everything stays, no margin is needed
  // (slots are exact, nothing fragments).
  if (slots >= int64_t(kNumStateKinds) * num_chunks) return num_chunks;
  // Otherwise a share of the room beyond every param and grad chunk holds
  // optimizer states, two slots per chunk.
  const int64_t fwd_bwd_chunks = 2 * int64_t(num_chunks);
  if (slots < fwd_bwd_chunks + 2) return 0;
  const int64_t n = int64_t(double(slots - fwd_bwd_chunks) * options.margin_use_ratio) / 2;
  return int32_t(std::min<int64_t>(n, num_chunks));
}

int64_t ChunkManager::MinDeviceBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  return RoundUp(options.non_model_bytes) + int64_t(options.min_chunks_per_moment) * SlotBytes(chunk_bytes);
}

Result<std::unique_ptr<ChunkManager>> ChunkManager::Create(int32_t num_chunks, int64_t chunk_bytes,
                                                           std::unique_ptr<DeviceBackend> backend,
                                                           const ChunkRuntimeOptions& options,
                                                           Communicator* comm) {
  if (num_chunks <= 0 || chunk_bytes <= 0) return Status::InvalidArgument("no chunks to manage");
  const int64_t stride = SlotBytes(chunk_bytes);
  const int world = comm != nullptr ? comm->world_size() : 1;
  if (world > 1 && stride % (kAlign * world) != 0) {
    return Status::InvalidArgument("chunk of " + std::to_string(chunk_bytes) + " bytes cannot be split into " +
                                   std::to_string(world) + " aligned shards (needs a multiple of " +
                                   std::to_string(kAlign * world) + " bytes)");
  }
  if (world > 1 && comm->device_buffers() == backend->device_is_host_memory()) {
    return Status::FailedPrecondition(
        std::string(backend->device_is_host_memory()
                        ? "the communicator moves GPU memory but the device tier is host memory"
                        : "a GPU device tier with several ranks needs a communicator over GPU memory (NCCL)"));
  }
  const int64_t total_chunks = int64_t(kNumStateKinds) * num_chunks;
  const int64_t non_model = RoundUp(options.non_model_bytes);
  const int64_t capacity = DeviceCapacity(num_chunks, chunk_bytes, options);
  const int64_t needed = MinDeviceBytes(chunk_bytes, options);
  if (capacity < needed) {
    return Status::ResourceExhausted(
        "device memory budget too small: need at least " + std::to_string(needed) + " bytes (" +
        FormatBytes(needed) + ": " + FormatBytes(non_model) + " activations and workspaces + " +
        std::to_string(options.min_chunks_per_moment) + " chunks of " + FormatBytes(stride) +
        " in use at once), available " + std::to_string(capacity) + " bytes (" + FormatBytes(capacity) +
        ")");
  }
  auto m = std::unique_ptr<ChunkManager>(new ChunkManager(num_chunks, stride, std::move(backend), options, comm));
  m->device_capacity_ = capacity;
  m->non_model_bytes_ = non_model;
  m->slots_offset_ = non_model;
  const int64_t slots = DeviceSlots(num_chunks, chunk_bytes, options);
  PSTAR_ASSIGN_OR_RETURN(m->device_block_, m->backend_->AllocateDevice(size_t(non_model + slots * stride)));
  PSTAR_ASSIGN_OR_RETURN(m->host_block_, m->backend_->AllocateHost(size_t(total_chunks * m->shard_bytes_)));
  if (world > 1) {
    PSTAR_ASSIGN_OR_RETURN(m->scratch_, m->backend_->AllocateHost(size_t(m->shard_bytes_)));
  }
  m->states_.assign(size_t(total_chunks), ChunkState{});
  for (int32_t i = num_chunks; i < total_chunks; ++i) m->states_[size_t(i)].zero = true;  // grads, moments
  m->slot_owner_.assign(size_t(slots), -1);
  for (int64_t s = 0; s < slots; ++s) {
    m->slot_events_.push_back({m->backend_->CreateEvent(), m->backend_->CreateEvent()});
  }
  for (int64_t s = slots - 1; s >= 0; --s) m->free_slots_.push_back(int32_t(s));
  for (int64_t i = 0; i < total_chunks; ++i) m->home_written_.push_back(m->backend_->CreateEvent());
  m->peak_device_bytes_ = non_model;
  // With N ranks every update runs on the host shards (device Adam would need
  // the device to hold shards, not gathered chunks).
  m->device_adam_chunks_ = world > 1 ? 0 : DeviceAdamChunks(num_chunks, slots, options);

  RuntimeCounters& c = m->counters_;
  for (int k = 0; k < kNumStateKinds; ++k) {
    c.resident_bytes[int(Tier::kHost)][size_t(k)] = int64_t(num_chunks) * m->shard_bytes_;
    c.resident_chunks[int(Tier::kHost)][size_t(k)] = num_chunks;
  }
  c.non_model_bytes[int(Tier::kDevice)] = non_model;
  c.device_capacity_bytes = capacity;
  c.chunk_budget_bytes = slots * stride;
  return m;
}

float* ChunkManager::HostCopy(int32_t index) const {
  return reinterpret_cast<float*>(host_block_.data() + int64_t(index) * shard_bytes_);
}

float* ChunkManager::SlotData(int32_t slot) const {
  return reinterpret_cast<float*>(device_block_.data() + slots_offset_ + int64_t(slot) * chunk_bytes_);
}

void ChunkManager::UpdateResidency(int32_t index, Tier tier, int sign) {
  const size_t kind = size_t(KeyOf(index).kind);
  counters_.resident_bytes[int(tier)][kind] += sign * (tier == Tier::kHost ? shard_bytes_ : chunk_bytes_);
  counters_.resident_chunks[int(tier)][kind] += sign;
}

void ChunkManager::Access(std::span<const ChunkAccess> accesses) {
  ++tick_;
  std::vector<int32_t> moment;
  moment.reserve(accesses.size());
  for (const ChunkAccess& a : accesses) {
    const int32_t i = Index(a.key);
    for (int32_t seen : moment) {
      if (seen == i) InternalError("chunk listed twice in one moment");
    }
    moment.push_back(i);
  }
  // Check the trace before any eviction consults it: a moment beyond or unlike
  // the recorded sequence means the trace no longer predicts anything.
  if (trace_valid_ && (moment_ >= int64_t(trace_.size()) || trace_[size_t(moment_)] != moment)) {
    trace_valid_ = false;  // LRU until this step is re-recorded
  }
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
  for (size_t k = 0; k < accesses.size(); ++k) {
    const int32_t i = moment[k];
    ChunkState& st = states_[size_t(i)];
    if (st.slot < 0) {
      if (!Load(i, /*prefetch=*/false, /*must_outlive=*/0)) {
        int32_t pinned = 0;
        for (int32_t owner : slot_owner_) pinned += owner >= 0 && states_[size_t(owner)].pins > 0;
        InternalError("no device slot for chunk " + std::to_string(accesses[k].key.chunk) + " (" +
                      StateKindName(accesses[k].key.kind) + "): " + std::to_string(pinned) + " of " +
                      std::to_string(device_slots()) + " slots pinned");
      }
      ++st.pins;
    }
    if (accesses[k].writes) st.device_dirty = true;
    st.last_use = tick_;
  }
  // Compute reads the chunks only after their copies landed.
  for (int32_t i : moment) backend_->StreamWait(StreamKind::kCompute, *slot_events_[size_t(states_[size_t(i)].slot)].copied);

  step_moments_.push_back(std::move(moment));
  Prefetch();
  if (observer_) observer_(*this);
  ++moment_;
}

void ChunkManager::Release(std::span<const ChunkAccess> accesses) {
  for (const ChunkAccess& a : accesses) {
    ChunkState& st = state(a.key);
    if (st.pins <= 0) InternalError("release of an unpinned chunk");
    --st.pins;
    // The slot may be copied out or reused only after the op's work on it.
    backend_->Record(*slot_events_[size_t(st.slot)].computed, StreamKind::kCompute);
  }
}

float* ChunkManager::DeviceData(ChunkKey key) const {
  const ChunkState& st = state(key);
  if (st.slot < 0 || st.pins <= 0) InternalError("device data of a chunk that is not pinned");
  return SlotData(st.slot);
}

bool ChunkManager::Load(int32_t index, bool prefetch, int64_t must_outlive) {
  const int32_t slot = TakeSlot(must_outlive);
  if (slot < 0) return false;
  ChunkState& st = states_[size_t(index)];
  SlotEvents& ev = slot_events_[size_t(slot)];
  st.slot = slot;
  slot_owner_[size_t(slot)] = index;
  ++slots_in_use_;
  // The slot's previous contents must be read by compute and copied home first.
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.computed);
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.copied);
  if (AccumulatesHome(index)) {
    // The home shard holds reduced sums; this rank's new partial starts at zero.
    backend_->Zero(SlotData(slot), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    st.device_dirty = true;
    prefetch = false;
  } else if (st.zero) {
    backend_->Zero(SlotData(slot), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    st.zero = false;
    st.device_dirty = true;
    prefetch = false;  // a fill, not a transfer: nothing to count as prefetched
  } else if (world_ > 1) {
    // Each rank's home shard lands in its place; the gather fills the rest.
    // The collective runs on this thread, so the host waits for the slot first.
    const int64_t n = shard_bytes_ / int64_t(sizeof(float));
    float* own = SlotData(slot) + int64_t(rank_) * n;
    NvtxRange range("h2d");
    if (comm_->device_buffers()) {
      // NCCL reads GPU memory: the home shard is copied up first and gathered in place.
      backend_->StreamWait(StreamKind::kHostToDevice, *home_written_[size_t(index)]);
      const int64_t move = BeginMove(Direction::kHostToDevice);
      backend_->Copy(own, HostCopy(index), size_t(shard_bytes_), StreamKind::kHostToDevice);
      backend_->Record(*ev.copied, StreamKind::kHostToDevice);
      backend_->Synchronize(*ev.copied);
      backend_->Synchronize(*ev.computed);
      {
        NvtxRange gather("all_gather");
        CheckCollective(comm_->AllGather(own, SlotData(slot), n));
      }
      EndMove(move, Direction::kHostToDevice, shard_bytes_);
    } else {
      backend_->Synchronize(*ev.computed);
      backend_->Synchronize(*ev.copied);
      const int64_t move = BeginMove(Direction::kHostToDevice);
      {
        NvtxRange gather("all_gather");
        CheckCollective(comm_->AllGather(HostCopy(index), SlotData(slot), n));
      }
      EndMove(move, Direction::kHostToDevice, shard_bytes_);
    }
    st.device_dirty = false;
    ++counters_.moves[int(Direction::kHostToDevice)];
    counters_.moved_bytes[int(Direction::kHostToDevice)] += shard_bytes_;
  } else {
    backend_->StreamWait(StreamKind::kHostToDevice, *home_written_[size_t(index)]);
    NvtxRange range("h2d");
    const int64_t move = BeginMove(Direction::kHostToDevice);
    backend_->Copy(SlotData(slot), HostCopy(index), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    EndMove(move, Direction::kHostToDevice, chunk_bytes_);
    st.device_dirty = false;
    ++counters_.moves[int(Direction::kHostToDevice)];
    counters_.moved_bytes[int(Direction::kHostToDevice)] += chunk_bytes_;
  }
  backend_->Record(*ev.copied, StreamKind::kHostToDevice);
  st.prefetched = prefetch;
  if (prefetch) ++counters_.prefetches;
  UpdateResidency(index, Tier::kDevice, +1);
  const int64_t in_use = device_bytes_in_use();
  if (in_use > device_capacity_) InternalError("device tier over budget");
  peak_device_bytes_ = std::max(peak_device_bytes_, in_use);
  return true;
}

int32_t ChunkManager::TakeSlot(int64_t must_outlive) {
  if (!free_slots_.empty()) {
    int32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  const int32_t victim = ChooseVictim(must_outlive);
  if (victim < 0) return -1;
  const int32_t slot = states_[size_t(victim)].slot;
  Evict(victim);
  free_slots_.pop_back();  // Evict returned `slot` to the top of the stack
  return slot;
}

int32_t ChunkManager::ChooseVictim(int64_t must_outlive) const {
  const bool opt = options_.eviction == EvictionPolicy::kOpt && trace_valid_;
  if (must_outlive > 0 && !opt) return -1;  // prefetch never evicts blindly
  int32_t best = -1;
  int64_t best_score = 0;
  bool best_dirty = true;
  for (int32_t owner : slot_owner_) {
    if (owner < 0) continue;
    const ChunkState& st = states_[size_t(owner)];
    if (st.pins > 0) continue;
    int64_t score;
    if (opt) {
      score = NextUseDistance(owner);  // farther is better
      if (score <= must_outlive) continue;
    } else {
      score = -st.last_use;  // older is better
    }
    // Higher score wins; on a tie a clean copy (no write-back), then the lower index.
    if (best < 0 || score > best_score || (score == best_score && best_dirty && !st.device_dirty) ||
        (score == best_score && best_dirty == st.device_dirty && owner < best)) {
      best = owner;
      best_score = score;
      best_dirty = st.device_dirty;
    }
  }
  return best;
}

int64_t ChunkManager::NextUseDistance(int32_t index) const {
  const std::vector<int32_t>& uses = uses_[size_t(index)];
  if (uses.empty() || moment_ >= int64_t(trace_.size())) return kNever;
  auto it = std::upper_bound(uses.begin(), uses.end(), int32_t(moment_));
  if (it != uses.end()) return *it - moment_;
  return int64_t(trace_.size()) - moment_ + uses.front();
}

void ChunkManager::Evict(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  if (st.device_dirty) WriteHome(index);
  ++counters_.evictions[size_t(KeyOf(index).kind)];
  DropDeviceCopy(index);
}

void ChunkManager::WriteHome(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  SlotEvents& ev = slot_events_[size_t(st.slot)];
  backend_->StreamWait(StreamKind::kDeviceToHost, *ev.computed);  // the last writes landed
  NvtxRange range("d2h");
  const int64_t move = BeginMove(Direction::kDeviceToHost);
  if (AccumulatesHome(index)) {
    // home += this step's partials of every rank, reduced; the device copy is
    // then spent (it is in the home sum) and must be dropped by the caller.
    const int64_t n = shard_bytes_ / int64_t(sizeof(float));
    backend_->Synchronize(*ev.computed);  // the collective reads the slot on this thread
    if (comm_->device_buffers()) {
      // NCCL writes GPU memory: reduce into this rank's place in the slot,
      // then copy that part down.
      float* own = SlotData(st.slot) + int64_t(rank_) * n;
      {
        NvtxRange scatter("reduce_scatter");
        CheckCollective(comm_->ReduceScatter(SlotData(st.slot), own, n));
      }
      backend_->Copy(Scratch(), own, size_t(shard_bytes_), StreamKind::kDeviceToHost);
      backend_->Record(*ev.copied, StreamKind::kDeviceToHost);
      backend_->Synchronize(*ev.copied);
    } else {
      NvtxRange scatter("reduce_scatter");
      CheckCollective(comm_->ReduceScatter(SlotData(st.slot), Scratch(), n));
    }
    float* home = HostCopy(index);
    if (st.zero) {
      std::memcpy(home, Scratch(), size_t(shard_bytes_));
      st.zero = false;
    } else {
      const float* sum = Scratch();
      for (int64_t i = 0; i < n; ++i) home[i] += sum[i];
    }
    counters_.moved_bytes[int(Direction::kDeviceToHost)] += shard_bytes_;
    EndMove(move, Direction::kDeviceToHost, shard_bytes_);
  } else if (world_ > 1) {
    InternalError("a sharded chunk other than a gradient was written on the device");
  } else {
    backend_->Copy(HostCopy(index), SlotData(st.slot), size_t(chunk_bytes_), StreamKind::kDeviceToHost);
    backend_->Record(*home_written_[size_t(index)], StreamKind::kDeviceToHost);
    counters_.moved_bytes[int(Direction::kDeviceToHost)] += chunk_bytes_;
    EndMove(move, Direction::kDeviceToHost, chunk_bytes_);
  }
  backend_->Record(*ev.copied, StreamKind::kDeviceToHost);
  st.device_dirty = false;
  ++counters_.moves[int(Direction::kDeviceToHost)];
}

void ChunkManager::DropDeviceCopy(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  slot_owner_[size_t(st.slot)] = -1;
  free_slots_.push_back(st.slot);
  st.slot = -1;
  st.device_dirty = false;
  st.prefetched = false;
  --slots_in_use_;
  UpdateResidency(index, Tier::kDevice, -1);
}

void ChunkManager::Prefetch() {
  if (options_.prefetch_depth <= 0 || !trace_valid_) return;
  const int64_t moments = int64_t(trace_.size());
  // Only within the step: the optimizer rewrites params between steps.
  for (int64_t j = 1; j <= options_.prefetch_depth && moment_ + j < moments; ++j) {
    for (int32_t index : trace_[size_t(moment_ + j)]) {
      if (states_[size_t(index)].slot >= 0) continue;
      if (!Load(index, /*prefetch=*/true, /*must_outlive=*/j)) return;  // no room: stop
    }
  }
}

const float* ChunkManager::HostRead(ChunkKey key) {
  const int32_t i = Index(key);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0 && st.device_dirty) {
    if (st.pins > 0) InternalError("host read of a chunk an op is writing on the device");
    WriteHome(i);
    if (AccumulatesHome(i)) DropDeviceCopy(i);
  }
  // This write-home, or one from an eviction still in flight.
  backend_->Synchronize(*home_written_[size_t(i)]);
  if (st.zero) {
    std::memset(HostCopy(i), 0, size_t(shard_bytes_));
    st.zero = false;
  }
  return HostCopy(i);
}

float* ChunkManager::HostWrite(ChunkKey key) {
  HostRead(key);
  const int32_t i = Index(key);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0) {
    if (st.pins > 0) InternalError("host write to a chunk pinned on the device");
    DropDeviceCopy(i);
  }
  return HostCopy(i);
}

ChunkManager::CurrentCopy ChunkManager::Current(ChunkKey key) {
  const int32_t i = Index(key);
  const ChunkState& st = states_[size_t(i)];
  if (st.zero || AccumulatesHome(i)) return {HostRead(key), false};
  if (st.slot >= 0 && st.device_dirty) return {SlotData(st.slot), true};
  backend_->Synchronize(*home_written_[size_t(i)]);
  return {HostCopy(i), false};
}

const float* ChunkManager::Peek(ChunkKey key) {
  const CurrentCopy current = Current(key);
  if (current.on_device && !backend_->device_is_host_memory()) return HostRead(key);
  return current.data;
}

void ChunkManager::ZeroFill(StateKind kind) {
  for (int32_t c = 0; c < num_chunks_; ++c) {
    const int32_t i = Index({kind, c});
    ChunkState& st = states_[size_t(i)];
    if (st.pins > 0) InternalError("zero fill of a pinned chunk");
    if (st.slot >= 0) DropDeviceCopy(i);  // its contents are discarded, no copy home
    st.zero = true;
  }
}

void ChunkManager::Flush(StateKind kind) {
  // One rank's home copies need nothing: readers copy a dirty chunk home when
  // they need it (Peek reads the device copy in place).
  if (world_ == 1) return;
  for (int32_t c = 0; c < num_chunks_; ++c) HostRead({kind, c});
}

void ChunkManager::BeginStep() {
  moment_ = 0;
  step_moments_.clear();
}

void ChunkManager::EndStep() {
  if (!trace_valid_ || moment_ != int64_t(trace_.size())) AdoptTrace();
}

void ChunkManager::AdoptTrace() {
  trace_ = std::move(step_moments_);
  step_moments_.clear();
  uses_.assign(states_.size(), {});
  for (size_t m = 0; m < trace_.size(); ++m) {
    for (int32_t index : trace_[m]) uses_[size_t(index)].push_back(int32_t(m));
  }
  trace_valid_ = true;
  ++trace_recordings_;
}

}  // namespace pstar
