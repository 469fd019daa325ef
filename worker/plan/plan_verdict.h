// Whether a job's memory plan fits the budgets it would run with, and when it
// does not, each tier's shortfall and what would close it: `pstar plan`'s last
// lines (and its exit status), so that a user need not compare the minimums
// with the budgets by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/plan/memory_plan.h"
#include "worker/runtime/host_memory.h"

namespace pstar {

struct PlanVerdict {
  // One tier's budget against the plan's minimum for it.
  struct Tier {
    std::string tier;  // "device" or "host"
    int64_t need = 0, have = 0;
    std::string source;  // where `have` comes from
    bool fits() const { return need <= have; }
  };
  std::vector<Tier> checked;
  // Budgets not known here, one line each (a CUDA job's GPU share where no
  // GPU is seen).
  std::vector<std::string> unchecked;
  // What would make it fit, one line each; empty when it fits.
  std::vector<std::string> changes;

  bool fits() const;
};

// Judges `plan` (PlanMemory(config, world_size)) against the host budget one
// rank would be checked against (RankHostBudget) and the device tier it would
// run with (RankDeviceTierBytes: 0 on CUDA means no GPU was seen, so the
// device is unchecked). A host shortfall names runtime.host_memory, the disk
// tier and the world size that would each close it, planned again to say by
// how much; a what-if plan the planner refuses is not offered.
PlanVerdict JudgePlan(const Config& config, int world_size, const MemoryPlan& plan, const HostBudget& host,
                      int64_t device_tier_bytes);

// The verdict as `pstar plan` prints it: "verdict: fits ..." or
// "verdict: does not fit ..." and a "  change: ..." line per change.
std::string FormatVerdict(const PlanVerdict& verdict);

}  // namespace pstar
