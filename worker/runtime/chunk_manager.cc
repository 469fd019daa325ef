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

int64_t ChunkManager::StagingBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  // Half a chunk per copy direction.
  return options.grad_home.has_value() ? 2 * RoundUp(SlotBytes(chunk_bytes) / 2) : 0;
}

namespace {

// With 16-bit params: a param copy's slot, and what each pool must hold at
// least (the chunks one moment pins).
int64_t HalfSlotBytes(int64_t chunk_bytes) { return RoundUp(ChunkManager::SlotBytes(chunk_bytes) / 2); }
int64_t MinParamChunks(const ChunkRuntimeOptions& o) {
  return o.min_param_chunks_per_moment > 0 ? o.min_param_chunks_per_moment : o.min_chunks_per_moment;
}
int64_t MinGradChunks(const ChunkRuntimeOptions& o) {
  return o.min_grad_chunks_per_moment > 0 ? o.min_grad_chunks_per_moment : o.min_chunks_per_moment;
}

}  // namespace

namespace {

// Params narrowed on the host go up in pieces of at most this many bytes, two
// pinned buffers in turn: one is filled while the other's copy runs.
constexpr int64_t kParamStagingPiece = int64_t{16} << 20;

}  // namespace

int64_t ChunkManager::ParamStagingBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options,
                                        bool device_is_host) {
  if (!options.param_device.has_value() || device_is_host) return 0;
  return 2 * std::min(RoundUp(shard_bytes / 2), kParamStagingPiece);
}

int64_t ChunkManager::DeviceCapacity(int32_t num_chunks, int64_t chunk_bytes,
                                     const ChunkRuntimeOptions& options) {
  const int64_t n = num_chunks, slot = SlotBytes(chunk_bytes);
  const int64_t chunks = options.param_device.has_value()
                             ? n * HalfSlotBytes(chunk_bytes) + n * slot + (options.hybrid_adam ? 3 * n * slot : 0)
                             : DeviceKinds(options) * n * slot;
  const int64_t everything = RoundUp(options.non_model_bytes) + StagingBytes(chunk_bytes, options) + chunks;
  // More than everything would be memory nothing uses: the tier is never larger.
  if (options.device_capacity_bytes > 0) return std::min(options.device_capacity_bytes, everything);
  return everything;
}

int64_t ChunkManager::DeviceSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t room = DeviceCapacity(num_chunks, chunk_bytes, options) - RoundUp(options.non_model_bytes) -
                       StagingBytes(chunk_bytes, options);
  if (room <= 0) return 0;
  return std::min(room / SlotBytes(chunk_bytes), DeviceKinds(options) * num_chunks);
}

int64_t ChunkManager::StreamingReserve(int32_t num_chunks, const ChunkRuntimeOptions& options) {
  // The chunks one moment pins, for this moment and each one prefetched
  // ahead of it; never more than every param and grad chunk.
  const int64_t working = int64_t(options.min_chunks_per_moment) * (1 + std::max(0, options.prefetch_depth));
  return std::min<int64_t>(working, 2 * int64_t(num_chunks));
}

