// The objects a PatrickStarJob should own, computed from its spec: a headless
// Service (stable DNS for rank 0 and the metrics), a ConfigMap with the
// worker's config, a Secret with the rendezvous store's token, a
// NetworkPolicy (when enabled), and one pod per node running `pstar launch`. Names are
// deterministic so that creating twice is harmless (409 = already there), and
// the same input always gives identical JSON.
#pragma once

#include <map>
#include <string>

#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"

namespace pstar::op {

// Labels on every object the operator creates.
inline constexpr const char* kJobNameLabel = "patrickstar.io/job-name";
inline constexpr const char* kNodeIndexLabel = "patrickstar.io/node-index";
inline constexpr const char* kAttemptLabel = "patrickstar.io/attempt";
inline constexpr const char* kQueueLabel = "patrickstar.io/queue";  // runPolicy.schedulingPolicy.queue
inline constexpr const char* kAppNameLabel = "app.kubernetes.io/name";
inline constexpr const char* kAppNameValue = "pstar-worker";
inline constexpr const char* kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr const char* kManagedByValue = "pstar-operator";

inline constexpr const char* kApiVersion = "patrickstar.io/v1alpha1";
inline constexpr const char* kKind = "PatrickStarJob";

// The worker container and what is mounted into it.
inline constexpr const char* kContainerName = "worker";
inline constexpr const char* kConfigKey = "job.yaml";
inline constexpr const char* kConfigDir = "/etc/pstar";
inline constexpr const char* kConfigPath = "/etc/pstar/job.yaml";
inline constexpr const char* kConfigVolume = "pstar-config";
inline constexpr const char* kShmVolume = "dshm";
inline constexpr const char* kShmDir = "/dev/shm";

// The per-job NetworkPolicy: the job's pods reach each other on any port
// (the rendezvous, Gloo and NCCL, which use ephemeral ports); from outside
// the job only the metrics ports are open, to the monitoring namespace and to
// the operator's pods (it reads rank 0's progress there).
struct NetworkPolicyOptions {
  bool enabled = false;
  std::string monitoring_namespace = "monitoring";
  std::string operator_namespace;                       // "" = the operator is not let in
  std::map<std::string, std::string> operator_pod_labels;  // selects the operator's pods there
};

// Gang scheduling (--gang-scheduler): who places a job's pods all at once.
//   kVolcano           a scheduling.volcano.sh/v1beta1 PodGroup; pods go to
//                      the Volcano scheduler with the group annotation.
//   kSchedulerPlugins  a scheduling.x-k8s.io/v1alpha1 PodGroup (the
//                      coscheduling plugin); pods carry its pod-group label and
//                      go to the scheduler running that plugin.
//   kKueue             Kueue's pod-group integration: pods are created gated
//                      (kueue.x-k8s.io/admission) with the group's name and
//                      size; Kueue admits the whole group and lifts the gates.
// Each applies only while the cluster serves its API (the reconciler looks);
// otherwise pods are scheduled one by one, as with kNone.
enum class GangScheduler { kNone, kVolcano, kSchedulerPlugins, kKueue };

struct GangSchedulingOptions {
  GangScheduler scheduler = GangScheduler::kNone;
  // The pods' schedulerName; "" = the scheduler's usual one ("volcano",
  // "scheduler-plugins-scheduler"; Kueue pods keep the default scheduler).
  // A job's own spec.template.spec.schedulerName wins.
  std::string scheduler_name;
};

// "none", "volcano", "scheduler-plugins" or "kueue".
Result<GangScheduler> ParseGangScheduler(const std::string& name);
const char* GangSchedulerName(GangScheduler scheduler);
// The API group/version the scheduler's objects need served ("" for kNone).
std::string GangApiGroupVersion(GangScheduler scheduler);

// Kueue's names for its pod-group integration.
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
inline constexpr const char* kKueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name";
inline constexpr const char* kKueueTotalCountAnnotation = "kueue.x-k8s.io/pod-group-total-count";
inline constexpr const char* kKueueAdmissionGate = "kueue.x-k8s.io/admission";
// Volcano's pod annotation naming the group, and scheduler-plugins' label.
inline constexpr const char* kVolcanoGroupAnnotation = "scheduling.k8s.io/group-name";
inline constexpr const char* kCoschedulingGroupLabel = "scheduling.x-k8s.io/pod-group";

struct OperatorDefaults {
  std::string worker_image = "ghcr.io/patrickstar-k8s/pstar-worker:0.1.0";
  // The image of `device: cpu` jobs that name none (a build without CUDA);
  // empty: worker_image for them too.
  std::string cpu_worker_image;
  std::string cluster_domain = "cluster.local";
  std::string pstar_command = "pstar";  // the worker binary in the image
  NetworkPolicyOptions network_policy;
  GangSchedulingOptions gang;
};

// The key of the store token in the job's Secret.
inline constexpr const char* kStoreTokenKey = "token";

std::string ServiceName(const JobSpec& spec);                // <job>
std::string ConfigMapName(const JobSpec& spec);              // <job>-config
std::string PodName(const JobSpec& spec, int node_index);    // <job>-node-<i>
std::string StoreTokenSecretName(const JobSpec& spec);       // <job>-store-token
std::string NetworkPolicyName(const JobSpec& spec);          // <job>
// Rank 0's pod through the headless Service:
// <job>-node-0.<job>.<ns>.svc.<cluster_domain>.
std::string MasterAddr(const JobSpec& spec, const std::string& cluster_domain);
// The rendezvous id of one gang attempt: <uid>-<attempt>, so that the pods of
// a restarted gang never meet a stale one.
std::string RdzvId(const JobSpec& spec, int attempt);

// The labels selecting every pod of the job (job-name only).
Json JobSelector(const JobSpec& spec);
// The labels of the job's Service and ConfigMap.
Json JobLabels(const JobSpec& spec);

// Makes the job the controller owner of a child (garbage-collected with it).
Json OwnerReference(const JobSpec& spec);

Json DesiredService(const JobSpec& spec);
Json DesiredConfigMap(const JobSpec& spec);
// The rendezvous store's shared secret; `token` is made once per job by the
// reconciler (random) and kept for the job's life: pods read it through
// PSTAR_STORE_TOKEN.
Json DesiredStoreTokenSecret(const JobSpec& spec, const std::string& token);
Json DesiredNetworkPolicy(const JobSpec& spec, const NetworkPolicyOptions& options);
// The pod of node `node_index` (0..numNodes-1) in gang attempt `attempt` (0 first).
Json DesiredPod(const JobSpec& spec, const PodSizing& sizing, int node_index, int attempt,
                const OperatorDefaults& defaults = {});

// The job's PodGroup (<job>, one for every attempt) for kVolcano and
// kSchedulerPlugins: minMember from schedulingPolicy.minAvailable (default
// every pod), minResources the requests of that many pods, and for Volcano
// the queue and priority class.
std::string PodGroupName(const JobSpec& spec);
Json DesiredPodGroup(const JobSpec& spec, const PodSizing& sizing, const GangSchedulingOptions& gang);
// Kueue's pod group of one gang attempt: <job>-<attempt>, so a restarted gang
// is a new workload rather than a replacement of finished pods.
std::string KueuePodGroupName(const JobSpec& spec, int attempt);
// Makes `pod` (a DesiredPod of gang attempt `attempt`) part of its gang for
// the scheduler. Not part of the pod's spec hash: a scheduler installed or
// removed later does not restart running gangs.
void ApplyGangScheduling(const JobSpec& spec, const GangSchedulingOptions& gang, int attempt, Json* pod);

}  // namespace pstar::op
