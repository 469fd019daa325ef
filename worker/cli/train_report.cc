// pstar train's printed lines: the job before the first step and the
// summary after the last.
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>

#include "worker/cli/train_command.h"
#include "worker/core/bytes.h"

namespace pstar::cli {

namespace {

int64_t LaterSteps(int64_t steps) { return steps > 1 ? steps - 1 : int64_t{1}; }

void PrintModel(const TrainingRank& rank, const Config& c) {
  const GptConfig& g = c.model.gpt;
  const ParamLayout& layout = rank.trainer->store().layout();
  std::printf("model: %lld layers, %lld heads, %lld wide, vocab %lld | %.2fM parameters in %d chunks of %lld elements\n",
              (long long)g.n_layer, (long long)g.n_head, (long long)g.n_embd, (long long)g.vocab_size,
              double(g.NumParameters()) / 1e6, layout.num_chunks(), (long long)layout.chunk_elems());
  std::printf("compute: %s | %s linear layers, fp32 accumulation and master weights%s%s\n",
              c.runtime.device == ComputeDevice::kCuda ? ("cuda, GPU " + std::to_string(rank.env.local_rank)).c_str()
                                                       : "cpu",
              PrecisionName(c.train.precision),
              c.train.precision == Precision::kFp16
                  ? (c.fp16.loss_scale > 0 ? ", static loss scale" : ", dynamic loss scale")
                  : "",
              c.train.grad_precision == GradPrecision::k16Bit
                  ? (", " + std::string(PrecisionName(c.train.precision)) + " gradients").c_str()
                  : "");
}

void PrintMemory(const TrainingRank& rank, const Config& c) {
  Trainer& t = *rank.trainer;
  const MemoryPlan& plan = t.plan();
  const ChunkManager& chunks = t.store().chunks();
  std::printf(
      "memory: model data %s, activations %s%s | device tier %s (%s), %d chunk slots, "
      "Adam moments of %d/%d chunks homed there, eviction %s, prefetch %lld | host budget %s (%s) | "
      "%d threads\n",
      FormatBytes(plan.model_bytes).c_str(), FormatBytes(plan.activation_bytes).c_str(),
      c.train.activation_checkpointing ? " (checkpointed)"
      : plan.gelu_outputs_kept         ? " (GELU outputs kept)"
                                       : "",
      FormatBytes(chunks.device_capacity_bytes()).c_str(),
      chunks.device_capacity_bytes() >= plan.all_resident_device_bytes ? "all resident" : "chunks move",
      chunks.device_slots(), chunks.device_adam_chunks(), chunks.num_chunks(), EvictionPolicyName(c.runtime.eviction),
      (long long)c.runtime.prefetch_depth, FormatBytes(t.host_budget().bytes).c_str(), t.host_budget().source.c_str(),
      omp_get_max_threads());
  if (const DiskTier* disk = chunks.disk(); disk != nullptr) {
    std::printf("disk tier: Adam moments of %d/%d chunks%s in %s, %s (%s), %s of host windows\n",
                chunks.disk_moment_chunks(), chunks.num_chunks(),
                chunks.disk_master_chunks() > 0
                    ? (", fp32 masters of " + std::to_string(chunks.disk_master_chunks())).c_str()
                    : "",
                disk->path().c_str(), FormatBytes(plan.disk_bytes).c_str(),
                disk->direct() ? "O_DIRECT" : "buffered: no O_DIRECT here", FormatBytes(disk->host_bytes()).c_str());
  }
}

void PrintData(const TrainingRank& rank, const Config& c) {
  const int64_t world = rank.env.world_size;
  if (rank.rows != nullptr) {
    std::printf("data: %s | %d ranks x batch %lld x %lld x %lld accum = %lld positions per step, the loss over the "
                "answers' tokens\n",
                rank.rows_note.c_str(), rank.env.world_size, (long long)c.train.batch_size, (long long)c.train.seq_len,
                (long long)c.train.grad_accum_steps,
                (long long)(world * c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps));
    if (rank.val_rows != nullptr) {
      std::printf("validation: %s | %lld batches every %lld steps\n", rank.val_rows_note.c_str(),
                  (long long)c.train.eval_batches, (long long)c.train.eval_every);
    }
    return;
  }
  std::printf("data: %lld tokens (tokenizer %s) | %d ranks x batch %lld x %lld x %lld accum = %lld tokens per step\n",
              (long long)rank.data->size(), c.data.tokenizer.c_str(), rank.env.world_size,
              (long long)c.train.batch_size, (long long)c.train.seq_len, (long long)c.train.grad_accum_steps,
              (long long)(world * c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps));
  if (rank.val_data != nullptr) {
    std::printf("validation: %lld tokens | %lld batches (%lld tokens) every %lld steps\n",
                (long long)rank.val_data->size(), (long long)c.train.eval_batches,
                (long long)(c.train.eval_batches * world * c.train.batch_size * c.train.seq_len),
                (long long)c.train.eval_every);
  }
}

// The optimizer: its host time (any thread), the step's waits for pending
// updates, and what speculation did.
void PrintOptimizer(const TrainingRank& rank, const Config& c) {
  Trainer& t = *rank.trainer;
  t.FinishUpdates();
  const Trainer::SpeculationTotals& sp = t.speculation_totals();
  std::printf("optimizer: overlap=%s host_adam_s=%.3f waited_for_updates_s=%.3f undo_chunks=%d "
              "speculated_steps=%lld speculated_chunks=%lld rolled_back_steps=%lld\n",
              OptimizerOverlapName(c.runtime.optimizer_overlap), sp.host_adam_seconds, sp.update_wait_seconds, t.undo_chunks(),
              (long long)sp.steps, (long long)sp.chunks, (long long)sp.rolled_back);
}

void PrintChunks(const ChunkManager& chunks, const TrafficAtWarmup& warmup, int64_t steps) {
  const RuntimeCounters& rc = chunks.counters();
  int64_t evictions = 0;
  for (const auto& e : rc.evictions) evictions += e;
  const int64_t later = LaterSteps(steps);
  const int64_t param_h2d = rc.moved_kind_bytes[0][size_t(StateKind::kParam)];
  std::printf("chunks: h2d_bytes=%lld d2h_bytes=%lld h2d_bytes_per_step=%lld d2h_bytes_per_step=%lld "
              "param_h2d_bytes_per_step=%lld "
              "evictions=%lld prefetches=%lld prefetch_hits=%lld peak_device_bytes=%lld trace_recordings=%lld\n",
              (long long)rc.moved_bytes[0].load(), (long long)rc.moved_bytes[1].load(),
              (long long)((rc.moved_bytes[0] - warmup.moved[0]) / later),
              (long long)((rc.moved_bytes[1] - warmup.moved[1]) / later),
              (long long)((param_h2d - warmup.param_h2d) / later), (long long)evictions,
              (long long)rc.prefetches.load(), (long long)rc.prefetch_hits.load(),
              (long long)chunks.peak_device_bytes(), (long long)chunks.trace_recordings());
  if (chunks.disk() != nullptr) {
    std::printf("disk: read_bytes=%lld written_bytes=%lld read_bytes_per_step=%lld written_bytes_per_step=%lld "
                "wait_s=%.3f\n",
                (long long)rc.disk_read_bytes.load(), (long long)rc.disk_written_bytes.load(),
                (long long)((rc.disk_read_bytes - warmup.disk_read) / later),
                (long long)((rc.disk_written_bytes - warmup.disk_written) / later), double(rc.disk_wait_ns) * 1e-9);
  }
}

// Bytes this rank sent per step after the warm-up step, against what ZeRO-3
// moves with ring collectives: each param chunk gathered for every forward
// and every backward, each grad chunk reduce-scattered once:
// (2*accum + 1) * (N-1)/N * param bytes. Chunks that stay resident are not
// gathered again, so a roomy device tier sends less.
void PrintCollectives(const TrainingRank& rank, const Config& c, const TrafficAtWarmup& warmup, int64_t steps) {
  const Communicator& comm = *rank.comm;
  const CollectiveCounters& cc = comm.counters();
  const ChunkManager& chunks = rank.trainer->store().chunks();
  const int64_t n = rank.env.world_size;
  const int64_t param_bytes = int64_t(rank.trainer->store().layout().num_chunks()) * chunks.chunk_bytes();
  const double zero3 = double(2 * c.train.grad_accum_steps + 1) * double(n - 1) / double(n) * double(param_bytes);
  int64_t sent = 0, ns = 0;
  std::string per_op;
  for (int op = 0; op < kNumCollectiveOps; ++op) {
    const int64_t b = (cc.bytes[size_t(op)].load() - warmup.collective[size_t(op)]) / LaterSteps(steps);
    sent += b;
    ns += cc.nanoseconds[size_t(op)].load();
    per_op += std::string(" ") + CollectiveOpName(CollectiveOp(op)) + "_bytes_per_step=" + std::to_string(b);
  }
  std::printf("collectives:%s sent_bytes_per_step=%lld zero3_bytes_per_step=%.0f ratio=%.3f seconds_total=%.3f "
              "waited_s=%.3f overlap=%s\n",
              per_op.c_str(), (long long)sent, zero3, zero3 > 0 ? double(sent) / zero3 : 0.0, double(ns) * 1e-9,
              double(comm.waited_nanoseconds()) * 1e-9, c.runtime.comm_overlap ? "on" : "off");
}

// The rank's peak resident memory against its plan: what the operator's pod
// sizing promised this rank (tests hold one to the other).
void PrintHostMemory(const Trainer& t) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  std::printf("host_memory: peak_rss_bytes=%lld planned_host_bytes=%lld\n", (long long)usage.ru_maxrss * 1024,
              (long long)t.plan().min_host_bytes);
}

}  // namespace

