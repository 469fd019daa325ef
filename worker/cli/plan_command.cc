// pstar plan: the memory plan of a job, computed without allocating it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "worker/cli/commands.h"
#include "worker/core/bytes.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/plan_verdict.h"
#include "worker/plan/step_time_model.h"
#include "worker/train/step_payload.h"
#include "worker/train/trainer.h"

namespace pstar::cli {

namespace {

nlohmann::json PlanJson(const MemoryPlan& p) {
  nlohmann::json kinds = nlohmann::json::object();
  for (const KindPlan& k : p.kinds) kinds[StateKindName(k.kind)] = {{"chunks", k.chunks}, {"bytes", k.bytes}};
  return {{"world_size", p.world_size},
          {"parameters", p.parameters},
          {"tensors", p.tensors},
          {"row_parts", p.row_parts},
          {"chunk_elems", p.chunk_elems},
          {"chunk_bytes", p.chunk_bytes},
          {"chunks_per_kind", p.num_chunks},
          {"padding_elems", p.padding_elems},
          {"kinds", kinds},
          {"model_bytes", p.model_bytes},
          {"activation_bytes", p.activation_bytes},
          {"activation_format", p.activation_format},
          {"gelu_outputs_kept", p.gelu_outputs_kept},
          {"max_chunks_per_moment", p.max_chunks_per_moment},
          {"chunks_before_first_block", p.chunks_before_first_block},
          {"min_device_bytes", p.min_device_bytes},
          {"all_resident_device_bytes", p.all_resident_device_bytes},
          {"device_bytes", p.device_bytes},
          {"device_slots", p.device_slots},
          {"device_param_slots", p.device_param_slots},
          {"param_device", p.param_device},
          {"device_adam_chunks", p.device_adam_chunks},
          {"device_home_bytes", p.device_home_bytes},
          {"device_is_host_memory", p.device_is_host_memory},
          {"host_chunk_bytes", p.host_chunk_bytes},
          {"grad_home", p.grad_home},
          {"host_data_bytes", p.host_data_bytes},
          {"host_undo_bytes", p.host_undo_bytes},
          {"host_overhead_bytes", p.host_overhead_bytes},
          {"min_host_bytes", p.min_host_bytes},
          {"disk_moment_chunks", p.disk_moment_chunks},
          {"disk_master_chunks", p.disk_master_chunks},
          {"disk_bytes", p.disk_bytes},
          {"disk_window_bytes", p.disk_window_bytes},
          {"disk_file", p.disk_file}};
}

nlohmann::json VerdictJson(const PlanVerdict& v) {
  nlohmann::json tiers = nlohmann::json::array();
  for (const PlanVerdict::Tier& t : v.checked) {
    tiers.push_back({{"tier", t.tier},
                     {"need_bytes", t.need},
                     {"have_bytes", t.have},
                     {"source", t.source},
                     {"fits", t.fits()}});
  }
  return {{"fits", v.fits()}, {"tiers", tiers}, {"unchecked", v.unchecked}, {"changes", v.changes}};
}

// A flag's value: a whole number from 1 to 1,048,576, or a positive rate.
Result<double> NumberFlag(const std::string& flag, const std::string& v, bool whole) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  const bool number = !v.empty() && *end == '\0' && std::isfinite(x);
  if (whole && (!number || x < 1 || x > 1048576 || x != std::floor(x))) {
    return Status::InvalidArgument(flag + ": expected a whole number from 1 to 1048576, got '" + v + "'");
  }
  if (!whole && (!number || !(x > 0))) {
    return Status::InvalidArgument(flag + ": expected a positive number, got '" + v + "'");
  }
  return x;
}

// --scale --json: the cluster, the rates the model used (given or measured,
// with where), and one object per world size, times in seconds.
nlohmann::json ScalingJson(const ClusterSpec& spec, const std::vector<StepPrediction>& rows) {
  nlohmann::json rates = nlohmann::json::array();
  for (const MeasuredRate& r : MeasuredRates()) {
    const double given = GivenRate(spec, r);
    rates.push_back({{"name", r.name},
                     {"value", given > 0 ? given : r.value},
                     {"unit", r.unit},
                     {"source", given > 0 ? std::string("given") : std::string(r.source)}});
  }
  nlohmann::json out_rows = nlohmann::json::array();
  for (const StepPrediction& p : rows) {
    out_rows.push_back({{"gpus", p.gpus},
                        {"nodes", p.nodes},
                        {"fits", p.fits},
                        {"why_not", p.why_not},
                        {"parameters", p.parameters},
                        {"tokens_per_rank_per_step", p.tokens_per_rank},
                        {"compute_s", p.compute_s},
                        {"pcie_s", p.pcie_s},
                        {"collective_s", p.collective_s + p.collective_latency_s},
                        {"exposed_collective_s", p.exposed_collective_s},
                        {"adam_s", p.adam_s},
                        {"disk_s", p.disk_s},
                        {"all_gather_bytes_per_rank", p.gather_bytes},
                        {"reduce_scatter_bytes_per_rank", p.scatter_bytes},
                        {"step_sync_s", p.step_sync_s},
                        {"step_overlap_s", p.step_overlap_s},
                        {"tokens_per_s", p.tokens_per_s},
                        {"largest_layers", p.largest_layers},
                        {"largest_parameters", p.largest_parameters},
                        {"largest_capped", p.largest_capped}});
  }
  return {{"cluster",
           {{"nodes", spec.nodes},
            {"gpus_per_node", spec.gpus_per_node},
            {"intra_node_gbytes_per_s", spec.intra_node_gbytes_per_s},
            {"inter_node_gbits_per_s", spec.inter_node_gbits_per_s},
            {"link_efficiency", spec.link_efficiency},
            {"disk_gbytes_per_s", spec.disk_gbytes_per_s},
            {"gpu_memory_bytes", spec.gpu_memory_bytes},
            {"host_memory_bytes", spec.host_memory_bytes}}},
          {"rates", rates},
          {"rows", out_rows}};
}

// --world-size N: the plan of one of N data-parallel ranks. --scale and
// its flags: the step-time model for 1 GPU up to the cluster's.
struct PlanFlags {
  JobArgs job;
  int world_size = 1;
  bool world_size_given = false;
  bool scale = false;
  ClusterSpec spec;
  int64_t gpus = 0;  // --gpus: the cluster in GPUs, whole nodes
  std::vector<std::string> cluster_flags;
};

// One of the value flags (`flag` with its value `v`) into `f`.
Status SetPlanFlag(const std::string& flag, const std::string& v, PlanFlags* f) {
  if (flag == "--world-size") {
    f->world_size_given = true;
  } else {
    f->cluster_flags.push_back(flag);
  }
  ClusterSpec& spec = f->spec;
  if (flag == "--gpu-memory" || flag == "--host-memory") {
    auto bytes = ParseBytes(v);
    if (!bytes.ok() || *bytes <= 0) {
      return Status::InvalidArgument(flag + ": expected a positive byte count, got '" + v + "'");
    }
    (flag == "--gpu-memory" ? spec.gpu_memory_bytes : spec.host_memory_bytes) = *bytes;
    return Status::Ok();
  }
  const bool whole = flag == "--world-size" || flag == "--nodes" || flag == "--gpus" || flag == "--gpus-per-node";
  PSTAR_ASSIGN_OR_RETURN(const double x, NumberFlag(flag, v, whole));
  if (flag == "--world-size") {
    if (x > 65536) return Status::InvalidArgument("--world-size: expected a positive integer up to 65536, got '" + v + "'");
    f->world_size = int(x);
  } else if (flag == "--nodes") {
    spec.nodes = int64_t(x);
  } else if (flag == "--gpus") {
    f->gpus = int64_t(x);
  } else if (flag == "--gpus-per-node") {
    spec.gpus_per_node = int64_t(x);
  } else if (flag == "--intra-bw") {
    spec.intra_node_gbytes_per_s = x;
  } else if (flag == "--inter-bw") {
    spec.inter_node_gbits_per_s = x;
  } else if (flag == "--tflops") {
    spec.compute_tflops = x;
  } else if (flag == "--pcie-bw") {
    spec.pcie_gbytes_per_s = x;
  } else if (flag == "--adam-rate") {
    spec.host_adam_params_per_s = x;
  } else if (flag == "--disk-bw") {
    spec.disk_gbytes_per_s = x;
  }
  return Status::Ok();
}

// InvalidArgument (a usage error) naming the flag. Flags that would be
// ignored are refused: the cluster's without --scale, a rank's with it (the
// model plans every world size itself).
Result<PlanFlags> ParsePlanFlags(const std::vector<std::string>& args) {
  PlanFlags f;
  f.spec.nodes = 128;
  std::vector<std::string> rest;
  static const char* kValueFlags[] = {"--world-size", "--nodes",   "--gpus",      "--gpus-per-node",
                                      "--intra-bw",   "--inter-bw", "--tflops",    "--pcie-bw",
                                      "--adam-rate",  "--disk-bw",  "--gpu-memory", "--host-memory"};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--scale") {
      f.scale = true;
      continue;
    }
    bool known = false;
    for (const char* flag : kValueFlags) known = known || a == flag;
    if (!known) {
      rest.push_back(a);
      continue;
    }
    if (i + 1 >= args.size()) return Status::InvalidArgument(a + " needs a value");
    PSTAR_RETURN_IF_ERROR(SetPlanFlag(a, args[++i], &f));
  }
  PSTAR_ASSIGN_OR_RETURN(f.job, ParseJobArgs("plan", rest, {"--json", "--payload"}));
  if (!f.scale && !f.cluster_flags.empty()) return Status::InvalidArgument(f.cluster_flags.front() + " is a flag of --scale");
  if (f.scale && f.world_size_given) {
    return Status::InvalidArgument("--world-size: --scale plans every world size up to --gpus");
  }
  if (f.scale && f.job.Has("--payload")) {
    return Status::InvalidArgument("--payload: not with --scale (it counts one world size's bytes)");
  }
  const bool nodes_given = std::find(f.cluster_flags.begin(), f.cluster_flags.end(), "--nodes") != f.cluster_flags.end();
  if (nodes_given && f.gpus > 0) return Status::InvalidArgument("--gpus and --nodes: give one of them");
  return f;
}

