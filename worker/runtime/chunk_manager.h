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
//
// The manager keeps each chunk's state and composes the units that do the
// rest: TierLayout sizes the tiers, ChunkPlacement says where each chunk is
// homed, HostTier and DeviceTier hold the memory, ChunkTrace records the
// moments, ChooseVictim and the prefetch functions decide from it, and
// TierCopier moves the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "worker/core/status.h"
#include "worker/dist/communicator.h"
#include "worker/runtime/chunk_placement.h"
#include "worker/runtime/chunk_runtime_options.h"
#include "worker/runtime/chunk_trace.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/device_tier.h"
#include "worker/runtime/disk_tier.h"
#include "worker/runtime/eviction.h"
#include "worker/runtime/host_tier.h"
#include "worker/runtime/prefetch.h"
#include "worker/runtime/runtime_counters.h"
#include "worker/runtime/step_residency.h"
#include "worker/runtime/tier_copier.h"
#include "worker/runtime/tier_layout.h"

namespace pstar {

// One chunk a moment needs, and whether the moment writes it.
struct ChunkAccess {
  ChunkKey key;
  bool writes = false;
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
  // The sizing arithmetic Create uses is TierLayout's (the planner shares it).

  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;
  ~ChunkManager();

  // The non-model region at the start of the device block.
  std::byte* non_model_memory() const { return device_.non_model_memory(); }
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
  bool DeviceHomed(ChunkKey key) const { return placement_.DeviceHomed(Index(key)); }
  // Whether the chunk's home is on disk (moments of the last chunks, with a
  // disk tier). The host reaches it through HostRead, HostWrite, Current and
  // Peek, which return a window: valid until the next of those calls for a
  // disk-homed chunk of another chunk number, or EndStep (the optimizer's
  // update of one chunk holds all its kinds at once). Ops never use it.
  bool DiskHomed(ChunkKey key) const { return placement_.DiskHomed(Index(key)); }
  int32_t disk_moment_chunks() const { return placement_.disk_chunks; }
  int32_t disk_master_chunks() const { return placement_.disk_master_chunks; }
  // The disk tier, or null without one.
  const DiskTier* disk() const { return disk_.get(); }
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
  bool HalfHomed(ChunkKey key) const { return placement_.HalfHomed(Index(key)); }
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
  bool DeviceAdam(int32_t chunk) const { return placement_.DeviceAdam(chunk); }
  int32_t device_adam_chunks() const { return placement_.device_adam_chunks; }

  // Brackets one training step; the trace is recorded or checked in between.
  // EndStep also prefetches the params of the next step's first moments
  // (with a valid trace and prefetch on): after the optimizer they are
  // current, and their copies overlap whatever runs until that step starts.
  void BeginStep();
  void EndStep();
  // The optimizer's step begins (the step's last use is over). With N ranks
  // and collectives under compute, and no disk tier, the next step's
  // gathers then start chunk by chunk as UpdateDone reports each update
  // over, in the trace's order, so the link works while the rest update;
  // EndStep walks what is left. Otherwise both do nothing. Every rank
  // updates in the same order, so every rank starts the same collectives.
  void BeginUpdates();
  void UpdateDone(int32_t chunk);
  // Marks the end of a phase of the step for the step-aligned residency
  // series (EndStep ends the optimizer phase).
  void EndPhase(StepPhase phase) { step_residency_.EndPhase(phase, counters_); }
  bool trace_valid() const { return trace_.valid(); }
  int64_t trace_recordings() const { return trace_.recordings(); }
  int64_t trace_moments() const { return trace_.size(); }