void PrintJob(const TrainingRank& rank, const Config& c, const std::string& config_path, int64_t first_step) {
  std::printf("pstar train: %s\n", config_path.empty() ? "built-in default job" : config_path.c_str());
  PrintModel(rank, c);
  PrintMemory(rank, c);
  PrintData(rank, c);
  if (first_step > 0) std::printf("resumed: from the checkpoint of step %lld\n", (long long)first_step);
  std::fflush(stdout);
}

TrafficAtWarmup ReadTrafficAtWarmup(const TrainingRank& rank) {
  // The step's collectives still queued (the next step's first gathers) are
  // counted with it, whenever the communicator's thread runs them.
  ChunkManager& chunks = rank.trainer->store().chunks();
  chunks.WaitCollectives();
  const RuntimeCounters& rc = chunks.counters();
  TrafficAtWarmup w;
  for (int d = 0; d < kNumDirections; ++d) w.moved[size_t(d)] = rc.moved_bytes[size_t(d)];
  w.param_h2d = rc.moved_kind_bytes[0][size_t(StateKind::kParam)];
  w.disk_read = rc.disk_read_bytes;
  w.disk_written = rc.disk_written_bytes;
  for (int op = 0; op < kNumCollectiveOps; ++op) w.collective[size_t(op)] = rank.comm->counters().bytes[size_t(op)];
  return w;
}

void PrintRunSummary(const TrainingRank& rank, const Config& c, const TrafficAtWarmup& warmup, int64_t steps) {
  PrintOptimizer(rank, c);
  ChunkManager& chunks = rank.trainer->store().chunks();
  chunks.WaitCollectives();  // the last step's queued ones, counted
  PrintChunks(chunks, warmup, steps);
  if (rank.env.world_size > 1) PrintCollectives(rank, c, warmup, steps);
  PrintHostMemory(*rank.trainer);
}

}  // namespace pstar::cli
