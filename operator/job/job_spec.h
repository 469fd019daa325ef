// JobSpec: a PatrickStarJob's spec, parsed and validated. Parsing is pure (no
// API calls): the reconciler parses every job it sees and reports a spec it
// cannot run as a Failed condition whose message is ParseJob's error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/core/status.h"

namespace pstar::op {

using Json = nlohmann::json;

// What the ranks run on. kCuda requests one GPU per rank.
enum class JobDevice { kCuda, kCpu };

// Which pod-level overrides the user may give (spec.template). Each field is
// copied as given into every pod, so its shape is the Kubernetes one.
struct PodOverrides {
  Json labels = Json::object();       // metadata.labels (ours win on clashes)
  Json annotations = Json::object();  // metadata.annotations
  Json node_selector;                 // spec.nodeSelector (object) or null
  Json tolerations;                   // spec.tolerations (array) or null
  Json affinity;                      // spec.affinity (object) or null
  Json volumes;                       // spec.volumes (array) or null
  Json volume_mounts;                 // the worker container's volumeMounts (array) or null
  Json image_pull_secrets;            // spec.imagePullSecrets or null
  std::string service_account_name;   // "" = the namespace default
  std::string priority_class_name;    // "" = none (also from schedulingPolicy)
  std::string scheduler_name;         // "" = default
  // spec.terminationGracePeriodSeconds: the time a rank has after SIGTERM to
  // save its checkpoint (a large model needs more than the default).
  int32_t termination_grace_period_seconds = 30;
  Json pod_security_context;          // spec.securityContext (PodSecurityContext: fsGroup, ...) or null
  Json security_context;              // the container's securityContext or null
  Json resources;                     // the container's resources: extra requests/limits (cpu, ...)
  Json env;                           // extra container env (array of EnvVar) or null
  // Memory the user fixed in resources (0 = not given): the pod gets at least
  // this much, and less than the computed need is a sizing error.
  int64_t memory_request_bytes = 0;   // resources.requests.memory
  int64_t memory_limit_bytes = 0;     // resources.limits.memory
  // The rest of a PodTemplateSpec, passed through as given:
  Json pod_fields = Json::object();     // other PodSpec fields (hostNetwork, initContainers, ...)
  Json worker_fields = Json::object();  // the worker container's other fields (envFrom, probes, ...)
  Json ports;                           // the worker container's extra ports (array) or null
  Json sidecars = Json::array();        // containers other than the worker, as given
  // Where the worker container's fields were given, for messages.
  std::string worker_path = "spec.template.spec.containers[name=worker]";
};

// The name of the container that runs pstar in spec.template.spec.containers.
inline constexpr const char* kWorkerContainerName = "worker";

// PodSpec fields of spec.template.spec passed into every pod as given (the
// API server validates them), beside those the operator reads itself.
const std::vector<std::string>& PodSpecPassThroughFields();

struct NcclSpec {
  std::string socket_ifname;  // NCCL_SOCKET_IFNAME
  std::optional<bool> ib_disable;  // NCCL_IB_DISABLE
  std::string debug;          // NCCL_DEBUG
  std::map<std::string, std::string> env;  // any other NCCL_* variables
};

// Kubeflow-style run policy.
enum class CleanPodPolicy { kRunning, kAll, kNone };
enum class RestartPolicy { kExitCode, kOnFailure, kNever };

struct RunPolicy {
  int32_t backoff_limit = 3;                         // gang restarts before Failed
  std::optional<int64_t> active_deadline_seconds;    // from startTime
  std::optional<int64_t> ttl_seconds_after_finished; // delete the job this long after it ends
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
  bool suspend = false;
  RestartPolicy restart_policy = RestartPolicy::kExitCode;
  // With kExitCode: these exit codes fail the job at once; any other non-zero
  // code restarts the gang. 2 is pstar's exit code for bad input.
  std::vector<int32_t> permanent_exit_codes = {2};
  std::string priority_class;  // schedulingPolicy.priorityClass
  std::string queue;           // schedulingPolicy.queue (the batch scheduler's queue)
  // schedulingPolicy.minAvailable: pods the gang scheduler must place
  // together; 0 = every pod (numNodes).
  int32_t min_available = 0;
};

// How the pod's host memory is sized from the memory plan.
struct HostMemorySpec {
  // Fixed per-pod request and limit; 0 = computed from the plan.
  int64_t request_bytes = 0;
  int64_t limit_bytes = 0;
  // The limit is the computed need times (1 + headroom_percent / 100).
  int32_t headroom_percent = 10;
  // /dev/shm per pod; 0 = computed (NCCL buffers per rank).
  int64_t shm_bytes = 0;
};

// The disk tier (the worker's runtime.nvme_path): one of the pod template's
// volumes, mounted on the worker at mount_path; size_bytes is what the pod's
// ranks may take there together.
struct DiskTierSpec {
  std::string volume;  // "" = no disk tier
  std::string mount_path = "/var/lib/pstar/disk-tier";
  int64_t size_bytes = 0;
  // The volume's kind: "emptyDir", "ephemeral" or "hostPath".
  std::string volume_kind;
  bool enabled() const { return !volume.empty(); }
};

struct JobSpec {
  std::string name, ns, uid;
  int64_t generation = 0;
  int32_t num_nodes = 1;
  int32_t nproc_per_node = 1;
  JobDevice device = JobDevice::kCuda;
  std::string image;              // "" = the operator's default worker image
  std::string image_pull_policy;  // "" = Kubernetes' default
  Json config = Json::object();   // the worker's job config (pstar train --config)
  int32_t master_port = 29500;
  int32_t metrics_port = 9400;    // 0 = no metrics endpoint
  // spec.exportDir: where rank 0 exports the trained model as a Hugging Face
  // directory (the worker's checkpoint.export_dir); "" = none. It lies on a
  // volume the worker mounts writable.
  std::string export_dir;
  NcclSpec nccl;
  HostMemorySpec host_memory;
  DiskTierSpec disk_tier;
  RunPolicy run_policy;
  Json env = Json::array();       // spec.env: the user's EnvVars, after the operator's
  PodOverrides overrides;

  int32_t world_size() const { return num_nodes * nproc_per_node; }
};

// Parses and validates a PatrickStarJob object (the whole object: metadata is
// read for name, namespace, uid and generation). Errors are InvalidArgument
// with one line naming the field, e.g. "spec.numNodes must be at least 1".
// The worker config is checked by the worker's own config parser, so an
// unknown preset is reported here too.
Result<JobSpec> ParseJob(const Json& job);

// Environment variables the operator sets; spec.env and spec.nccl.env may not
// set them.
const std::vector<std::string>& ReservedEnvNames();

// Every spec field ParseJob reads, as dotted paths below spec ("numNodes",
// "nccl.socketIfname", "template.spec.nodeSelector"). Each is a leaf: a value,
// or a Kubernetes type passed through as given. The objects between (spec,
// spec.nccl, spec.template.spec, ...) take only the keys listed here; others
// are errors. The CRD schema must list exactly these leaves (a test checks).
const std::vector<std::string>& JobSpecFieldPaths();

// The longest job name whose pods' names ("<name>-node-<index>", up to
// num_nodes - 1) are still DNS labels (63 characters).
int MaxJobNameLength(int32_t num_nodes);

}  // namespace pstar::op
