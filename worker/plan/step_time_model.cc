#include "worker/plan/step_time_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "worker/core/bytes.h"
#include "worker/model/gpt_config.h"
#include "worker/plan/memory_plan.h"

namespace pstar {

namespace {

constexpr int64_t kMaxGpus = int64_t(1) << 20;

// The measured rates, by name.
double Rate(const char* name) {
  for (const MeasuredRate& r : MeasuredRates()) {
    if (std::string(r.name) == name) return r.value;
  }
  return 0.0;
}

double Or(double value, const char* measured) { return value > 0.0 ? value : Rate(measured); }

}  // namespace

const std::vector<MeasuredRate>& MeasuredRates() {
  static const std::vector<MeasuredRate> kRates = {
      // 399,361 tok/s x (6 x 124.4M + 6 x 12 x 768 x 1024) FLOP per token,
      // on an H200: the H100's SMs and clocks, so its compute rate.
      {"compute_tflops", 320.8, "TFLOP/s",
       "bench/RESULTS.md, GPT-2 in GPU memory against PyTorch: the GPT-2 124M row (H200, 2026-11-28)"},
      {"pcie_gbytes_per_s", 55.0, "GB/s each way",
       "bench/RESULTS.md, Chunk transfer efficiency and overlap: the 1024 MiB H2D row (H100, PCIe gen 5, 2026-11-26)"},
      {"host_adam_params_per_s", 5.21e9, "parameters/s",
       "bench/RESULTS.md, CPU Adam against the memory bandwidth: the 16-thread row (the H100 host, 2026-11-26)"},
  };
  return kRates;
}

double GivenRate(const ClusterSpec& spec, const MeasuredRate& rate) {
  const std::string name = rate.name;
  if (name == "compute_tflops") return spec.compute_tflops;
  if (name == "pcie_gbytes_per_s") return spec.pcie_gbytes_per_s;
  if (name == "host_adam_params_per_s") return spec.host_adam_params_per_s;
  return 0.0;
}

Status ValidateClusterSpec(const ClusterSpec& s) {
  auto positive = [](double v, const char* flag) -> Status {
    if (!(v > 0.0) || !std::isfinite(v)) {
      return Status::InvalidArgument(std::string(flag) + ": must be a positive number, got " + std::to_string(v));
    }
    return Status::Ok();
  };
  if (s.nodes < 1) return Status::InvalidArgument("--nodes: must be at least 1, got " + std::to_string(s.nodes));
  if (s.gpus_per_node < 1) {
    return Status::InvalidArgument("--gpus-per-node: must be at least 1, got " + std::to_string(s.gpus_per_node));
  }
  if (s.gpus_per_node > kMaxGpus || s.nodes > kMaxGpus / s.gpus_per_node) {
    return Status::InvalidArgument("--nodes x --gpus-per-node: at most " + std::to_string(kMaxGpus) + " GPUs");
  }
  PSTAR_RETURN_IF_ERROR(positive(s.intra_node_gbytes_per_s, "--intra-bw"));
  PSTAR_RETURN_IF_ERROR(positive(s.inter_node_gbits_per_s, "--inter-bw"));
  PSTAR_RETURN_IF_ERROR(positive(s.disk_gbytes_per_s, "--disk-bw"));
  for (auto [v, flag] : {std::pair{s.compute_tflops, "--tflops"}, std::pair{s.pcie_gbytes_per_s, "--pcie-bw"},
                         std::pair{s.host_adam_params_per_s, "--adam-rate"}}) {
    if (v < 0.0 || !std::isfinite(v)) {
      return Status::InvalidArgument(std::string(flag) + ": must be a positive number, got " + std::to_string(v));
    }
  }
  if (s.gpu_memory_bytes <= 0) return Status::InvalidArgument("--gpu-memory: must be positive");
  if (s.host_memory_bytes <= 0) return Status::InvalidArgument("--host-memory: must be positive");
  return Status::Ok();
}

namespace {

// The job as it runs on `gpus` CUDA ranks of `spec`, whose device tier is
// GpuTierBytes of the spec's GPU (whatever runtime.device_memory says).
Config RankConfig(Config c, const ClusterSpec& spec, int64_t gpus) {
  c.runtime.device = ComputeDevice::kCuda;
  c.runtime.host_memory = spec.host_memory_bytes;
  return c;
}

// Whether the plan fits a device tier of `tier` bytes; the reason when not.
Result<MemoryPlan> FittingPlan(const Config& c, int64_t gpus, int64_t tier, std::string* why_not) {
  auto plan = PlanMemory(c, int(gpus), tier);
  if (!plan.ok()) {
    *why_not = plan.status().message();
    return plan.status();
  }
  if (plan->min_host_bytes > c.runtime.host_memory) {
    *why_not = "host needs " + FormatBytes(plan->min_host_bytes);
  } else if (plan->min_device_bytes > tier) {
    *why_not = "GPU needs " + FormatBytes(plan->min_device_bytes);
  } else {
    why_not->clear();
  }
  return plan;
}

// The most layers of `c`'s width whose plan fits `gpus` ranks (0: none), and
// their parameters. Host and device needs grow about linearly with the layers:
// two small plans estimate where they cross the budgets, and a binary search
// around the estimate finds the exact count with a few plans near it.
int64_t LargestLayers(const Config& c, int64_t gpus, int64_t tier, int64_t* parameters) {
  auto fits = [&](int64_t layers, MemoryPlan* out) {
    Config at = c;
    at.model.gpt.n_layer = layers;
    std::string why_not;
    auto plan = FittingPlan(at, gpus, tier, &why_not);
    if (!plan.ok()) return false;
    if (out != nullptr) *out = *plan;
    return why_not.empty();
  };
  MemoryPlan a, b;
  const int64_t l1 = 8, l2 = 24;
  fits(l1, &a);
  fits(l2, &b);
  int64_t estimate = kMaxLayers;
  auto bound = [&](double at_l1, double at_l2, double budget) {
    const double slope = (at_l2 - at_l1) / double(l2 - l1);
    if (slope <= 0) return;
    estimate = std::min<int64_t>(estimate, int64_t(double(l1) + (budget - at_l1) / slope));
  };
  if (a.num_chunks > 0 && b.num_chunks > 0) {
    bound(double(a.min_host_bytes), double(b.min_host_bytes), double(c.runtime.host_memory));
    bound(double(a.min_device_bytes), double(b.min_device_bytes), double(tier));
  }
  estimate = std::clamp<int64_t>(estimate, 1, kMaxLayers);
  int64_t lo = std::max<int64_t>(1, estimate - estimate / 4 - 8);
  int64_t hi = std::min<int64_t>(kMaxLayers, estimate + estimate / 4 + 8);
  if (!fits(lo, nullptr)) {
    hi = lo - 1;  // the estimate was high: the answer is below
    lo = 0;
  } else {
    while (fits(hi, nullptr)) {  // or low: gallop up
      lo = hi;
      if (hi == kMaxLayers) break;
      hi = std::min(kMaxLayers, 2 * hi);
    }
  }
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(mid, nullptr)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo > 0) {
    Config at = c;
    at.model.gpt.n_layer = lo;
    *parameters = at.model.gpt.NumParameters();
  }
  return lo;
}

}  // namespace

