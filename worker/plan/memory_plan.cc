#include "worker/plan/memory_plan.h"

#include <cstdio>
#include <filesystem>

#include "worker/ckpt/hf_export.h"
#include "worker/ckpt/hf_import.h"
#include "worker/core/bytes.h"
#include "worker/model/gpt.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_store.h"
#include "worker/runtime/disk_tier.h"

namespace pstar {

namespace {

// Process overhead beyond what is counted: code and the shared libraries'
// resident pages, OpenMP stacks, BLAS buffers, allocator slack. A CUDA build
// is resident at about 213 MiB before it plans anything (`pstar info`: the
// CUDA libraries' relocated pages), and trained the default job at 217 MiB
// RSS against 190 MiB planned with the 128 MiB this was; rounded up.
constexpr int64_t kHostOverheadBytes = int64_t(256) << 20;

int64_t DataBytes(const Config& c) {
  switch (c.data.source) {
    case DataSourceKind::kGenerated:
      return c.data.generated_tokens * int64_t(sizeof(int32_t));
    case DataSourceKind::kText: {
      std::error_code ec;
      auto size = std::filesystem::file_size(c.data.path, ec);
      return ec ? 0 : int64_t(size) * int64_t(sizeof(int32_t));  // one int32 token per byte
    }
    case DataSourceKind::kTokens:
      return 0;  // memory-mapped: page cache, reclaimable
    case DataSourceKind::kJsonl: {
      // At the peak of packing: the text, its examples, their ids and flags
      // and the rows' three int32 per position, at under 3 bytes of text a
      // token: 8 bytes per byte of the file covers it.
      std::error_code ec;
      auto size = std::filesystem::file_size(c.data.path, ec);
      return ec ? 0 : int64_t(size) * 8;
    }
  }
  return 0;
}

}  // namespace

Result<ParamLayout> BuildJobLayout(const Config& c, int world_size) {
  std::vector<TensorSpec> specs = GptTensorSpecs(c.model.gpt);
  int64_t elems = c.default_chunk_size;
  if (world_size > 1) {
    // One 64-byte line per shard: 16 floats, or 32 where params stream in 16 bits.
    const int64_t unit = (c.train.precision == Precision::kFp32 ? 16 : 32) * int64_t(world_size);
    if (elems == 0) elems = ParamLayout::ChooseChunkElems(specs);
    elems = (elems + unit - 1) / unit * unit;
  }
  auto layout = ParamLayout::Build(std::move(specs), elems);
  if (!layout.ok()) return layout.status().WithPrefix("default_chunk_size");
  return layout;
}

namespace {

ComputeSpec JobCompute(const Config& c) { return ComputeSpec{c.runtime.device, c.train.precision}; }

// The chunk layout's figures and what one op pins at once.
void PlanChunks(const Config& c, const ParamLayout& layout, const ComputeSpec& compute, MemoryPlan* p) {
  const GptConfig& g = c.model.gpt;
  p->parameters = g.NumParameters();  // as users count them: no vocabulary padding
  p->tensors = 0;
  p->row_parts = 0;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    const TensorSpec& s = layout.spec(id);
    if (!s.part_of.empty()) ++p->row_parts;
    if (s.part_of.empty() || s.part_row == 0) ++p->tensors;
  }
  p->chunk_elems = layout.chunk_elems();
  p->chunk_bytes = TierLayout::SlotBytes(layout.chunk_elems() * int64_t(sizeof(float)));
  p->num_chunks = layout.num_chunks();
  p->padding_elems = layout.padded_elements() - layout.num_elements();
  for (int k = 0; k < kNumStateKinds; ++k) {
    p->kinds.push_back({StateKind(k), p->num_chunks, int64_t(p->num_chunks) * p->chunk_bytes});
    p->model_bytes += p->kinds.back().bytes;
  }
  p->activation_bytes = Gpt::ActivationBytes(g, c.train.batch_size, c.train.seq_len,
                                             c.train.activation_checkpointing, compute);
  p->activation_format = PrecisionName(compute.precision);
  // The first block's first GEMM weight (c_attn, q_proj): the first weight
  // that is not an embedding.
  TensorId first_gemm = -1;
  for (TensorId id = 0; id < layout.num_tensors() && first_gemm < 0; ++id) {
    if (layout.spec(id).role == TensorRole::kWeight) first_gemm = id;
  }
  p->chunks_before_first_block = first_gemm < 0 ? 1 : layout.placement(first_gemm).chunk + 1;
}

// The chunk runtime's options but the disk tier's.
void PlanRuntime(const Config& c, int world_size, int64_t device_tier_bytes, const ComputeSpec& compute,
                 const MomentChunks& most, MemoryPlan* p) {
  ChunkRuntimeOptions& r = p->runtime;
  r.device_capacity_bytes = device_tier_bytes;
  r.non_model_bytes = p->activation_bytes;
  r.min_chunks_per_moment = p->max_chunks_per_moment;
  r.eviction = c.runtime.eviction;
  r.prefetch_depth = int32_t(c.runtime.prefetch_depth);
  r.comm_overlap = c.runtime.comm_overlap;
  // With several ranks every update runs on the host shards (the device holds
  // whole chunks, the moments are sharded), so no slots are kept for them.
  r.hybrid_adam = c.optimizer.use_hybrid_adam && world_size == 1;
  r.margin_use_ratio = c.mem_tracer.margin_use_ratio;
  if (c.train.grad_precision == GradPrecision::k16Bit) {
    // With several ranks the gradients are also reduce-scattered in 16 bits.
    r.grad_home = compute.precision == Precision::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16;
    p->grad_home = compute.precision == Precision::kFp16 ? "fp16" : "bf16";
  }
  // 16-bit runs stream 16-bit params; the fp32 masters stay with the optimizer.
  if (compute.precision != Precision::kFp32) {
    r.param_device = compute.precision == Precision::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16;
    r.min_param_chunks_per_moment = most.params;
    r.min_grad_chunks_per_moment = most.grads;
    p->param_device = PrecisionName(compute.precision);
  }
}

// The device tier: whether the GELU outputs are kept, its minimum, its size
// and its slots.
void PlanDevice(const Config& c, int64_t device_tier_bytes, const ComputeSpec& compute, int64_t chunk_bytes,
                MemoryPlan* p) {
  ChunkRuntimeOptions& r = p->runtime;
  if (!c.train.activation_checkpointing && device_tier_bytes > 0) {
    // The GELU outputs kept where the tier has room for them beside every
    // chunk: a tier that streams chunks spends the memory on chunks instead.
    ChunkRuntimeOptions kept = r;
    kept.non_model_bytes = Gpt::ActivationBytes(c.model.gpt, c.train.batch_size, c.train.seq_len, false, compute, true);
    kept.device_capacity_bytes = 0;
    if (TierLayout::DeviceCapacity(p->num_chunks, chunk_bytes, kept) <= device_tier_bytes) {
      p->gelu_outputs_kept = true;
      p->activation_bytes = r.non_model_bytes = kept.non_model_bytes;
    }
  }
  p->min_device_bytes = TierLayout::MinDeviceBytes(chunk_bytes, r);
  ChunkRuntimeOptions all = r;
  all.device_capacity_bytes = 0;
  p->all_resident_device_bytes = TierLayout::DeviceCapacity(p->num_chunks, chunk_bytes, all);
  p->device_bytes = TierLayout::DeviceCapacity(p->num_chunks, chunk_bytes, r);
  const TierLayout::TierSlots slots = TierLayout::LayOutSlots(p->num_chunks, chunk_bytes, r);
  p->device_adam_chunks = slots.device_adam_chunks;
  p->device_home_bytes = TierLayout::HomedKinds(r) * int64_t(p->device_adam_chunks) * p->chunk_bytes;
  p->device_slots = slots.full + TierLayout::HomedKinds(r) * p->device_adam_chunks;
  p->device_param_slots = slots.half;
  p->device_streaming_slots = slots.full;
}

// The host's figures for the runtime options as they stand (the disk tier
// planner calls it again for each placement it tries).
void PlanHost(const Config& c, int64_t shard, MemoryPlan* p) {
  const ChunkRuntimeOptions& r = p->runtime;
  p->host_chunk_bytes = TierLayout::HostHomeBytes(p->num_chunks, shard, p->device_adam_chunks, r);
  // Plus, with 16-bit gradient homes, the shard the host widens one into.
  // Plus, with 16-bit params on a GPU, the pinned buffers they are narrowed
  // into, and with chunks homed in GPU memory the one-chunk buffer the host
  // reads and writes those through (checkpoints, initialization). Plus the
  // disk tier's windows, and model.init_from's import buffer and
  // checkpoint.export_dir's export buffers (they stream the files through
  // them, worker/ckpt/hf_import.h, hf_export.h).
  p->disk_window_bytes = TierLayout::DiskWindowBytes(shard, r);
  p->host_overhead_bytes = kHostOverheadBytes + (r.grad_home.has_value() ? shard : 0) +
                           TierLayout::ParamStagingBytes(shard, r, p->device_is_host_memory) +
                           (!p->device_is_host_memory && p->device_adam_chunks > 0 ? p->chunk_bytes : 0) +
                           p->disk_window_bytes + (c.model.init_from.empty() ? 0 : HfImportBufferBytes()) +
                           (c.checkpoint.export_dir.empty() ? 0 : HfExportBufferBytes());
  p->host_undo_bytes = c.runtime.undo_memory;
  p->min_host_bytes = p->host_chunk_bytes + p->host_data_bytes + p->host_overhead_bytes + p->host_undo_bytes +
                      (p->device_is_host_memory ? p->device_bytes : 0);
}

// The disk tier homes what is touched least often, of the last chunks that
// update on the host: their optimizer moments (once a step, by the
// optimizer), then in 16-bit runs their fp32 masters (the same, a 16-bit home
// staying on the host for the forward and backward). As many as a configured
// host budget needs, or all of them where the budget is left to detection or
// with nvme_spill "all" (a pod's memory request then drops by all of them).
Status PlanDiskTier(const Config& c, int64_t shard, MemoryPlan* p) {
  ChunkRuntimeOptions& r = p->runtime;
  const int32_t host_updated = p->num_chunks - p->device_adam_chunks;
  const int32_t masters = r.param_device.has_value() ? host_updated : 0;
  r.disk_path = c.runtime.nvme_path;
  r.disk_read_ahead = int32_t(c.runtime.nvme_read_ahead);
  r.disk_io_threads = int32_t(c.runtime.nvme_io_threads);
  r.disk_moment_chunks = host_updated;
  r.disk_master_chunks = masters;
  if (c.runtime.host_memory > 0 && c.runtime.nvme_spill == DiskSpill::kAuto) {
    auto fits = [&](int32_t moments, int32_t on_disk_masters) {
      r.disk_moment_chunks = moments;
      r.disk_master_chunks = on_disk_masters;
      PlanHost(c, shard, p);
      return p->min_host_bytes <= c.runtime.host_memory;
    };
    bool done = false;
    for (int32_t k = 0; k <= host_updated && !done; ++k) done = fits(k, 0);
    for (int32_t k = 1; k <= masters && !done; ++k) done = fits(host_updated, k);
  }
  PlanHost(c, shard, p);
  p->disk_moment_chunks = r.disk_moment_chunks;
  p->disk_master_chunks = r.disk_master_chunks;
  p->disk_bytes = TierLayout::DiskBytes(shard, r);
  p->disk_file = r.disk_moment_chunks > 0 ? DiskTier::FilePath(r.disk_path, 0) : "";
  if (c.runtime.nvme_memory > 0 && p->disk_bytes > c.runtime.nvme_memory) {
    return Status::ResourceExhausted(
        "runtime.nvme_memory: the disk tier needs " + std::to_string(p->disk_bytes) + " bytes (" +
        FormatBytes(p->disk_bytes) + ": the moments of " + std::to_string(p->disk_moment_chunks) +
        " chunks and the masters of " + std::to_string(p->disk_master_chunks) + "), " +
        std::to_string(c.runtime.nvme_memory) + " bytes (" + FormatBytes(c.runtime.nvme_memory) + ") allowed");
  }
  return Status::Ok();
}

}  // namespace