  bool OnDevice(ChunkKey key) const { return DeviceHomed(key) || state(key).slot >= 0; }
  int32_t num_chunks() const { return num_chunks_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  // This rank's share of each chunk: bytes, and its first byte within the chunk.
  int64_t shard_bytes() const { return shard_bytes_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Communicator* comm() const { return comm_; }
  // Chunk slots of the tier: those chunks stream through, and those homing moments.
  int32_t device_slots() const {
    return int32_t(device_.slot_count() + TierLayout::HomedKinds(options_) * placement_.device_adam_chunks);
  }
  int32_t streaming_slots() const { return device_.slot_count(); }
  int64_t device_capacity_bytes() const { return device_.capacity(); }
  int64_t non_model_bytes() const { return device_.non_model_bytes(); }
  int64_t host_bytes() const { return host_.bytes(); }
  // Most device bytes in use at any moment so far (non-model + resident chunks).
  int64_t peak_device_bytes() const { return device_.peak_bytes(); }
  const RuntimeCounters& counters() const { return counters_; }
  // Device bytes in use now: non-model plus resident chunks.
  int64_t device_bytes_in_use() const { return device_.bytes_in_use(); }
  // The staging area for 16-bit gradient copies (0 without).
  int64_t staging_bytes() const { return device_.staging_bytes(); }
  // Called before the manager touches a host home: which chunk, its kind,
  // and whether the home is written (or only read). An update on another
  // thread may still be using the chunk's homes (see AsyncUpdater): the call
  // returns once that is safe. Null (the default) for none.
  using HostFence = std::function<void(int32_t chunk, StateKind kind, bool writes)>;
  void SetHostFence(HostFence fence) { host_fence_ = std::move(fence); }

  // A final gradient's home for an update on another thread (one rank): the
  // copy home of its dirty device copy is started, not waited for; `ready`
  // is the event its end records (null when the home is current already),
  // which the updating thread waits for. One of fp32 and half is set (half
  // for gradients homed in 16 bits). The device copy stays, clean.
  struct GradHome {
    const float* fp32 = nullptr;
    const uint16_t* half = nullptr;
    const Event* ready = nullptr;
  };
  GradHome StartGradHome(int32_t chunk);
  // Whether an op holds the chunk now.
  bool Pinned(ChunkKey key) const { return state(key).pins > 0; }
  // With N ranks and runtime.comm_overlap: the gradient of `chunk`, final
  // for this step, starts its reduce-scatter into the home shards now, under
  // the compute that follows, and its slot is freed. Every rank calls it at
  // the same point. Nothing to do for a gradient not dirty on the device.
  void StartGradReduce(int32_t chunk);
  // Waits for every collective this manager started.
  void WaitCollectives() { WaitTicket(last_ticket_); }
  // Called after every moment's loads and prefetches (tests check the budget with it).
  void SetMomentObserver(std::function<void(const ChunkManager&)> observer) { observer_ = std::move(observer); }
  // Told of every copy between the tiers; null (the default) for none. Not owned.
  void SetMoveObserver(MoveObserver* observer) { copier_->SetMoveObserver(observer); }
  // Records the collectives' begin and end events in `log` (null: stop).
  void SetEventLog(ChunkEventLog* log) { copier_->SetEventLog(log); }
  // Appends every collective the runtime starts from now on (gathers and
  // reduce-scatters, in order) to `log`; null stops. Not owned.
  void RecordCollectives(std::vector<CollectiveCall>* log) { copier_->SetCallLog(log); }
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

  ChunkManager(const ChunkPlacement& placement, int64_t chunk_bytes, std::unique_ptr<DeviceBackend> backend,
               const ChunkRuntimeOptions& options, Communicator* comm);
  // Create's steps once the placement is known: the tiers and the copier,
  // each chunk's starting state, and the residency counters of the homes.
  Status CreateTiers(int64_t chunk_bytes, const TierLayout::TierSlots& slots, int64_t capacity);
  void InitState();
  void CountHomes(int64_t capacity);

  int32_t Index(ChunkKey key) const { return placement_.Index(key); }
  // Before the host touches chunk index `index`'s home: the collectives
  // writing it (and, to write it, reading it) are done, and the host fence
  // is passed.
  void FenceHost(int32_t index, bool writes) {
    WaitTicket(home_written_by_[size_t(index)]);
    if (writes) WaitTicket(home_read_by_[size_t(index)]);
    FenceUpdates(index, writes);
  }
  // The host fence alone: for collectives, which the communicator already
  // orders after the ones before them.
  void FenceUpdates(int32_t index, bool writes) const {
    if (host_fence_) host_fence_(index % num_chunks_, placement_.KindOf(index), writes);
  }
  // Waits for a collective's ticket (0: none); a failed one ends the process.
  void WaitTicket(CollectiveTicket ticket);
  // A collective just started on `slot` and the home it reads or writes.
  void NoteCollective(CollectiveTicket ticket, int32_t slot, int32_t index, bool writes_home);
  ChunkState& state(ChunkKey key) { return states_[size_t(Index(key))]; }
  const ChunkState& state(ChunkKey key) const { return states_[size_t(Index(key))]; }
  // A host home made current: a dirty device copy written home and waited
  // for, a zero chunk zero-filled.
  void MakeHomeCurrent(int32_t index);
  // The host-readable copy of a device-homed chunk: its home on the CPU
  // backend, else a copy in peek_buffer_.
  float* HostReadableHome(int32_t index);
  // A disk-homed chunk in a host window (pinned as DiskHomed says), reading
  // ahead the same kind's next chunks.
  float* OpenOnDisk(int32_t index, bool write);
  // Done with the chunk whose disk windows are pinned: the masters written
  // narrowed into their 16-bit homes, the windows unpinned (written behind).
  void CloseDiskChunk();
  // A GPU host write to a device-homed chunk goes through peek_buffer_ and is
  // copied into its home at the next call into the manager (this flush).
  void FlushHostWindow();

  // Brings chunk `index` to the device; false when no slot can be had.
  bool Load(int32_t index, bool prefetch, int64_t must_outlive);
  // The prefetch functions' load: true when the chunk is there or came.
  bool PrefetchLoad(int32_t index, int64_t must_outlive);
  // A free slot of `pool`, evicting a victim if needed; -1 when none
  // qualifies. With OPT, only chunks next used more than `must_outlive`
  // moments ahead may go. `waits`: the caller waits for the slot's last
  // collective on this thread (see TakeSlot). `fill`: the load writes
  // zeros, not a copy.
  int32_t TakeSlot(int pool, int64_t must_outlive, bool waits, bool fill);
  // Whether the trace uses chunk `index` again before the step ends.
  bool UsedAgainThisStep(int32_t index) const;
  // Whether a prefetch of a chunk first used `must_outlive` moments ahead
  // should wait rather than evict `victim`: a chunk the current moment holds
  // in `pool` is released before that use and next used after `victim`, so
  // OPT would evict it instead and `victim` stays. However little lookahead
  // is left then: a late gather costs at most its own time, where the
  // evicted copy would cost a whole second one.
  bool HeldChunkGoesFirst(int pool, int32_t victim, int64_t must_outlive) const;
  // Whether OPT would drop `victim` (resident in `pool`) before its next use
  // anyway, the other chunks used until then filling every slot.
  bool OptDropsBeforeItsUse(int pool, int32_t victim) const;
  // The unpinned chunks of `pool` into candidates_ (only clean ones if asked).
  void CollectVictims(int pool, bool clean_only);
  void Evict(int32_t index);
  void WriteHome(int32_t index);
  void DropDeviceCopy(int32_t index);
  void UpdateResidency(int32_t index, Tier tier, int sign);

  // With N > 1 ranks a gradient's home shard accumulates reduce-scattered
  // device partials; its device copy always starts from zeros.
  bool AccumulatesHome(int32_t index) const { return world_ > 1 && placement_.KindOf(index) == StateKind::kGrad; }
  // Whether loading chunk `index` writes zeros rather than copying: a
  // gradient whose home holds reduced sums, or a chunk with no copy yet.
  bool LoadsAsFill(int32_t index) const {
    return !placement_.HalfParam(index) && (AccumulatesHome(index) || states_[size_t(index)].zero);
  }

  const ChunkPlacement placement_;
  const int32_t num_chunks_;
  const int64_t chunk_bytes_;  // the slot stride
  Communicator* comm_ = nullptr;
  const int world_, rank_;
  const int64_t shard_bytes_;
  const ChunkRuntimeOptions options_;
  std::unique_ptr<DeviceBackend> backend_;
  RuntimeCounters counters_;
  DeviceTier device_;
  HostTier host_;
  std::unique_ptr<TierCopier> copier_;
  std::unique_ptr<DiskTier> disk_;
  int32_t disk_open_chunk_ = -1;  // the chunk whose disk windows are pinned, or -1
  std::vector<int32_t> disk_written_masters_;  // of that chunk, opened for writing
  ChunkTrace trace_;
  std::vector<ChunkState> states_;
  std::unique_ptr<Event> compute_done_;
  bool clean_victims_only_ = false;  // set while EndStep prefetches
  // The next step's prefetch, walked in pieces between BeginUpdates and
  // EndStep; `updated_` marks the chunks whose update is over.
  NextStepPrefetch next_prefetch_;
  bool updates_begun_ = false;
  std::vector<uint8_t> updated_;
  std::vector<EvictionCandidate> candidates_;  // ChooseVictim's input, reused
  MemoryBlock peek_buffer_;  // one chunk of host memory, allocated on first use
  std::vector<float> widen_buffer_;  // one shard: a 16-bit home as the host reads it
  int32_t host_window_index_ = -1;  // device-homed chunk written in peek_buffer_, or -1
  int64_t tick_ = 0;
  StepResidency step_residency_;
  std::function<void(const ChunkManager&)> observer_;
  HostFence host_fence_;
  // With N ranks: the last collective started on each streaming slot, and
  // on each home (reading it: a gather; writing it: a reduce-scatter), the
  // last one started at all, and the last one known done.
  std::vector<CollectiveTicket> slot_ticket_, home_read_by_, home_written_by_;
  CollectiveTicket last_ticket_ = 0, done_ticket_ = 0;
};

}  // namespace pstar
