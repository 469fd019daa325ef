// CPU-memory sizing of a job's pods from the worker's memory plan: what each
// pod requests and may use, what each rank's runtime is told it has, and
// whether any node can hold a pod at all. A job that cannot fit is reported
// with the numbers instead of being started into OOM kills.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operator/job/job_spec.h"

namespace pstar::op {

// Per pod: the `pstar launch` supervisor and page-cache slack for the config,
// logs and checkpoint writes that the kernel charges to the pod's cgroup.
constexpr int64_t kLauncherOverheadBytes = int64_t(512) << 20;

// Default /dev/shm per pod. NCCL keeps its shared-memory transport buffers
// and proxy state there (a base plus a few MiB per peer and channel), so a
// cuda pod gets kShmBaseBytes + kShmPerRankBytes per local rank; Gloo ranks
// talk over TCP and need little, so a cpu pod gets kShmCpuBytes.
constexpr int64_t kShmBaseBytes = int64_t(256) << 20;
constexpr int64_t kShmPerRankBytes = int64_t(64) << 20;
constexpr int64_t kShmCpuBytes = int64_t(64) << 20;

// Computed sizes are rounded up to whole MiB so quantities read well.
constexpr int64_t kSizingGranuleBytes = int64_t(1) << 20;

struct PodSizing {
  // From the memory plan (PlanMemory with the job's world size).
  int64_t parameters = 0;
  int64_t model_bytes = 0;  // every kind, as chunks, all ranks together
  int64_t chunk_bytes = 0;
  int32_t num_chunks = 0;   // per kind

  // Per rank: everything the host holds (min_host_bytes, plus the device tier
  // when a cpu job's tier lives in RAM), rounded up to a MiB.
  int64_t host_bytes_per_rank = 0;
  // Per rank: the device tier the config gets, and the least it can run in.
  int64_t device_bytes_per_rank = 0;
  int64_t min_device_bytes_per_rank = 0;
  // Per rank: what the disk tier homes (spec.diskTier), 0 without one.
  int64_t disk_bytes_per_rank = 0;

  // Per pod.
  int32_t ranks_per_pod = 1;
  int64_t shm_bytes = 0;                // /dev/shm (memory-backed, charged to the pod)
  int64_t launcher_overhead_bytes = 0;  // kLauncherOverheadBytes
  int64_t need_bytes = 0;     // ranks x host_bytes_per_rank + shm + launcher
  int64_t request_bytes = 0;  // the memory request (need, or the user's larger one)
  int64_t limit_bytes = 0;    // the memory limit (need x (1 + headroom), or the user's)
  bool request_fixed = false; // the request came from the spec, not the plan

  // Per rank: runtime.host_memory, the rank's share of the limit left after
  // the shm and launcher shares. At least host_bytes_per_rank.
  int64_t worker_host_budget_bytes = 0;
};

// Plans the job's memory and sizes its pods. Errors: the config cannot be
// planned, or a fixed request or limit (spec.hostMemory or the template's
// resources) is below the computed need; the message gives both numbers.
Result<PodSizing> SizePods(const JobSpec& spec);

struct NodeFit {
  bool fits = true;
  int eligible_nodes = 0;                 // schedulable, ready, selected, tolerated (and GPUs)
  std::string best_node;                  // the eligible node with the most allocatable memory
  int64_t largest_allocatable_bytes = 0;  // its allocatable memory
  int64_t needed_bytes = 0;               // the pod's memory request
  std::string message;                    // one line: why not, or how it fits
  // Why not, as a condition reason: InsufficientGPUs, NoMatchingNode (the
  // selector, affinity or taints rule every node out), NoReadyNode,
  // InsufficientHostMemory, or InsufficientNodes (each fits one pod, the
  // gang needs more of them); "NodesFit" when it fits.
  std::string reason = "NodesFit";
};

// Whether the job's pods can be placed on `nodes` (v1 Node objects), judged
// on nodeSelector and required node affinity, taints (NoSchedule and
// NoExecute) against the job's tolerations, unschedulable and NotReady
// nodes, allocatable memory against the request and, for cuda jobs,
// allocatable nvidia.com/gpu against nprocPerNode. The gang must fit as a
// whole: eligible nodes together must hold numNodes pods. Allocatable is an
// upper bound (other pods use some), so this catches jobs that can never run.
// With no nodes (e.g. no permission to list them) it fits, unchecked.
NodeFit CheckNodeFit(const JobSpec& spec, const PodSizing& sizing, const std::vector<Json>& nodes);

// status.memory: byte counts as quantities in one form, whole MiB rounded up
// and written "<n>Gi" or "<n>Mi" ("48Gi", "13284Mi"); counts as integers.
Json SizingStatus(const PodSizing& sizing);
std::string StatusQuantity(int64_t bytes);

// A count of bytes for people: one decimal, a trailing ".0" dropped
// ("37.5 GiB", "18 GiB", "512 MiB").
std::string HumanBytes(int64_t bytes);

// The pod's need spelt out: "37.5 GiB of host memory (2 ranks x 18 GiB +
// 1 GiB shm + 512 MiB launcher)".
std::string DescribePodNeed(const PodSizing& sizing);

}  // namespace pstar::op