int32_t ChunkManager::DeviceAdamChunks(int32_t num_chunks, int64_t slots, const ChunkRuntimeOptions& options) {
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

ChunkManager::TierSlots ChunkManager::LayOutSlots(int32_t num_chunks, int64_t chunk_bytes,
                                                  const ChunkRuntimeOptions& options) {
  TierSlots t;
  if (!options.param_device.has_value()) {
    const int64_t slots = DeviceSlots(num_chunks, chunk_bytes, options);
    t.device_adam_chunks = DeviceAdamChunks(num_chunks, slots, options);
    t.full = slots - 2 * int64_t(t.device_adam_chunks);
    return t;
  }
  const int64_t n = num_chunks, full = SlotBytes(chunk_bytes), half = HalfSlotBytes(chunk_bytes);
  int64_t room = DeviceCapacity(num_chunks, chunk_bytes, options) - RoundUp(options.non_model_bytes) -
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

int64_t ChunkManager::HostHomeBytes(int32_t num_chunks, int64_t shard_bytes, int32_t device_adam_chunks,
                                    const ChunkRuntimeOptions& options) {
  const int64_t n = num_chunks, homed = device_adam_chunks;
  const int64_t grads = RoundUp(n * (options.grad_home.has_value() ? shard_bytes / 2 : shard_bytes));
  // fp32 param homes (the masters with 16-bit params, less those on the device).
  const int64_t params = options.param_device.has_value() ? n - homed : n;
  return (params + 2 * (n - homed)) * shard_bytes + grads;
}

int64_t ChunkManager::MinDeviceBytes(int64_t chunk_bytes, const ChunkRuntimeOptions& options) {
  const int64_t chunks = options.param_device.has_value()
                             ? MinParamChunks(options) * HalfSlotBytes(chunk_bytes) +
                                   MinGradChunks(options) * SlotBytes(chunk_bytes)
                             : int64_t(options.min_chunks_per_moment) * SlotBytes(chunk_bytes);
  return RoundUp(options.non_model_bytes) + StagingBytes(chunk_bytes, options) + chunks;
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
  if (world > 1 && options.param_device.has_value() && (stride / 2) % (kAlign * world) != 0) {
    return Status::InvalidArgument("chunk of " + std::to_string(chunk_bytes) +
                                   " bytes cannot be split into aligned 16-bit shards (needs a multiple of " +
                                   std::to_string(2 * kAlign * world) + " bytes)");
  }
  if (world > 1 && options.grad_home.has_value()) {
    return Status::InvalidArgument("16-bit gradient homes need one rank (several reduce their gradients in fp32)");
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
        (options.grad_home.has_value()
             ? FormatBytes(StagingBytes(chunk_bytes, options)) + " staging for 16-bit gradient copies + "
             : std::string()) +
        (options.param_device.has_value()
             ? std::to_string(MinParamChunks(options)) + " 16-bit param chunks of " +
                   FormatBytes(HalfSlotBytes(chunk_bytes)) + " and " + std::to_string(MinGradChunks(options)) +
                   " chunks of " + FormatBytes(stride)
             : std::to_string(options.min_chunks_per_moment) + " chunks of " + FormatBytes(stride)) +
        " in use at once), available " + std::to_string(capacity) + " bytes (" + FormatBytes(capacity) +
        ")");
  }
  auto m = std::unique_ptr<ChunkManager>(new ChunkManager(num_chunks, stride, std::move(backend), options, comm));
  m->device_capacity_ = capacity;
  m->non_model_bytes_ = non_model;
  m->staging_offset_ = non_model;
  m->slots_offset_ = non_model + StagingBytes(chunk_bytes, options);
  // With N ranks every update runs on the host shards (device Adam would need
  // the device to hold shards, not gathered chunks).
  ChunkRuntimeOptions laid = options;
  if (world > 1) laid.hybrid_adam = false;
  const TierSlots tier = LayOutSlots(num_chunks, chunk_bytes, laid);
  const int32_t homed = tier.device_adam_chunks;
  const int64_t half_stride = options.param_device.has_value() ? HalfSlotBytes(chunk_bytes) : 0;
  m->device_adam_chunks_ = homed;
  m->pools_.push_back({m->slots_offset_, stride, 0, int32_t(tier.full), {}});
  if (options.param_device.has_value()) {
    m->pools_.push_back({m->slots_offset_ + tier.full * stride, half_stride, int32_t(tier.full),
                         int32_t(tier.half), {}});
  }
  const int64_t streaming = tier.full + tier.half;
  m->homes_offset_ = m->slots_offset_ + tier.full * stride + tier.half * half_stride;
  const int64_t homed_bytes = HomedKinds(options) * int64_t(homed) * stride;
  PSTAR_ASSIGN_OR_RETURN(m->device_block_, m->backend_->AllocateDevice(size_t(m->homes_offset_ + homed_bytes)));
  PSTAR_ASSIGN_OR_RETURN(m->host_block_, m->backend_->AllocateHost(size_t(
                                             HostHomeBytes(num_chunks, m->shard_bytes_, homed, options))));
  if (options.grad_home.has_value()) m->widen_buffer_.resize(size_t(m->shard_bytes_) / sizeof(float));
  if (const int64_t bytes = ParamStagingBytes(m->shard_bytes_, options, m->backend_->device_is_host_memory());
      bytes > 0) {
    PSTAR_ASSIGN_OR_RETURN(m->param_staging_, m->backend_->AllocateHost(size_t(bytes)));
    for (auto& e : m->param_staged_) e = m->backend_->CreateEvent();
  }
  if (world > 1) {
    PSTAR_ASSIGN_OR_RETURN(m->scratch_, m->backend_->AllocateHost(size_t(m->shard_bytes_)));
  }
  m->states_.assign(size_t(total_chunks), ChunkState{});
  for (int32_t i = num_chunks; i < total_chunks; ++i) m->states_[size_t(i)].zero = true;  // grads, moments
  m->slot_owner_.assign(size_t(streaming), -1);
  for (int64_t s = 0; s < streaming; ++s) {
    m->slot_events_.push_back({m->backend_->CreateEvent(), m->backend_->CreateEvent(), m->backend_->CreateEvent()});
  }
  for (SlotPool& pool : m->pools_) {
    for (int32_t s = pool.first + pool.count - 1; s >= pool.first; --s) pool.free.push_back(s);
  }
  for (int64_t i = 0; i < total_chunks; ++i) m->home_written_.push_back(m->backend_->CreateEvent());
  m->compute_done_ = m->backend_->CreateEvent();
  // Device-homed moments start at zero, like every moment (masters are
  // written before use, as host param homes are).
  if (homed > 0) {
    m->backend_->Zero(m->device_block_.data() + m->homes_offset_, size_t(homed_bytes), StreamKind::kCompute);
    for (int32_t i = 2 * num_chunks; i < total_chunks; ++i) {
      if (m->DeviceHomed(i)) m->states_[size_t(i)].zero = false;
    }
  }
  m->peak_device_bytes_ = m->device_bytes_in_use();

  RuntimeCounters& c = m->counters_;
  for (int k = 0; k < kNumStateKinds; ++k) {
    const int32_t on_device = m->DeviceHomed(k * num_chunks) ? homed : 0;
    c.resident_bytes[int(Tier::kHost)][size_t(k)] =
        int64_t(num_chunks - on_device) * m->HomeBytes(k * num_chunks);
    c.resident_chunks[int(Tier::kHost)][size_t(k)] = num_chunks - on_device;
    c.resident_bytes[int(Tier::kDevice)][size_t(k)] = int64_t(on_device) * stride;
    c.resident_chunks[int(Tier::kDevice)][size_t(k)] = on_device;
  }
  c.non_model_bytes[int(Tier::kDevice)] = non_model;
  c.device_capacity_bytes = capacity;
  c.chunk_budget_bytes = m->homes_offset_ + homed_bytes - m->slots_offset_;
  return m;
}

std::byte* ChunkManager::Home(int32_t index) const {
  // Params, grads (at half size when 16-bit), then each moment kind without
  // its device-homed chunks.
  // Masters homed on the device (16-bit params) have no host param home.
  const int64_t n = num_chunks_, chunk = index % num_chunks_;
  const int64_t grad_bytes = HomeBytes(int32_t(n));
  if (DeviceHomed(index)) InternalError("host copy of a chunk homed on the device");
  const int64_t first_param = half_params() ? device_adam_chunks_ : 0;
  const int64_t params = (n - first_param) * shard_bytes_;
  if (index < n) return host_block_.data() + (chunk - first_param) * shard_bytes_;
  if (index < 2 * n) return host_block_.data() + params + chunk * grad_bytes;
  const int64_t kind = index / n - 2;
  const int64_t slot = kind * (n - device_adam_chunks_) + (chunk - device_adam_chunks_);
  // The moments start on a cache line (16-bit gradients may end mid-line).
  return host_block_.data() + params + RoundUp(n * grad_bytes) + slot * shard_bytes_;
}

float* ChunkManager::HostCopy(int32_t index) const {
  if (HalfHomed(index)) InternalError("fp32 host copy of a chunk homed in 16 bits");
  return reinterpret_cast<float*>(Home(index));
}

uint16_t* ChunkManager::HalfHome(int32_t index) const { return reinterpret_cast<uint16_t*>(Home(index)); }

float* ChunkManager::HomeOnDevice(int32_t index) const {
  // exp_avg, exp_avg_sq, then (16-bit params) the masters.
  const int64_t kind = index < num_chunks_ ? 2 : index / num_chunks_ - 2, chunk = index % num_chunks_;
  return reinterpret_cast<float*>(device_block_.data() + homes_offset_ +
                                  (kind * device_adam_chunks_ + chunk) * chunk_bytes_);
}

float* ChunkManager::DeviceHome(ChunkKey key) {
  FlushHostWindow();
  if (!DeviceHomed(key)) InternalError("device home of a chunk homed on the host");
  const int32_t i = Index(key);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0) {
    if (st.pins > 0) InternalError("device home of a param chunk an op is reading");
    DropDeviceCopy(i);
  }
  return HomeOnDevice(i);
}

