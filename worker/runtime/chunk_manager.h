// ChunkManager: where every chunk of every kind lives, and what moves between
// the host tier (the home copy of every chunk) and the device tier (a fixed
// pool of chunk-sized slots after the non-model region).
//
// Each Access is one *moment*: its chunks are made resident and pinned until
// Release. The first step records the sequence of moments (the trace); later
// steps evict the resident chunk whose next use is farthest away (Belady/OPT)
// and prefetch the chunks of the next moments into free or farther-needed
// slots. Without a valid trace (warm-up, or after the sequence changed) the
// least recently used chunk is evicted and nothing is prefetched. Clean device
// copies are dropped without a copy; dirty ones are written home first.
//
// With one rank and the hybrid Adam placement, the optimizer moments of the
// first DeviceAdamChunks chunks are homed on the device instead: they live in
// fixed slots at the end of the tier for the whole run, never move, and take
// no host memory. That is what lets a model larger than the host alone could
// home train (the moments are half of all model data).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/runtime_counters.h"
#include "worker/runtime/step_residency.h"

namespace pstar {

enum class EvictionPolicy { kOpt, kLru };
const char* EvictionPolicyName(EvictionPolicy policy);

struct ChunkKey {
  StateKind kind;
  int32_t chunk;
};

// One chunk a moment needs, and whether the moment writes it.
struct ChunkAccess {
  ChunkKey key;
  bool writes = false;
};

// Watches the copies between the tiers (the training profiler). BeginMove is
// called just before a copy of `direction` is issued on its copy stream (with
// N ranks: before the copy and collective that make up the move), EndMove
// just after, with the token BeginMove returned and the bytes this rank moved.
class MoveObserver {
 public:
  virtual ~MoveObserver() = default;
  virtual int64_t BeginMove(Direction direction) = 0;
  virtual void EndMove(int64_t token, Direction direction, int64_t bytes) = 0;
};

struct ChunkRuntimeOptions {
  // The whole device tier; 0 = exactly the non-model bytes plus every chunk of
  // every kind (the tier is never made larger than that).
  int64_t device_capacity_bytes = 0;
  // Activations and workspaces, carved at the start of the device block.
  int64_t non_model_bytes = 0;
  // The most chunks one moment pins; the budget must hold at least this many.
  int32_t min_chunks_per_moment = 1;
  EvictionPolicy eviction = EvictionPolicy::kOpt;
  // Moments of lookahead for prefetch; 0 = off.
  int32_t prefetch_depth = 2;
  // Home the optimizer moments of some chunks on the device, in the room the
  // tier has beyond the slots params and grads stream through; this fraction
  // of that room is used (all of it when the tier holds every chunk). Off (as
  // the planner sets it for N > 1 ranks), the moments never reach the device
  // and the tier keeps no room for them.
  bool hybrid_adam = true;
  double margin_use_ratio = 0.8;
  // Gradients homed on the host in 16 bits of this format instead of fp32
  // (one rank only). Their device copies stay fp32; every value must already
  // be one the format holds (the model rounds gradients after each op), so
  // the narrowing copies home and the widening ones back are exact. The
  // device tier keeps a staging area of one chunk for the conversions.
  std::optional<HalfFormat> grad_home;
  // Params stream to the device in 16 bits of this format (bf16 and fp16
  // runs). Their homes hold the fp32 master, which the optimizer updates and
  // checkpoints save, narrowed on its way to the device: half the bytes
  // cross the bus and a device copy takes a half-size slot (a pool of its
  // own). Device param copies are read-only. A chunk whose Adam runs on the
  // device (hybrid Adam) homes its master there too, beside its moments, and
  // its param copy is narrowed on the device.
  std::optional<HalfFormat> param_device;
  // With param_device: the most param chunks, and grad chunks, one moment
  // pins (what each pool must hold); 0 = min_chunks_per_moment.
  int32_t min_param_chunks_per_moment = 0;
  int32_t min_grad_chunks_per_moment = 0;
};

class ChunkManager {
 public:
  // Fails, naming needed and available bytes, when the device budget cannot hold
  // the non-model bytes plus `min_chunks_per_moment` chunks.
  // `comm` (may be null for one rank) must outlive the manager; with N > 1
  // ranks chunk_bytes must be a multiple of 64 * N.
  static Result<std::unique_ptr<ChunkManager>> Create(int32_t num_chunks, int64_t chunk_bytes,
                                                      std::unique_ptr<DeviceBackend> backend,
                                                      const ChunkRuntimeOptions& options,
                                                      Communicator* comm = nullptr);
  // The arithmetic Create uses, shared with the planner: chunk slots are
  // 64-byte aligned; the device tier's capacity and its chunk slots (streaming
  // and homed together); the slots params and grads keep to stream through;
  // how many chunks' optimizer moments the hybrid placement homes on the
  // device (two slots each).
  static int64_t SlotBytes(int64_t chunk_bytes);
  // How the streaming room divides (what Create carves): chunk-sized slots,
  // half-size slots for 16-bit params (param_device only), and the chunks
  // whose Adam runs on the device (their moments, and with param_device their
  // masters, homed there: HomedKinds slots each).
  struct TierSlots {
    int64_t full = 0;
    int64_t half = 0;
    int32_t device_adam_chunks = 0;
  };
  static TierSlots LayOutSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  static int64_t HomedKinds(const ChunkRuntimeOptions& options) { return options.param_device.has_value() ? 3 : 2; }
  // Host staging for narrowing params on their way to a GPU (two half chunks
  // of pinned memory, with param_device; 0 where the device is host memory).
  static int64_t ParamStagingBytes(int64_t shard_bytes, const ChunkRuntimeOptions& options, bool device_is_host);
  static int64_t DeviceCapacity(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  static int64_t DeviceSlots(int32_t num_chunks, int64_t chunk_bytes, const ChunkRuntimeOptions& options);
  static int64_t StreamingReserve(int32_t num_chunks, const ChunkRuntimeOptions& options);
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

  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;
  ~ChunkManager();

  // The non-model region at the start of the device block.
  std::byte* non_model_memory() const { return device_block_.data(); }
  DeviceBackend& backend() { return *backend_; }

  // One moment: every chunk in `accesses` resident on the device and pinned.
  void Access(std::span<const ChunkAccess> accesses);
  void Release(std::span<const ChunkAccess> accesses);
  // Device copy of a pinned chunk (not a 16-bit param: ParamDeviceData).
  float* DeviceData(ChunkKey key) const;
  // A pinned param chunk's device copy in 16 bits (param_device only).
  const uint16_t* HalfParamData(int32_t chunk) const;
  // The fp32 master of a chunk whose Adam runs on the device, for its update
  // (param_device only; with fp32 params the update pins the param chunk).
  // Its 16-bit copy is dropped: the next use narrows the updated master.
  float* DeviceMasterForUpdate(int32_t chunk);
  bool half_params() const { return options_.param_device.has_value(); }

  // Whether the chunk's home is on the device (moments under hybrid Adam).
  bool DeviceHomed(ChunkKey key) const { return DeviceHomed(Index(key)); }
  // A device-homed chunk's only copy, at any time (checkpoints copy it
  // through the backend; on the CPU backend the host may also read it).
  // Callers may write it: a 16-bit param copy of it is dropped.
  float* DeviceHome(ChunkKey key);
  // Waits for every op queued on the compute stream, so that device-homed
  // chunks can be copied or read by the host.
  void SynchronizeCompute();

  // This rank's home shard (the whole chunk with one rank), made current (a
  // dirty device copy is copied, or reduce-scattered, home first). Not while
  // an op holds the chunk on the device. A device-homed chunk has no host
  // shard: on the CPU backend its device home is returned; on a GPU, a copy
  // in a one-chunk host buffer, valid until the next host read of a
  // device-homed chunk (HostWrite of one is a bug there: copy it in). A
  // gradient homed in 16 bits is returned widened into a one-shard buffer,
  // valid until the next host read of such a gradient.
  const float* HostRead(ChunkKey key);
  // As HostRead for a gradient homed in 16 bits: the home itself, unwidened
  // (the host Adam reads 16-bit gradients directly).
  const uint16_t* HalfHostRead(ChunkKey key);
  bool HalfHomed(ChunkKey key) const { return HalfHomed(Index(key)); }
  // As HostRead, and the device copy is dropped: the caller writes the host
  // copy. For a chunk homed in GPU memory that copy is a one-chunk host
  // window, written back into the home at the next call into the manager (or
  // its destruction): writes through the pointer after that call are lost.
  float* HostWrite(ChunkKey key);
  // The current copy wherever it is, without moving it (reads only). A device
  // pointer is valid only until the next Access may reuse its slot; on a
  // backend whose device memory the host cannot read, callers run a device
  // kernel on it instead.
  struct CurrentCopy {
    const float* data = nullptr;
    bool on_device = false;
  };
  CurrentCopy Current(ChunkKey key);
  // The current copy, readable by the host: Current's, unless that is in
  // device memory the host cannot read, which is copied home first.
  const float* Peek(ChunkKey key);

  // Every chunk of `kind` becomes zeros, lazily: no copy is made until it is used.
  void ZeroFill(StateKind kind);
  // With N ranks, makes every home shard of `kind` current by reduce-scattering
  // the gradients still on the device; all ranks call it at the same point.
  // With one rank, starts the copies home of the dirty device copies of
  // `kind` whose chunks update on the host, in chunk order and without
  // waiting (asynchronous on a GPU): the gradient norm and the host Adam of
  // one chunk then overlap the copies of the next. The device copies stay,
  // clean.
  void Flush(StateKind kind);

  // Whether chunk `chunk`'s optimizer update runs on the device (hybrid Adam).
  bool DeviceAdam(int32_t chunk) const { return chunk < device_adam_chunks_; }
  int32_t device_adam_chunks() const { return device_adam_chunks_; }

  // Brackets one training step; the trace is recorded or checked in between.
  // EndStep also prefetches the params of the next step's first moments
  // (with a valid trace and prefetch on): after the optimizer they are
  // current, and their copies overlap whatever runs until that step starts.
  void BeginStep();
  void EndStep();
  // Marks the end of a phase of the step for the step-aligned residency
  // series (EndStep ends the optimizer phase).
  void EndPhase(StepPhase phase) { step_residency_.EndPhase(phase, counters_); }
  bool trace_valid() const { return trace_valid_; }
  int64_t trace_recordings() const { return trace_recordings_; }
  int64_t trace_moments() const { return int64_t(trace_.size()); }

  bool OnDevice(ChunkKey key) const { return DeviceHomed(key) || state(key).slot >= 0; }
  int32_t num_chunks() const { return num_chunks_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // This rank's share of each chunk: bytes, and its first byte within the chunk.
  int64_t shard_bytes() const { return shard_bytes_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Communicator* comm() const { return comm_; }
  // Chunk slots of the tier: those chunks stream through, and those homing moments.
  int32_t device_slots() const { return int32_t(slot_owner_.size() + HomedKinds(options_) * device_adam_chunks_); }
  int32_t streaming_slots() const { return int32_t(slot_owner_.size()); }
  int64_t device_capacity_bytes() const { return device_capacity_; }
  int64_t non_model_bytes() const { return non_model_bytes_; }
  int64_t host_bytes() const { return int64_t(host_block_.bytes()); }
  // Most device bytes in use at any moment so far (non-model + resident chunks).
  int64_t peak_device_bytes() const { return peak_device_bytes_; }
  const RuntimeCounters& counters() const { return counters_; }
  // Device bytes in use now: non-model plus resident chunks.
  int64_t device_bytes_in_use() const {
    return non_model_bytes_ + staging_bytes() + streaming_bytes_in_use_ +
           HomedKinds(options_) * int64_t(device_adam_chunks_) * chunk_bytes_;
  }
  // The staging area for 16-bit gradient copies (0 without).
  int64_t staging_bytes() const { return slots_offset_ - non_model_bytes_; }
  // Called after every moment's loads and prefetches (tests check the budget with it).
  void SetMomentObserver(std::function<void(const ChunkManager&)> observer) { observer_ = std::move(observer); }
  // Told of every copy between the tiers; null (the default) for none. Not owned.
  void SetMoveObserver(MoveObserver* observer) { move_observer_ = observer; }
  const ChunkRuntimeOptions& options() const { return options_; }

 private:
  struct ChunkState {
    int32_t slot = -1;          // device slot, or -1
    int32_t pins = 0;           // moments holding it now
    bool device_dirty = false;  // device copy newer than the host copy
    bool zero = false;          // content is zeros; no copy is current yet
    bool prefetched = false;    // brought in ahead of use, not used since
    int64_t last_use = -1;      // access tick, for LRU
  };

  ChunkManager(int32_t num_chunks, int64_t chunk_bytes, std::unique_ptr<DeviceBackend> backend,
               const ChunkRuntimeOptions& options, Communicator* comm);

  int32_t Index(ChunkKey key) const { return int32_t(key.kind) * num_chunks_ + key.chunk; }
  ChunkKey KeyOf(int32_t index) const {
    return {StateKind(index / num_chunks_), index % num_chunks_};
  }
  ChunkState& state(ChunkKey key) { return states_[size_t(Index(key))]; }
  const ChunkState& state(ChunkKey key) const { return states_[size_t(Index(key))]; }
  // Moments of device-Adam chunks, and with param_device their masters.
  bool DeviceHomed(int32_t index) const {
    return index % num_chunks_ < device_adam_chunks_ && (index >= 2 * num_chunks_ || (half_params() && index < num_chunks_));
  }
  // Whether a 16-bit param copy (half_params): read-only, in the half-slot pool.
  bool HalfParam(int32_t index) const { return half_params() && index < num_chunks_; }
  // Whether the chunk's device copies stream through slots: everything not
  // homed on the device, and every 16-bit param copy.
  bool Streams(int32_t index) const { return !DeviceHomed(index) || HalfParam(index); }
  // Whether the chunk's host home is 16-bit (gradients with grad_home set).
  bool HalfHomed(int32_t index) const {
    return options_.grad_home.has_value() && index >= num_chunks_ && index < 2 * num_chunks_;
  }
  int64_t HomeBytes(int32_t index) const { return HalfHomed(index) ? shard_bytes_ / 2 : shard_bytes_; }
  std::byte* Home(int32_t index) const;
  uint16_t* HalfHome(int32_t index) const;
  float* HomeOnDevice(int32_t index) const;
  // A host home made current: a dirty device copy written home and waited
  // for, a zero chunk zero-filled.
  void MakeHomeCurrent(int32_t index);
  // The host shard of a chunk homed on the host.
  float* HostCopy(int32_t index) const;
  // The host-readable copy of a device-homed chunk: its home on the CPU
  // backend, else a copy in peek_buffer_.
  float* HostReadableHome(int32_t index);
  float* SlotData(int32_t slot) const;
  // The streaming slots form pools of one slot size each: [0] chunk-sized,
  // [1] half-size for 16-bit params (half_params only).
  struct SlotPool {
    int64_t offset = 0;  // of its first slot in the device block
    int64_t stride = 0;
    int32_t first = 0, count = 0;
    std::vector<int32_t> free;  // a stack, lowest slot on top
  };
  int PoolOf(int32_t index) const { return HalfParam(index) ? 1 : 0; }
  const SlotPool& PoolOfSlot(int32_t slot) const {
    return pools_.size() > 1 && slot >= pools_[1].first ? pools_[1] : pools_[0];
  }
  int64_t SlotStride(int32_t slot) const { return PoolOfSlot(slot).stride; }
  // Brings a 16-bit param copy into `slot`: the master narrowed on the device
  // (homed there) or on the host (then copied up).
  void LoadHalfParam(int32_t index, int32_t slot);
  // A GPU host write to a device-homed chunk goes through peek_buffer_ and is
  // copied into its home at the next call into the manager (this flush).
  void FlushHostWindow();

  // Brings chunk `index` to the device; false when no slot can be had.
  bool Load(int32_t index, bool prefetch, int64_t must_outlive);
  // A free slot, evicting a victim if needed; -1 when none qualifies. With OPT,
  // only chunks next used more than `must_outlive` moments ahead may go.
  int32_t TakeSlot(int pool, int64_t must_outlive);
  int32_t ChooseVictim(int pool, int64_t must_outlive) const;
  void Evict(int32_t index);
  void WriteHome(int32_t index);
  void DropDeviceCopy(int32_t index);
  // Moments from now until chunk `index` is next used, per the trace.
  int64_t NextUseDistance(int32_t index) const;
  void Prefetch();
  void PrefetchStepStart();
  void AdoptTrace();
  void UpdateResidency(int32_t index, Tier tier, int sign);
  void CountMoved(int32_t index, Direction direction, int64_t bytes);

  // With N > 1 ranks a gradient's home shard accumulates reduce-scattered
  // device partials; its device copy always starts from zeros.
  bool AccumulatesHome(int32_t index) const { return world_ > 1 && KeyOf(index).kind == StateKind::kGrad; }
  // A failed collective ends the process (the design's lost-peer rule).
  void CheckCollective(const Status& status) const;

  const int32_t num_chunks_;
  const int64_t chunk_bytes_;
  Communicator* comm_ = nullptr;
  int world_ = 1, rank_ = 0;
  int64_t shard_bytes_ = 0;
  // One shard of host memory (pinned on a GPU) for reduce-scatter results, with N > 1 ranks.
  MemoryBlock scratch_;
  float* Scratch() const { return reinterpret_cast<float*>(scratch_.data()); }
  const ChunkRuntimeOptions options_;
  std::unique_ptr<DeviceBackend> backend_;
  int64_t device_capacity_ = 0;
  int64_t non_model_bytes_ = 0;
  MemoryBlock device_block_;
  MemoryBlock host_block_;
  int64_t slots_offset_ = 0;
  int64_t homes_offset_ = 0;  // device-homed moments, after the streaming slots
  std::unique_ptr<Event> compute_done_;
  bool clean_victims_only_ = false;  // set while EndStep prefetches
  MemoryBlock peek_buffer_;  // one chunk of host memory, allocated on first use
  std::vector<float> widen_buffer_;  // one shard: a 16-bit home as the host reads it
  int64_t staging_offset_ = 0;  // device staging for 16-bit copies: h2d half, then d2h half
  std::vector<ChunkState> states_;
  // Per slot: the end of the last op that used it (compute stream) and of the
  // last copy into or out of it (copy streams). A slot is refilled only after
  // both; compute reads it only after its copy.
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
  std::vector<SlotEvents> slot_events_;
  // Per chunk: the end of the last copy into its host copy (device-to-host
  // stream). The host touches the host copy, and a load copies from it, only
  // after that copy landed: the chunk may have left its slot long before.
  std::vector<std::unique_ptr<Event>> home_written_;
  std::vector<int32_t> slot_owner_;  // chunk index per slot, or -1
  std::vector<SlotPool> pools_;
  int64_t streaming_bytes_in_use_ = 0;
  // Pinned host buffers params are narrowed into before they go up (GPU,
  // half_params), used in turn; each waits for its last copy before reuse.
  MemoryBlock param_staging_;
  std::unique_ptr<Event> param_staged_[2];
  int param_staging_next_ = 0;
  int32_t host_window_index_ = -1;  // device-homed chunk written in peek_buffer_, or -1
  int64_t peak_device_bytes_ = 0;
  int32_t device_adam_chunks_ = 0;
  int64_t tick_ = 0;

  // The recorded trace: chunk indices per moment, and each chunk's moments.
  std::vector<std::vector<int32_t>> trace_;
  std::vector<std::vector<int32_t>> uses_;
  bool trace_valid_ = false;
  int64_t trace_recordings_ = 0;
  // This step's moments so far.
  std::vector<std::vector<int32_t>> step_moments_;
  int64_t moment_ = 0;  // moment index within the step

  RuntimeCounters counters_;
  StepResidency step_residency_;
  std::function<void(const ChunkManager&)> observer_;
  MoveObserver* move_observer_ = nullptr;
  int64_t BeginMove(Direction d) { return move_observer_ != nullptr ? move_observer_->BeginMove(d) : -1; }
  void EndMove(int64_t token, Direction d, int64_t bytes) {
    if (move_observer_ != nullptr) move_observer_->EndMove(token, d, bytes);
  }
};

}  // namespace pstar