// --scale: the step-time model for every world size up to the cluster's.
int PlanScaling(PlanFlags& f, const Config& config) {
  ClusterSpec& spec = f.spec;
  if (f.gpus > 0) {
    if (f.gpus % spec.gpus_per_node != 0) {
      return UsageError("--gpus: " + std::to_string(f.gpus) + " GPUs are not whole nodes of " +
                        std::to_string(spec.gpus_per_node) + " (--gpus-per-node)");
    }
    spec.nodes = f.gpus / spec.gpus_per_node;
  }
  if (Status valid = ValidateClusterSpec(spec); !valid.ok()) return UsageError(valid.message());
  auto rows = PredictScaling(config, spec);
  if (!rows.ok()) return ReportError(rows.status());
  if (f.job.Has("--json")) {
    std::printf("%s\n", ScalingJson(spec, *rows).dump(2).c_str());
  } else {
    std::fputs(FormatScaling(config, spec, *rows).c_str(), stdout);
  }
  return kExitOk;
}

void PrintRankPlan(bool json, const MemoryPlan& plan, const std::optional<StepPayload>& payload,
                   const PlanVerdict& verdict) {
  if (json) {
    nlohmann::json j = PlanJson(plan);
    j["verdict"] = VerdictJson(verdict);
    if (payload) {
      j["payload"] = {{"all_gather_bytes_per_step", payload->all_gather_bytes},
                      {"reduce_scatter_bytes_per_step", payload->reduce_scatter_bytes},
                      {"simulated_steps", payload->steps},
                      {"steady", payload->steady}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::fputs(FormatPlan(plan).c_str(), stdout);
  if (payload) {
    std::printf("payload: all_gather_bytes_per_step=%lld reduce_scatter_bytes_per_step=%lld per rank "
                "(the last of %lld steps run as rank 0 of %d%s)\n",
                (long long)payload->all_gather_bytes, (long long)payload->reduce_scatter_bytes,
                (long long)payload->steps, plan.world_size, payload->steady ? "" : "; the last two steps differed");
  }
  std::fputs(FormatVerdict(verdict).c_str(), stdout);
}

// One rank's plan with the device tier and host budget it would run with
// here (the trainer's functions), its payload under --payload, and the
// verdict: exit 1 when the job does not fit.
int PlanRank(const PlanFlags& f, const Config& config) {
  const int64_t device_tier = RankDeviceTierBytes(config, 0);
  auto plan = PlanMemory(config, f.world_size, device_tier);
  if (!plan.ok()) return ReportError(plan.status());
  // --payload: the collectives' bytes per step, counted by running the
  // job's chunk traffic as rank 0 (SimulateStepPayload).
  std::optional<StepPayload> payload;
  if (f.job.Has("--payload")) {
    if (f.world_size < 2) return UsageError("--payload needs --world-size of at least 2 (one rank sends nothing)");
    auto simulated = SimulateStepPayload(config, f.world_size);
    if (!simulated.ok()) return ReportError(simulated.status().WithPrefix("--payload"));
    payload = *simulated;
  }
  auto detected = DetectHostBudget(config.runtime.host_memory);
  if (!detected.ok()) return ReportError(detected.status());
  const HostBudget host = RankHostBudget(*detected, config.mem_tracer.overall_cpu_mem_ratio, 1);
  const PlanVerdict verdict = JudgePlan(config, f.world_size, *plan, host, device_tier);
  PrintRankPlan(f.job.Has("--json"), *plan, payload, verdict);
  return verdict.fits() ? kExitOk : kExitFailure;
}

}  // namespace

int PlanCommand(const std::vector<std::string>& args) {
  auto flags = ParsePlanFlags(args);
  if (!flags.ok()) return UsageError(flags.status().message());
  auto config = LoadJobConfig(flags->job);
  if (!config.ok()) return ReportError(config.status());
  return flags->scale ? PlanScaling(*flags, *config) : PlanRank(*flags, *config);
}

}  // namespace pstar::cli