float* ChunkManager::HostReadableHome(int32_t index) {
  if (backend_->device_is_host_memory()) return HomeOnDevice(index);  // ops complete when issued
  if (peek_buffer_.data() == nullptr) {
    auto block = backend_->AllocateHost(size_t(chunk_bytes_));
    if (!block.ok()) InternalError("host buffer for reading a device-homed chunk: " + block.status().message());
    peek_buffer_ = std::move(block).value();
  }
  SynchronizeCompute();
  backend_->Copy(peek_buffer_.data(), HomeOnDevice(index), size_t(chunk_bytes_), StreamKind::kDeviceToHost);
  backend_->Record(*compute_done_, StreamKind::kDeviceToHost);
  backend_->Synchronize(*compute_done_);
  return reinterpret_cast<float*>(peek_buffer_.data());
}

void ChunkManager::SynchronizeCompute() {
  FlushHostWindow();
  backend_->Record(*compute_done_, StreamKind::kCompute);
  backend_->Synchronize(*compute_done_);
}

float* ChunkManager::SlotData(int32_t slot) const {
  const SlotPool& pool = PoolOfSlot(slot);
  return reinterpret_cast<float*>(device_block_.data() + pool.offset + int64_t(slot - pool.first) * pool.stride);
}

void ChunkManager::CountMoved(int32_t index, Direction direction, int64_t bytes) {
  counters_.moved_bytes[int(direction)] += bytes;
  counters_.moved_kind_bytes[int(direction)][size_t(KeyOf(index).kind)] += bytes;
}