Result<StepPrediction> PredictStep(const Config& config, const ClusterSpec& spec, int64_t gpus) {
  PSTAR_RETURN_IF_ERROR(ValidateClusterSpec(spec));
  if (gpus < 1 || gpus > spec.gpus()) return Status::InvalidArgument("world size outside the cluster");
  StepPrediction p;
  p.gpus = gpus;
  p.nodes = (gpus + spec.gpus_per_node - 1) / spec.gpus_per_node;
  const Config c = RankConfig(config, spec, gpus);
  const int64_t tier = GpuTierBytes(c, spec.gpu_memory_bytes);
  std::string why_not;
  auto planned = FittingPlan(c, gpus, tier, &why_not);
  if (!planned.ok()) {
    p.why_not = why_not;
    return p;
  }
  const MemoryPlan& plan = *planned;
  p.fits = why_not.empty();
  p.why_not = why_not;
  p.parameters = plan.parameters;

  const GptConfig& g = c.model.gpt;
  const double n = double(gpus);
  const bool recompute = c.train.activation_checkpointing;
  const double per_param = recompute ? 8.0 : 6.0;  // the forward runs twice with checkpointing
  // An untied token embedding is a lookup, not a GEMM; attention's scores
  // and mixing run over the query heads' columns.
  const double gemm_params =
      double(plan.parameters) - (g.tied_embeddings ? 0.0 : double(g.vocab_size) * double(g.n_embd));
  const double flops_per_token =
      per_param * gemm_params + per_param * double(g.n_layer) * double(g.attn_width()) * double(c.train.seq_len);
  p.tokens_per_rank = double(c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps);
  p.compute_s = p.tokens_per_rank * flops_per_token / (Or(spec.compute_tflops, "compute_tflops") * 1e12);

  // Chunk traffic. Every chunk resident: params cross once a step (after
  // their update), else once per forward and backward of every micro-batch,
  // less the chunks the tier's slots keep over the turn from one to the
  // other: OPT keeps the forward's last chunks, which the backward uses
  // first, in every slot but the gradient chunks the turn pins. Those are
  // the last chunk's (the most one op pins, less its param, itself a kept
  // chunk) and, where the classifier's weight gradient is taken at the turn
  // (its logits recomputed there, Gpt::Backward), the tied embedding's
  // partial one. Within a chunk of what `pstar plan --payload` counts at
  // every budget of the shaped-network job.
  const double elements = double(plan.num_chunks) * double(plan.chunk_elems);
  const double param_bytes = plan.param_device == "fp32" ? 4.0 : 2.0;
  const double grad_bytes = plan.grad_home == "fp32" ? 4.0 : 2.0;
  const bool resident = plan.device_bytes >= plan.all_resident_device_bytes;
  const bool dlogits_kept = ClassifierKeepsLogits(g, c.train.batch_size * c.train.seq_len);
  const int64_t spare = plan.param_device == "fp32"
                            ? plan.device_streaming_slots - plan.max_chunks_per_moment + (dlogits_kept ? 1 : 0)
                            : plan.device_param_slots - 1;
  const double kept = double(std::clamp<int64_t>(spare, 0, plan.num_chunks));
  const double param_loads =
      resident ? double(plan.num_chunks) : double(c.train.grad_accum_steps) * (2.0 * double(plan.num_chunks) - kept);
  const double param_chunk = double(plan.chunk_elems) * param_bytes;
  const double host_updated = double(plan.num_chunks - plan.device_adam_chunks) / double(plan.num_chunks);
  double h2d = 0, d2h = 0, ends = 0, link_idle = 0;
  if (gpus == 1) {
    h2d = resident ? host_updated * elements * param_bytes : param_loads * param_chunk;
    d2h = (resident ? host_updated : 1.0) * elements * grad_bytes;
  } else {
    // Each rank copies its shard up and the ring gathers the rest.
    h2d = param_loads * param_chunk / n;
    d2h = elements / n * grad_bytes;
    p.gather_bytes = param_loads * (n - 1) / n * param_chunk;
    p.scatter_bytes = (n - 1) / n * elements * grad_bytes;
    const bool across = p.nodes > 1;
    const double bandwidth = across ? spec.inter_node_gbits_per_s * spec.link_efficiency / 8.0 * 1e9
                                    : spec.intra_node_gbytes_per_s * 1e9;
    p.collective_s = (p.gather_bytes + p.scatter_bytes) / bandwidth;
    const double collectives = param_loads + double(plan.num_chunks);
    const double hop = across ? spec.inter_latency_s : spec.intra_latency_s;
    p.collective_latency_s = collectives * (n - 1) * hop;
    // The chunk pipeline's ends: the step's first ops wait for their chunks'
    // gathers, which start only once the optimizer has updated them, and the
    // optimizer waits for the last gradient's reduce-scatter, which starts
    // only after the last backward op. Where compute binds, the gathers of
    // the chunks the first block's first GEMM reads (the embeddings' and its
    // own; nothing but the embeddings runs beside them) and one chunk's
    // reduce-scatter run with no compute beside them, whatever the overlap.
    const double first = double(std::max<int32_t>(1, plan.chunks_before_first_block));
    ends = (first * (n - 1) / n * param_chunk + p.scatter_bytes / double(plan.num_chunks)) / bandwidth +
           (first + 1.0) * (n - 1) * hop;
    // The turn from forward to backward: once the forward pass's last
    // gather is over, the link has nothing to send until the first gradient
    // chunk is final. The compute between is the last chunk's forward, the
    // classifier's forward and input gradient (and, with its logits
    // recomputed, those again and its weight gradient) and the last chunk's
    // backward (the chunks the backward pass needs first are on the device
    // already, and the other slots are held). Where the link binds, the step
    // is its work plus this idle turn (bench/zero_netns.sh's timelines). With
    // every chunk resident the gathers run at the step's start instead, and
    // the link waits for the pipeline's ends.
    if (!resident) {
      // Shares of the step's FLOPs: one classifier GEMM's, all of the classifier's.
      const double classifier_gemm = 2.0 * double(g.vocab_size) * double(g.n_embd) / flops_per_token;
      const double classifier = per_param * double(g.vocab_size) * double(g.n_embd) / flops_per_token;
      const double turn_gemms = dlogits_kept ? 2.0 : 4.0;
      p.turn_s = p.compute_s * (turn_gemms * classifier_gemm + (1.0 - classifier) / double(plan.num_chunks));
    }
    link_idle = resident ? ends : p.turn_s;
  }
  p.pcie_s = std::max(h2d, d2h) / (Or(spec.pcie_gbytes_per_s, "pcie_gbytes_per_s") * 1e9);
  p.adam_s = host_updated * elements / n / Or(spec.host_adam_params_per_s, "host_adam_params_per_s");
  p.disk_s = 2.0 * double(plan.disk_bytes) / (spec.disk_gbytes_per_s * 1e9);

  // Copies overlap compute (prefetch) and the optimizer overlaps it
  // (runtime.optimizer_overlap) in both; collectives overlap only in the
  // second (runtime.comm_overlap).
  const double comm = p.collective_s + p.collective_latency_s;
  const double beside = std::max(p.pcie_s, p.adam_s + p.disk_s);
  p.step_sync_s = p.compute_s + comm + std::max(0.0, beside - p.compute_s);
  p.pipeline_ends_s = ends;
  // Under compute the step is the compute and the pipeline's ends, or where
  // the link binds its work and the time it idles, whichever is longer.
  p.step_overlap_s = std::min(p.step_sync_s, std::max({p.compute_s + ends, comm + link_idle, beside + ends}));
  p.exposed_collective_s = std::max(0.0, p.step_overlap_s - std::max(p.compute_s, beside));
  p.tokens_per_s = p.step_overlap_s > 0 ? n * p.tokens_per_rank / p.step_overlap_s : 0.0;

  // The largest model of this width that fits this world size.
  p.largest_layers = LargestLayers(c, gpus, tier, &p.largest_parameters);
  p.largest_capped = p.largest_layers == kMaxLayers;
  return p;
}