int64_t GpuTierBytes(const Config& c, int64_t gpu_memory_bytes) {
  return int64_t(double(gpu_memory_bytes) * c.mem_tracer.overall_gpu_mem_ratio);
}

Result<MemoryPlan> PlanMemory(const Config& c, int world_size, int64_t device_tier_bytes) {
  if (world_size < 1) return Status::InvalidArgument("world size must be at least 1");
  PSTAR_ASSIGN_OR_RETURN(const ParamLayout layout, BuildJobLayout(c, world_size));
  const ComputeSpec compute = JobCompute(c);
  MemoryPlan p;
  p.world_size = world_size;
  PlanChunks(c, layout, compute, &p);
  const MomentChunks most = MostChunksPerMoment(
      layout, GptAccessSequence(c.model.gpt, layout, c.train.activation_checkpointing,
                                c.train.batch_size * c.train.seq_len));
  p.max_chunks_per_moment = most.total;
  PlanRuntime(c, world_size, device_tier_bytes, compute, most, &p);
  const int64_t chunk_bytes = layout.chunk_elems() * int64_t(sizeof(float));
  PlanDevice(c, device_tier_bytes, compute, chunk_bytes, &p);
  // The CPU backend emulates the device tier in RAM; on CUDA it is GPU memory
  // and the host tier is pinned (counted with the chunks).
  p.device_is_host_memory = compute.device == ComputeDevice::kCpu;
  p.host_data_bytes = DataBytes(c);
  const int64_t shard = p.chunk_bytes / world_size;
  PlanHost(c, shard, &p);
  if (!c.runtime.nvme_path.empty()) PSTAR_RETURN_IF_ERROR(PlanDiskTier(c, shard, &p));
  return p;
}

