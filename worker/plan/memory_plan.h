// The memory plan of a training job, computed from its config alone without
// allocating anything: the chunk layout, the bytes each kind and each tier
// needs, and the least device and host memory the job can run in. The worker
// checks it at start-up; `pstar plan` prints it; the operator sizes pods by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/model/param_layout.h"
#include "worker/runtime/chunk_manager.h"

namespace pstar {

struct KindPlan {
  StateKind kind;
  int32_t chunks = 0;
  int64_t bytes = 0;  // all chunks of this kind
};

struct MemoryPlan {
  int64_t parameters = 0;
  int32_t tensors = 0;          // as checkpoints name them (a table in row parts is one)
  int32_t row_parts = 0;        // the row parts the vocabulary tables are stored as (0: whole)
  int64_t chunk_elems = 0;
  int64_t chunk_bytes = 0;      // one chunk as stored (aligned)
  int32_t num_chunks = 0;       // per kind
  int64_t padding_elems = 0;    // chunk space no tensor uses, per kind
  std::vector<KindPlan> kinds;  // param, grad, exp_avg, exp_avg_sq

  int world_size = 1;
  int64_t model_bytes = 0;            // every kind, as chunks (all ranks together)
  int64_t activation_bytes = 0;       // non-model bytes on the device
  // Every layer keeps its GELU output for its backward (Gpt keep_gelu): where
  // runtime.device_memory holds every chunk and them, without activation
  // checkpointing. Otherwise backward recomputes them (the same bits).
  bool gelu_outputs_kept = false;
  std::string activation_format = "fp32";  // the activations' format: fp32, bf16 or fp16 (ActTensor)
  int32_t max_chunks_per_moment = 0;  // most chunks one op pins
  // The chunks, from the first, that the first block's first GEMM reads:
  // what a step gathers before anything but the embeddings can run.
  int32_t chunks_before_first_block = 0;
  int64_t min_device_bytes = 0;       // activations + the chunks one op pins
  int64_t all_resident_device_bytes = 0;  // activations + every chunk: nothing moves
  int64_t device_bytes = 0;           // the device tier this config gets
  int64_t device_slots = 0;           // chunk-sized slots in it (streaming and homes)
  int64_t device_param_slots = 0;     // half-size slots 16-bit params stream through
  int64_t device_streaming_slots = 0;  // the chunk-sized slots chunks stream through (no homes)
  int32_t device_adam_chunks = 0;     // chunks whose moments are homed on the device (Adam runs there)
  int64_t device_home_bytes = 0;      // the part of the tier those moments (and 16-bit runs' masters) take
  std::string param_device = "fp32";  // the params' format on the device: fp32, bf16 or fp16

  bool device_is_host_memory = true;  // CPU backend: the device tier is RAM too
  int64_t host_chunk_bytes = 0;       // this rank's home shards of every chunk homed on the host
  std::string grad_home = "fp32";     // the gradients' host format: fp32, bf16 or fp16
  int64_t host_data_bytes = 0;        // the token data held in memory
  int64_t host_overhead_bytes = 0;    // code, thread stacks, BLAS buffers (estimate), import buffers
  int64_t host_undo_bytes = 0;        // runtime.undo_memory: speculation's undo copies, when set
  int64_t min_host_bytes = 0;         // everything the host must hold

  // The disk tier (runtime.nvme_path): the moments (and masters) of this many
  // chunks are homed in disk_file (rank 0's; one per rank), disk_bytes per rank, used
  // through disk_window_bytes of host windows (in host_overhead_bytes).
  int32_t disk_moment_chunks = 0;
  int32_t disk_master_chunks = 0;  // 16-bit runs: chunks whose fp32 masters are there too
  int64_t disk_bytes = 0;
  int64_t disk_window_bytes = 0;
  std::string disk_file;

  ChunkRuntimeOptions runtime;        // what the chunk runtime is created with
};

// The job's chunk layout with `world_size` ranks: the configured chunk size (or
// the least-padding choice), rounded up so each chunk splits into world_size
// shards of whole 64-byte lines.
Result<ParamLayout> BuildJobLayout(const Config& config, int world_size);

// Fails with the reason when the config cannot be laid out. With N ranks the
// host figures are one rank's (it holds 1/N of every kind).
// `device_tier_bytes` is the device tier the rank gets (RankDeviceTierBytes in
// worker/train/trainer.h: runtime.device_memory, or a GPU's share where that
// is unset); 0 leaves room for every chunk.
Result<MemoryPlan> PlanMemory(const Config& config, int world_size, int64_t device_tier_bytes);
// A GPU's device tier where runtime.device_memory is unset:
// mem_tracer.overall_gpu_mem_ratio of its `gpu_memory_bytes` (the rest is
// left to CUDA's context and libraries).
int64_t GpuTierBytes(const Config& config, int64_t gpu_memory_bytes);
// The plan with the config's own runtime.device_memory as the tier.
inline Result<MemoryPlan> PlanMemory(const Config& config, int world_size = 1) {
  return PlanMemory(config, world_size, config.runtime.device_memory);
}

// The plan as the aligned text block `pstar plan` prints.
std::string FormatPlan(const MemoryPlan& plan);

}  // namespace pstar