Result<std::vector<StepPrediction>> PredictScaling(const Config& config, const ClusterSpec& spec) {
  PSTAR_RETURN_IF_ERROR(ValidateClusterSpec(spec));
  std::vector<StepPrediction> rows;
  for (int64_t g = 1; g <= spec.gpus(); g *= 2) {
    PSTAR_ASSIGN_OR_RETURN(StepPrediction p, PredictStep(config, spec, g));
    rows.push_back(std::move(p));
    if (g > spec.gpus() / 2 && g != spec.gpus()) {
      PSTAR_ASSIGN_OR_RETURN(StepPrediction last, PredictStep(config, spec, spec.gpus()));
      rows.push_back(std::move(last));
      break;
    }
  }
  return rows;
}

namespace {

// A cell of the table: fixed with `decimals` below `fixed_below`, else three
// significant digits (flags can make a term astronomically large).
std::string TableNumber(double v, int decimals, double fixed_below = 1e7) {
  char cell[48];
  if (std::isfinite(v) && std::fabs(v) < fixed_below) {
    std::snprintf(cell, sizeof cell, "%.*f", decimals, v);
  } else {
    std::snprintf(cell, sizeof cell, "%.3g", v);
  }
  return cell;
}

}  // namespace

std::string FormatScaling(const Config& config, const ClusterSpec& spec, const std::vector<StepPrediction>& rows) {
  std::string out;
  char line[512];
  const GptConfig& g = config.model.gpt;
  std::snprintf(line, sizeof line,
                "scale: %lld layers x width %lld, seq %lld, batch %lld x accum %lld per GPU, %s, "
                "activation checkpointing %s\n",
                (long long)g.n_layer, (long long)g.n_embd, (long long)config.train.seq_len,
                (long long)config.train.batch_size, (long long)config.train.grad_accum_steps,
                PrecisionName(config.train.precision), config.train.activation_checkpointing ? "on" : "off");
  out += line;
  std::snprintf(line, sizeof line,
                "cluster: up to %lld nodes x %lld GPUs of %s and %s of host memory per GPU; links %.0f GB/s within "
                "a node, %.0f Gbit/s between (modelled, %.0f%% achieved), disk %.1f GB/s (modelled)\n",
                (long long)spec.nodes, (long long)spec.gpus_per_node, FormatBytes(spec.gpu_memory_bytes).c_str(),
                FormatBytes(spec.host_memory_bytes).c_str(), spec.intra_node_gbytes_per_s,
                spec.inter_node_gbits_per_s, 100 * spec.link_efficiency, spec.disk_gbytes_per_s);
  out += line;
  for (const MeasuredRate& r : MeasuredRates()) {
    const double given = GivenRate(spec, r);
    if (given > 0) {
      std::snprintf(line, sizeof line, "rate: %s %g %s (given)\n", r.name, given, r.unit);
    } else {
      std::snprintf(line, sizeof line, "rate: %s %g %s (measured: %s)\n", r.name, r.value, r.unit, r.source);
    }
    out += line;
  }
  std::snprintf(line, sizeof line, "%6s %5s %10s %9s %9s %11s %9s %9s %11s %11s %13s %9s  %s\n", "GPUs", "nodes",
                "compute ms", "PCIe ms", "coll. ms", "exposed ms", "Adam ms", "disk ms", "step ms sync",
                "step ms ovl", "tokens/s ovl", "largest", "fits");
  out += line;
  for (const StepPrediction& p : rows) {
    char largest[32];
    std::snprintf(largest, sizeof largest, "%s%.1fB", p.largest_capped ? ">=" : "", double(p.largest_parameters) / 1e9);
    std::snprintf(line, sizeof line, "%6lld %5lld %10s %9s %9s %11s %9s %9s %11s %11s %13s %9s  ", (long long)p.gpus,
                  (long long)p.nodes, TableNumber(1e3 * p.compute_s, 1).c_str(), TableNumber(1e3 * p.pcie_s, 1).c_str(),
                  TableNumber(1e3 * (p.collective_s + p.collective_latency_s), 1).c_str(),
                  TableNumber(1e3 * p.exposed_collective_s, 1).c_str(), TableNumber(1e3 * p.adam_s, 1).c_str(),
                  TableNumber(1e3 * p.disk_s, 1).c_str(), TableNumber(1e3 * p.step_sync_s, 1).c_str(),
                  TableNumber(1e3 * p.step_overlap_s, 1).c_str(), TableNumber(p.tokens_per_s, 0, 1e12).c_str(),
                  largest);
    out += line;
    out += p.fits ? "yes" : "no: " + p.why_not;
    out += "\n";
  }
  out += "largest: the most layers of this width whose plan fits that many GPUs (ZeRO shards model data 1/N; "
         ">= at the 10000 layers a config takes); sync: collectives waited for as they start (runtime.comm_overlap false), ovl: under compute\n";
  return out;
}

}  // namespace pstar