void ChunkManager::UpdateResidency(int32_t index, Tier tier, int sign) {
  const size_t kind = size_t(KeyOf(index).kind);
  const int64_t device_bytes = HalfParam(index) ? pools_.back().stride : chunk_bytes_;
  const int64_t delta = sign * (tier == Tier::kHost ? HomeBytes(index) : device_bytes);
  counters_.resident_bytes[int(tier)][kind] += delta;
  step_residency_.OnResidencyChange(tier, delta);
  counters_.resident_chunks[int(tier)][kind] += sign;
}

void ChunkManager::Access(std::span<const ChunkAccess> accesses) {
  FlushHostWindow();
  ++tick_;
  // The chunks that stream through slots; device-homed ones are always there
  // and stay out of the trace.
  std::vector<int32_t> moment;
  moment.reserve(accesses.size());
  for (size_t k = 0; k < accesses.size(); ++k) {
    const int32_t i = Index(accesses[k].key);
    for (size_t j = 0; j < k; ++j) {
      if (Index(accesses[j].key) == i) InternalError("chunk listed twice in one moment");
    }
    if (HalfParam(i) && accesses[k].writes) InternalError("a 16-bit param copy is read-only on the device");
    if (!Streams(i)) {
      ++states_[size_t(i)].pins;
      continue;
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
  for (const ChunkAccess& a : accesses) {
    const int32_t i = Index(a.key);
    if (!Streams(i)) continue;
    ChunkState& st = states_[size_t(i)];
    if (st.slot < 0) {
      if (!Load(i, /*prefetch=*/false, /*must_outlive=*/0)) {
        int32_t pinned = 0;
        for (int32_t owner : slot_owner_) pinned += owner >= 0 && states_[size_t(owner)].pins > 0;
        InternalError("no device slot for chunk " + std::to_string(a.key.chunk) + " (" +
                      StateKindName(a.key.kind) + "): " + std::to_string(pinned) + " of " +
                      std::to_string(streaming_slots()) + " slots pinned");
      }
      ++st.pins;
    }
    if (a.writes) st.device_dirty = true;
    st.last_use = tick_;
  }
  // Compute reads the chunks only after their copies landed, and writes one
  // only after any copy home of its earlier contents read them.
  for (const ChunkAccess& a : accesses) {
    if (!Streams(Index(a.key))) continue;
    const SlotEvents& ev = slot_events_[size_t(state(a.key).slot)];
    backend_->StreamWait(StreamKind::kCompute, *ev.loaded);
    if (a.writes) backend_->StreamWait(StreamKind::kCompute, *ev.copied_out);
  }

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
    if (!Streams(Index(a.key))) continue;  // read by the host only after SynchronizeCompute
    // The slot may be copied out or reused only after the op's work on it.
    backend_->Record(*slot_events_[size_t(st.slot)].computed, StreamKind::kCompute);
  }
}

float* ChunkManager::DeviceData(ChunkKey key) const {
  const ChunkState& st = state(key);
  const int32_t i = Index(key);
  if (HalfParam(i)) InternalError("fp32 device data of a 16-bit param copy");
  if (st.pins <= 0 || (st.slot < 0 && !DeviceHomed(key))) InternalError("device data of a chunk that is not pinned");
  return DeviceHomed(key) ? HomeOnDevice(i) : SlotData(st.slot);
}

const uint16_t* ChunkManager::HalfParamData(int32_t chunk) const {
  const ChunkState& st = state({StateKind::kParam, chunk});
  if (!half_params()) InternalError("16-bit device data of an fp32 param");
  if (st.pins <= 0 || st.slot < 0) InternalError("device data of a chunk that is not pinned");
  return reinterpret_cast<const uint16_t*>(SlotData(st.slot));
}

float* ChunkManager::DeviceMasterForUpdate(int32_t chunk) {
  FlushHostWindow();
  const int32_t i = Index({StateKind::kParam, chunk});
  if (!half_params() || !DeviceHomed(i)) InternalError("device master of a chunk homed on the host");
  ChunkState& st = states_[size_t(i)];
  if (st.pins > 0) InternalError("update of a param chunk an op is reading");
  if (st.slot >= 0) DropDeviceCopy(i);  // stale once the master moves
  return HomeOnDevice(i);
}

ChunkManager::~ChunkManager() { FlushHostWindow(); }

void ChunkManager::FlushHostWindow() {
  if (host_window_index_ < 0) return;
  const int32_t i = std::exchange(host_window_index_, -1);
  backend_->Copy(HomeOnDevice(i), peek_buffer_.data(), size_t(chunk_bytes_), StreamKind::kHostToDevice);
  backend_->Record(*compute_done_, StreamKind::kHostToDevice);
  backend_->Synchronize(*compute_done_);
}

void ChunkManager::LoadHalfParam(int32_t index, int32_t slot) {
  const HalfFormat format = *options_.param_device;
  uint16_t* dst = reinterpret_cast<uint16_t*>(SlotData(slot));
  const int64_t n = chunk_bytes_ / int64_t(sizeof(float));
  NvtxRange range("h2d");
  if (DeviceHomed(index)) {
    // The master is on the device: narrowed there after the ops before it
    // (the optimizer's update), nothing crosses the bus.
    backend_->Record(*compute_done_, StreamKind::kCompute);
    backend_->StreamWait(StreamKind::kHostToDevice, *compute_done_);
    backend_->Narrow(dst, HomeOnDevice(index), n, format, StreamKind::kHostToDevice);
    return;
  }
  // The master is on the host: narrowed there (into the slot where the device
  // is host memory, else into a pinned buffer copied up), half its bytes moved.
  const int64_t shard = shard_bytes_ / int64_t(sizeof(float));
  uint16_t* own = dst + int64_t(rank_) * shard;
  const int64_t move = BeginMove(Direction::kHostToDevice);
  if (backend_->device_is_host_memory()) {
    NarrowToHalf(own, HostCopy(index), shard, format);
  } else {
    // Piece by piece through the two buffers: narrowing one piece overlaps
    // the copy of the one before.
    const int64_t piece = int64_t(param_staging_.bytes() / 2) / int64_t(sizeof(uint16_t));
    const float* master = HostCopy(index);
    for (int64_t first = 0; first < shard; first += piece) {
      const int64_t n = std::min(piece, shard - first);
      const int b = std::exchange(param_staging_next_, 1 - param_staging_next_);
      uint16_t* staged = reinterpret_cast<uint16_t*>(param_staging_.data() + b * (param_staging_.bytes() / 2));
      backend_->Synchronize(*param_staged_[b]);  // its last copy up has read it
      NarrowToHalf(staged, master + first, n, format);
      backend_->Copy(own + first, staged, size_t(n) * sizeof(uint16_t), StreamKind::kHostToDevice);
      backend_->Record(*param_staged_[b], StreamKind::kHostToDevice);
    }
  }
  if (world_ > 1) {
    // Every rank narrowed its own shard into place; the gather fills the rest
    // (16-bit pairs travel as floats, bit for bit).
    if (!backend_->device_is_host_memory()) backend_->Synchronize(*param_staged_[1 - param_staging_next_]);
    backend_->Synchronize(*slot_events_[size_t(slot)].computed);
    NvtxRange gather("all_gather");
    CheckCollective(comm_->AllGather(reinterpret_cast<const float*>(own), reinterpret_cast<float*>(dst), shard / 2));
  }
  EndMove(move, Direction::kHostToDevice, shard_bytes_ / 2);
  ++counters_.moves[int(Direction::kHostToDevice)];
  CountMoved(index, Direction::kHostToDevice, shard_bytes_ / 2);
}

bool ChunkManager::Load(int32_t index, bool prefetch, int64_t must_outlive) {
  const int32_t slot = TakeSlot(PoolOf(index), must_outlive);
  if (slot < 0) return false;
  ChunkState& st = states_[size_t(index)];
  SlotEvents& ev = slot_events_[size_t(slot)];
  st.slot = slot;
  slot_owner_[size_t(slot)] = index;
  streaming_bytes_in_use_ += SlotStride(slot);
  // The slot's previous contents must be read by compute and copied home first.
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.computed);
  backend_->StreamWait(StreamKind::kHostToDevice, *ev.copied_out);
  if (HalfParam(index)) {
    LoadHalfParam(index, slot);
    st.device_dirty = false;
  } else if (AccumulatesHome(index)) {
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
      backend_->Record(*ev.loaded, StreamKind::kHostToDevice);
      backend_->Synchronize(*ev.loaded);
      backend_->Synchronize(*ev.computed);
      {
        NvtxRange gather("all_gather");
        CheckCollective(comm_->AllGather(own, SlotData(slot), n));
      }
      EndMove(move, Direction::kHostToDevice, shard_bytes_);
    } else {
      backend_->Synchronize(*ev.computed);
      backend_->Synchronize(*ev.copied_out);
      const int64_t move = BeginMove(Direction::kHostToDevice);
      {
        NvtxRange gather("all_gather");
        CheckCollective(comm_->AllGather(HostCopy(index), SlotData(slot), n));
      }
      EndMove(move, Direction::kHostToDevice, shard_bytes_);
    }
    st.device_dirty = false;
    ++counters_.moves[int(Direction::kHostToDevice)];
    CountMoved(index, Direction::kHostToDevice, shard_bytes_);
  } else {
    backend_->StreamWait(StreamKind::kHostToDevice, *home_written_[size_t(index)]);
    NvtxRange range("h2d");
    const int64_t move = BeginMove(Direction::kHostToDevice);
    const int64_t bytes = HomeBytes(index);
    if (HalfHomed(index)) {
      backend_->CopyWidened(SlotData(slot), HalfHome(index), chunk_bytes_ / int64_t(sizeof(float)),
                            *options_.grad_home, device_block_.data() + staging_offset_, StreamKind::kHostToDevice);
    } else {
      backend_->Copy(SlotData(slot), HostCopy(index), size_t(chunk_bytes_), StreamKind::kHostToDevice);
    }
    EndMove(move, Direction::kHostToDevice, bytes);
    st.device_dirty = false;
    ++counters_.moves[int(Direction::kHostToDevice)];
    CountMoved(index, Direction::kHostToDevice, bytes);
  }
  backend_->Record(*ev.loaded, StreamKind::kHostToDevice);
  st.prefetched = prefetch;
  if (prefetch) ++counters_.prefetches;
  UpdateResidency(index, Tier::kDevice, +1);
  const int64_t in_use = device_bytes_in_use();
  if (in_use > device_capacity_) InternalError("device tier over budget");
  peak_device_bytes_ = std::max(peak_device_bytes_, in_use);
  return true;
}

