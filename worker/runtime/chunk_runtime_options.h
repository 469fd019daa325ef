// ChunkRuntimeOptions: what a run asks of the chunk runtime (the device
// budget, eviction, prefetch, where the optimizer moments live, 16-bit homes
// and copies). The planner sets them; every unit of the runtime reads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "worker/runtime/half_format.h"

namespace pstar {

enum class EvictionPolicy { kOpt, kLru };
const char* EvictionPolicyName(EvictionPolicy policy);

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
  // The disk tier: the optimizer moments of the last disk_moment_chunks
  // chunks (never device-Adam ones) are homed in one file per rank under
  // disk_path instead of host memory. The host reads and writes them
  // through a pool of aligned windows; reads run disk_read_ahead chunks
  // ahead of a sweep over the chunks (the optimizer's, a checkpoint's), and
  // writes run behind it, on disk_io_threads threads.
  // With param_device, the fp32 masters of the last disk_master_chunks chunks
  // (at most disk_moment_chunks) go there too; the host then keeps a 16-bit
  // param home for each, narrowed from the master after every update, which
  // is what streams to the device: a param fetch never reads the disk.
  std::string disk_path;
  int32_t disk_moment_chunks = 0;
  int32_t disk_master_chunks = 0;
  int32_t disk_read_ahead = 2;
  int32_t disk_io_threads = 2;
  // With N ranks: collectives run under the compute (the communicator's
  // queue): a gather is waited for only where its chunk is used, a
  // reduce-scatter only where its home is read or its slot reused, and a
  // gradient final for the step is reduce-scattered at once
  // (ChunkManager::StartGradReduce). Off, each is waited for as it starts.
  bool comm_overlap = true;
};

}  // namespace pstar
