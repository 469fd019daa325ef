// ChunkRuntimeOptions: what a run asks of the chunk runtime (the device
// budget, eviction, prefetch, where the optimizer moments live, 16-bit homes
// and copies). The planner sets them; every unit of the runtime reads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "worker/runtime/eviction_policy.h"
#include "worker/runtime/half_format.h"

namespace pstar {

// How each option works is in docs/architecture.md ("The chunk runtime").
struct ChunkRuntimeOptions {
  // The whole device tier; 0 = room for the non-model bytes and every chunk
  // (never more than that).
  int64_t device_capacity_bytes = 0;
  int64_t non_model_bytes = 0;  // activations and workspaces, at the tier's start
  // The most chunks one moment pins: the least the tier must hold.
  int32_t min_chunks_per_moment = 1;
  EvictionPolicy eviction = EvictionPolicy::kOpt;
  int32_t prefetch_depth = 2;  // moments of lookahead; 0 = off
  // Home some chunks' optimizer moments on the device, in margin_use_ratio
  // of the room beyond the streaming slots (all of it when every chunk
  // fits). Off with several ranks: their moments are sharded on the hosts.
  bool hybrid_adam = true;
  double margin_use_ratio = 0.8;
  // Gradients homed on the host in 16 bits (one rank). Their values are
  // already 16-bit ones (the model rounds them), so the copies are exact.
  std::optional<HalfFormat> grad_home;
  // Params streamed to the device in 16 bits (bf16 and fp16 runs): half the
  // bus bytes and half-size read-only slots; the fp32 master stays home.
  std::optional<HalfFormat> param_device;
  // With param_device: the most param and grad chunks one moment pins
  // (each pool's minimum); 0 = min_chunks_per_moment.
  int32_t min_param_chunks_per_moment = 0;
  int32_t min_grad_chunks_per_moment = 0;
  // The disk tier: the moments of the last disk_moment_chunks chunks (and
  // with param_device the fp32 masters of the last disk_master_chunks, a
  // 16-bit param home staying on the host) in one file per rank under
  // disk_path, read disk_read_ahead chunks ahead of a sweep and written
  // behind it on disk_io_threads threads.
  std::string disk_path;
  int32_t disk_moment_chunks = 0;
  int32_t disk_master_chunks = 0;
  int32_t disk_read_ahead = 2;
  int32_t disk_io_threads = 2;
  // With N ranks, collectives run under compute: each is waited for only
  // where its chunk is used (or its home read, its slot reused), and a final
  // gradient is reduce-scattered at once. Off, each is waited for at start.
  bool comm_overlap = true;
};

}  // namespace pstar