int32_t ChunkManager::TakeSlot(int pool, int64_t must_outlive) {
  std::vector<int32_t>& free = pools_[size_t(pool)].free;
  if (!free.empty()) {
    int32_t slot = free.back();
    free.pop_back();
    return slot;
  }
  const int32_t victim = ChooseVictim(pool, must_outlive);
  if (victim < 0) return -1;
  const int32_t slot = states_[size_t(victim)].slot;
  Evict(victim);
  free.pop_back();  // Evict returned `slot` to the top of the stack
  return slot;
}

int32_t ChunkManager::ChooseVictim(int pool, int64_t must_outlive) const {
  const bool opt = options_.eviction == EvictionPolicy::kOpt && trace_valid_;
  if (must_outlive > 0 && !opt) return -1;  // prefetch never evicts blindly
  int32_t best = -1;
  int64_t best_score = 0;
  bool best_dirty = true;
  const SlotPool& p = pools_[size_t(pool)];
  for (int32_t s = p.first; s < p.first + p.count; ++s) {
    const int32_t owner = slot_owner_[size_t(s)];
    if (owner < 0) continue;
    const ChunkState& st = states_[size_t(owner)];
    if (st.pins > 0) continue;
    // Between steps the dirty copies are gradients the next step zeroes:
    // writing them home for a prefetch would copy dead data.
    if (clean_victims_only_ && st.device_dirty) continue;
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
  backend_->StreamWait(StreamKind::kDeviceToHost, *ev.loaded);    // and a fill or load into the slot
  NvtxRange range("d2h");
  const int64_t move = BeginMove(Direction::kDeviceToHost);
  if (AccumulatesHome(index)) {
    // home += this step's partials of every rank, reduced; the device copy is
    // then spent (it is in the home sum) and must be dropped by the caller.
    const int64_t n = shard_bytes_ / int64_t(sizeof(float));
    backend_->Synchronize(*ev.computed);  // the collective reads the slot on this thread
    backend_->Synchronize(*ev.loaded);
    if (comm_->device_buffers()) {
      // NCCL writes GPU memory: reduce into this rank's place in the slot,
      // then copy that part down.
      float* own = SlotData(st.slot) + int64_t(rank_) * n;
      {
        NvtxRange scatter("reduce_scatter");
        CheckCollective(comm_->ReduceScatter(SlotData(st.slot), own, n));
      }
      backend_->Copy(Scratch(), own, size_t(shard_bytes_), StreamKind::kDeviceToHost);
      backend_->Record(*ev.copied_out, StreamKind::kDeviceToHost);
      backend_->Synchronize(*ev.copied_out);
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
    CountMoved(index, Direction::kDeviceToHost, shard_bytes_);
    EndMove(move, Direction::kDeviceToHost, shard_bytes_);
  } else if (world_ > 1 || HalfParam(index)) {
    InternalError("a sharded chunk other than a gradient, or a 16-bit param copy, was written on the device");
  } else {
    const int64_t bytes = HomeBytes(index);
    if (HalfHomed(index)) {
      backend_->CopyNarrowed(HalfHome(index), SlotData(st.slot), chunk_bytes_ / int64_t(sizeof(float)),
                             *options_.grad_home, device_block_.data() + staging_offset_ + StagingBytes(chunk_bytes_, options_) / 2,
                             StreamKind::kDeviceToHost);
    } else {
      backend_->Copy(HostCopy(index), SlotData(st.slot), size_t(chunk_bytes_), StreamKind::kDeviceToHost);
    }
    backend_->Record(*home_written_[size_t(index)], StreamKind::kDeviceToHost);
    CountMoved(index, Direction::kDeviceToHost, bytes);
    EndMove(move, Direction::kDeviceToHost, bytes);
  }
  backend_->Record(*ev.copied_out, StreamKind::kDeviceToHost);
  st.device_dirty = false;
  ++counters_.moves[int(Direction::kDeviceToHost)];
}

void ChunkManager::DropDeviceCopy(int32_t index) {
  ChunkState& st = states_[size_t(index)];
  slot_owner_[size_t(st.slot)] = -1;
  streaming_bytes_in_use_ -= SlotStride(st.slot);
  pools_[size_t(PoolOf(index))].free.push_back(st.slot);
  st.slot = -1;
  st.device_dirty = false;
  st.prefetched = false;
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

void ChunkManager::MakeHomeCurrent(int32_t i) {
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0 && st.device_dirty) {
    if (st.pins > 0) InternalError("host read of a chunk an op is writing on the device");
    WriteHome(i);
    if (AccumulatesHome(i)) DropDeviceCopy(i);
  }
  // This write-home, or one from an eviction still in flight.
  backend_->Synchronize(*home_written_[size_t(i)]);
  if (st.zero) {
    std::memset(Home(i), 0, size_t(HomeBytes(i)));
    st.zero = false;
  }
}

const uint16_t* ChunkManager::HalfHostRead(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (!HalfHomed(i)) InternalError(std::string("16-bit read of a chunk homed in fp32 (") + StateKindName(key.kind) + ")");
  MakeHomeCurrent(i);
  return HalfHome(i);
}

const float* ChunkManager::HostRead(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (DeviceHomed(i)) return HostReadableHome(i);
  MakeHomeCurrent(i);
  if (HalfHomed(i)) {
    // Widened into the one-shard buffer, exactly (the values are 16-bit ones).
    WidenFromHalf(widen_buffer_.data(), HalfHome(i), shard_bytes_ / int64_t(sizeof(float)), *options_.grad_home);
    return widen_buffer_.data();
  }
  return HostCopy(i);
}

float* ChunkManager::HostWrite(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (DeviceHomed(i)) {
    ChunkState& st = states_[size_t(i)];
    if (st.pins > 0) InternalError("host write to a chunk pinned on the device");
    if (st.slot >= 0) DropDeviceCopy(i);  // a 16-bit param copy, stale once the master is written
    if (backend_->device_is_host_memory()) return HomeOnDevice(i);
    // On a GPU the host writes a copy, put back at the next call into the manager.
    float* window = HostReadableHome(i);
    host_window_index_ = i;
    return window;
  }
  if (HalfHomed(i)) InternalError(std::string("host write to a chunk homed in 16 bits (") + StateKindName(key.kind) + ")");
  HostRead(key);
  ChunkState& st = states_[size_t(i)];
  if (st.slot >= 0) {
    if (st.pins > 0) InternalError("host write to a chunk pinned on the device");
    DropDeviceCopy(i);
  }
  return HostCopy(i);
}

ChunkManager::CurrentCopy ChunkManager::Current(ChunkKey key) {
  FlushHostWindow();
  const int32_t i = Index(key);
  if (DeviceHomed(i)) return {HomeOnDevice(i), true};
  const ChunkState& st = states_[size_t(i)];
  // A 16-bit param copy is not the param: its master is.
  if (st.zero || AccumulatesHome(i) || HalfParam(i)) return {HostRead(key), false};
  // With one rank a device copy is current, dirty or not (a clean one may
  // still be on its way home: reading it in place does not wait for that
  // copy). With N ranks the device holds whole chunks, the home this rank's
  // shard, which is what callers index.
  if (world_ == 1 && st.slot >= 0) {
    // A prefetched copy may still be on its way in: device readers wait for it.
    backend_->StreamWait(StreamKind::kCompute, *slot_events_[size_t(st.slot)].loaded);
    return {SlotData(st.slot), true};
  }
  if (HalfHomed(i)) return {HostRead(key), false};  // widened for the host
  backend_->Synchronize(*home_written_[size_t(i)]);
  return {HostCopy(i), false};
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
    if (st.pins > 0) InternalError("zero fill of a pinned chunk");
    if (DeviceHomed(i)) {
      backend_->Zero(HomeOnDevice(i), size_t(chunk_bytes_), StreamKind::kCompute);
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
    for (int32_t c = 0; c < num_chunks_; ++c) HostRead({kind, c});
    return;
  }
  for (int32_t c = device_adam_chunks_; c < num_chunks_; ++c) {
    const int32_t i = Index({kind, c});
    const ChunkState& st = states_[size_t(i)];
    if (DeviceHomed(i) || st.slot < 0 || !st.device_dirty) continue;
    if (st.pins > 0) InternalError("flush of a chunk pinned on the device");
    WriteHome(i);
  }
}

void ChunkManager::BeginStep() {
  moment_ = 0;
  step_moments_.clear();
  step_residency_.BeginStep(counters_);
}

void ChunkManager::EndStep() {
  FlushHostWindow();
  if (!trace_valid_ || moment_ != int64_t(trace_.size())) AdoptTrace();
  PrefetchStepStart();
  step_residency_.EndStep(&counters_);
}

void ChunkManager::PrefetchStepStart() {
  if (options_.prefetch_depth <= 0 || !trace_valid_) return;
  // Distances count from just before the next step's first moment.
  moment_ = -1;
  clean_victims_only_ = true;
  const int64_t moments = int64_t(trace_.size());
  bool room = true;
  for (int64_t j = 0; room && j < options_.prefetch_depth && j < moments; ++j) {
    for (int32_t index : trace_[size_t(j)]) {
      // Gradients start every step as zeros (a fill, not a copy); with N ranks
      // they also start from zeros on the device.
      if (KeyOf(index).kind == StateKind::kGrad || states_[size_t(index)].slot >= 0) continue;
      room = Load(index, /*prefetch=*/true, /*must_outlive=*/j + 1);
      if (!room) break;
    }
  }
  moment_ = 0;
  clean_victims_only_ = false;
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