std::string FormatPlan(const MemoryPlan& p) {
  std::string out;
  char line[256];
  auto add = [&](const char* label, const std::string& value) {
    std::snprintf(line, sizeof line, "%-28s %s\n", label, value.c_str());
    out += line;
  };
  auto bytes = [](int64_t b) { return FormatBytes(b) + " (" + std::to_string(b) + " bytes)"; };
  add("parameters", std::to_string(p.parameters) + " in " + std::to_string(p.tensors) + " tensors" +
                        (p.row_parts > 0 ? ", the vocabulary tables in " + std::to_string(p.row_parts) + " row parts"
                                         : ""));
  add("ranks", std::to_string(p.world_size) + (p.world_size > 1 ? " (host figures are per rank: 1/" +
                                                    std::to_string(p.world_size) + " of every kind)"
                                              : ""));
  add("chunk size", std::to_string(p.chunk_elems) + " elements, " + FormatBytes(p.chunk_bytes) +
                        "; padding " + std::to_string(p.padding_elems) + " elements per kind");
  for (const KindPlan& k : p.kinds) {
    add((std::string("chunks: ") + StateKindName(k.kind)).c_str(),
        std::to_string(k.chunks) + " x " + FormatBytes(p.chunk_bytes) + " = " + FormatBytes(k.bytes));
  }
  add("model data", bytes(p.model_bytes));
  add("activations (device)",
      bytes(p.activation_bytes) + ", " + p.activation_format + (p.gelu_outputs_kept ? ", GELU outputs kept" : ""));
  add("chunks pinned at once", std::to_string(p.max_chunks_per_moment));
  add("device: minimum", bytes(p.min_device_bytes));
  add("device: all resident", bytes(p.all_resident_device_bytes));
  add("device: this job", bytes(p.device_bytes) + ", " + std::to_string(p.device_slots) + " chunk slots" +
                              (p.param_device == "fp32" ? std::string()
                                                        : " and " + std::to_string(p.device_param_slots) +
                                                              " half-size slots for " + p.param_device + " params"));
  add(p.param_device == "fp32" ? "device: homed Adam moments" : "device: homed masters+moments",
      FormatBytes(p.device_home_bytes) + ", " + std::to_string(p.device_adam_chunks) + " of " +
          std::to_string(p.num_chunks) + " chunks (their Adam runs on the device)");
  add("host: chunk home copies", bytes(p.host_chunk_bytes) + (p.grad_home == "fp32" ? std::string()
                                                                  : ", gradients in " + p.grad_home));
  add("host: data", bytes(p.host_data_bytes));
  add("host: overhead", bytes(p.host_overhead_bytes));
  if (p.host_undo_bytes > 0) add("host: speculation undo", bytes(p.host_undo_bytes));
  if (p.device_is_host_memory) add("host: emulated device", bytes(p.device_bytes));
  add("host: minimum", bytes(p.min_host_bytes));
  if (p.disk_moment_chunks > 0) {
    add("disk: homed Adam moments", bytes(p.disk_bytes) + ", " + std::to_string(p.disk_moment_chunks) + " of " +
                                        std::to_string(p.num_chunks) + " chunks" +
                                        (p.disk_master_chunks > 0 ? " and the fp32 masters of " +
                                                                        std::to_string(p.disk_master_chunks) +
                                                                        " (16-bit param homes on the host)"
                                                                  : std::string()) +
                                        ", in " + p.disk_file + (p.world_size > 1 ? " (one file per rank)" : ""));
    add("disk: host windows", bytes(p.disk_window_bytes) + " (counted in host: overhead)");
  }
  return out;
}

}  // namespace pstar
