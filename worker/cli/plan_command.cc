// pstar plan: the memory plan of a job, computed without allocating it.
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "worker/cli/commands.h"
#include "worker/plan/memory_plan.h"

namespace pstar::cli {

namespace {

nlohmann::json PlanJson(const MemoryPlan& p) {
  nlohmann::json kinds = nlohmann::json::object();
  for (const KindPlan& k : p.kinds) kinds[StateKindName(k.kind)] = {{"chunks", k.chunks}, {"bytes", k.bytes}};
  return {{"world_size", p.world_size},
          {"parameters", p.parameters},
          {"tensors", p.tensors},
          {"chunk_elems", p.chunk_elems},
          {"chunk_bytes", p.chunk_bytes},
          {"chunks_per_kind", p.num_chunks},
          {"padding_elems", p.padding_elems},
          {"kinds", kinds},
          {"model_bytes", p.model_bytes},
          {"activation_bytes", p.activation_bytes},
          {"activation_format", p.activation_format},
          {"max_chunks_per_moment", p.max_chunks_per_moment},
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

}  // namespace

int PlanCommand(const std::vector<std::string>& args) {
  // --world-size N: the plan of one of N data-parallel ranks.
  int world_size = 1;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--world-size") {
      rest.push_back(args[i]);
      continue;
    }
    if (i + 1 >= args.size()) return UsageError("--world-size needs a value");
    const std::string& v = args[++i];
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > 65536) {
      return UsageError("--world-size: expected a positive integer, got '" + v + "'");
    }
    world_size = int(n);
  }
  auto job = ParseJobArgs("plan", rest, {"--json"});
  if (!job.ok()) return UsageError(job.status().message());
  auto config = LoadJobConfig(*job);
  if (!config.ok()) return ReportError(config.status());
  auto plan = PlanMemory(*config, world_size);
  if (!plan.ok()) return ReportError(plan.status());
  if (job->Has("--json")) {
    std::printf("%s\n", PlanJson(*plan).dump(2).c_str());
  } else {
    std::fputs(FormatPlan(*plan).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace pstar::cli
