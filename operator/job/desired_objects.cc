#include "operator/job/desired_objects.h"

#include "operator/job/worker_overrides.h"
#include "operator/job/yaml_emit.h"
#include "operator/kube/kube_config.h"
#include "operator/kube/quantity.h"

namespace pstar::op {

namespace {

Json EnvValue(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }

Json Metadata(const JobSpec& spec, const std::string& name, Json labels) {
  return {{"name", name},
          {"namespace", spec.ns},
          {"labels", std::move(labels)},
          {"ownerReferences", Json::array({OwnerReference(spec)})}};
}

// A quantity as Kubernetes serializes it: always a string.
Json QuantityValue(const Json& v) { return v.is_string() ? v : Json(v.dump()); }

// The user's resources with ours set over them: memory from the sizing, and
// one GPU per rank on cuda jobs.
Json Resources(const JobSpec& spec, const PodSizing& sizing) {
  Json r = Json::object();
  if (spec.overrides.resources.is_object()) {
    for (auto it = spec.overrides.resources.begin(); it != spec.overrides.resources.end(); ++it) {
      if (it.key() == "requests" || it.key() == "limits") {
        Json section = Json::object();
        for (auto q = it.value().begin(); q != it.value().end(); ++q) section[q.key()] = QuantityValue(q.value());
        r[it.key()] = std::move(section);
      } else {
        r[it.key()] = it.value();
      }
    }
  }
  r["requests"]["memory"] = FormatBytesQuantity(sizing.request_bytes);
  r["limits"]["memory"] = FormatBytesQuantity(sizing.limit_bytes);
  // A disk tier on an emptyDir lives on the node's ephemeral storage: the
  // scheduler must find room for it (unless the template asks for some).
  if (spec.disk_tier.enabled() && spec.disk_tier.volume_kind == "emptyDir" &&
      !r["requests"].contains("ephemeral-storage")) {
    r["requests"]["ephemeral-storage"] = FormatBytesQuantity(spec.disk_tier.size_bytes);
  }
  if (spec.device == JobDevice::kCuda) {
    const std::string gpus = std::to_string(spec.nproc_per_node);
    r["limits"]["nvidia.com/gpu"] = gpus;
    // Kubernetes requires requests == limits for extended resources.
    if (r["requests"].contains("nvidia.com/gpu")) r["requests"]["nvidia.com/gpu"] = gpus;
  }
  return r;
}

Json Env(const JobSpec& spec, int node_index, int attempt, const OperatorDefaults& defaults) {
  Json env = Json::array();
  env.push_back(EnvValue("NODE_RANK", std::to_string(node_index)));
  env.push_back(EnvValue("NNODES", std::to_string(spec.num_nodes)));
  env.push_back(EnvValue("NPROC_PER_NODE", std::to_string(spec.nproc_per_node)));
  env.push_back(EnvValue("WORLD_SIZE", std::to_string(spec.world_size())));
  env.push_back(EnvValue("MASTER_ADDR", MasterAddr(spec, defaults.cluster_domain)));
  env.push_back(EnvValue("MASTER_PORT", std::to_string(spec.master_port)));
  env.push_back(EnvValue("PSTAR_RDZV_ID", RdzvId(spec, attempt)));
  env.push_back(EnvValue("PSTAR_JOB_NAME", spec.name));
  env.push_back(EnvValue("PSTAR_NAMESPACE", spec.ns));
  // What Kubeflow's PyTorchJob gives torchrun (PET_*), for scripts that read them.
  env.push_back(EnvValue("PET_NNODES", std::to_string(spec.num_nodes)));
  env.push_back(EnvValue("PET_NPROC_PER_NODE", std::to_string(spec.nproc_per_node)));
  env.push_back(EnvValue("PET_NODE_RANK", std::to_string(node_index)));
  env.push_back(EnvValue("PET_MASTER_ADDR", MasterAddr(spec, defaults.cluster_domain)));
  env.push_back(EnvValue("PET_MASTER_PORT", std::to_string(spec.master_port)));
  // Optional: a Secret the operator could not make (RBAC without secrets)
  // leaves the ranks without a token rather than the pods unable to start.
  const Json token_ref = {{"name", StoreTokenSecretName(spec)}, {"key", kStoreTokenKey}, {"optional", true}};
  env.push_back({{"name", "PSTAR_STORE_TOKEN"}, {"valueFrom", {{"secretKeyRef", token_ref}}}});
  env.push_back({{"name", "POD_IP"},
                 {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "status.podIP"}}}}}});
  const NcclSpec& n = spec.nccl;
  if (!n.socket_ifname.empty()) env.push_back(EnvValue("NCCL_SOCKET_IFNAME", n.socket_ifname));
  if (n.ib_disable) env.push_back(EnvValue("NCCL_IB_DISABLE", *n.ib_disable ? "1" : "0"));
  if (!n.debug.empty()) env.push_back(EnvValue("NCCL_DEBUG", n.debug));
  for (const auto& [name, value] : n.env) env.push_back(EnvValue(name, value));
  for (const Json& e : spec.env) env.push_back(e);
  if (spec.overrides.env.is_array()) {
    for (const Json& e : spec.overrides.env) env.push_back(e);
  }
  return env;
}

// The job's own image, else the default for its device.
std::string WorkerImage(const JobSpec& spec, const OperatorDefaults& defaults) {
  if (!spec.image.empty()) return spec.image;
  if (spec.device == JobDevice::kCpu && !defaults.cpu_worker_image.empty()) return defaults.cpu_worker_image;
  return defaults.worker_image;
}

Json Args(const JobSpec& spec, const PodSizing& sizing) {
  Json args = {"launch",
               "--nproc-per-node", std::to_string(spec.nproc_per_node),
               "--nnodes", std::to_string(spec.num_nodes),
               "--node-rank", "$(NODE_RANK)",
               "--master-addr", "$(MASTER_ADDR)",
               "--master-port", "$(MASTER_PORT)",
               "--rdzv-id", "$(PSTAR_RDZV_ID)",
               "--",
               "train",
               "--config", kConfigPath};
  for (const WorkerOverride& o : WorkerOverrides(spec, &sizing)) {
    args.push_back("--set");
    args.push_back(o.Set());
  }
  return args;
}

}  // namespace

std::string ServiceName(const JobSpec& spec) { return spec.name; }
std::string ConfigMapName(const JobSpec& spec) { return spec.name + "-config"; }
std::string StoreTokenSecretName(const JobSpec& spec) { return spec.name + "-store-token"; }
std::string NetworkPolicyName(const JobSpec& spec) { return spec.name; }
std::string PodName(const JobSpec& spec, int node_index) { return spec.name + "-node-" + std::to_string(node_index); }

std::string MasterAddr(const JobSpec& spec, const std::string& cluster_domain) {
  return PodName(spec, 0) + "." + ServiceName(spec) + "." + spec.ns + ".svc." + cluster_domain;
}

std::string RdzvId(const JobSpec& spec, int attempt) {
  return (spec.uid.empty() ? spec.name : spec.uid) + "-" + std::to_string(attempt);
}

Json JobSelector(const JobSpec& spec) { return {{kJobNameLabel, spec.name}}; }

Json JobLabels(const JobSpec& spec) {
  return {{kJobNameLabel, spec.name}, {kAppNameLabel, kAppNameValue}, {kManagedByLabel, kManagedByValue}};
}

Json OwnerReference(const JobSpec& spec) {
  return {{"apiVersion", kApiVersion}, {"kind", kKind},       {"name", spec.name},
          {"uid", spec.uid},           {"controller", true}, {"blockOwnerDeletion", true}};
}

Json DesiredService(const JobSpec& spec) {
  Json ports = Json::array();
  ports.push_back({{"name", "rdzv"}, {"port", spec.master_port}, {"targetPort", spec.master_port}, {"protocol", "TCP"}});
  if (spec.metrics_port > 0) {
    ports.push_back(
        {{"name", "metrics"}, {"port", spec.metrics_port}, {"targetPort", spec.metrics_port}, {"protocol", "TCP"}});
  }
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", Metadata(spec, ServiceName(spec), JobLabels(spec))},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},
            {"selector", JobSelector(spec)},
            {"ports", std::move(ports)}}}};
}

Json DesiredConfigMap(const JobSpec& spec) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", Metadata(spec, ConfigMapName(spec), JobLabels(spec))},
          {"data", {{kConfigKey, JsonToYaml(spec.config)}}}};
}

Json DesiredStoreTokenSecret(const JobSpec& spec, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", Metadata(spec, StoreTokenSecretName(spec), JobLabels(spec))},
          {"type", "Opaque"},
          {"data", {{kStoreTokenKey, EncodeBase64(token)}}}};
}

Json DesiredNetworkPolicy(const JobSpec& spec, const NetworkPolicyOptions& options) {
  const Json job_pods = {{"matchLabels", JobSelector(spec)}};
  Json ingress = Json::array();
  ingress.push_back({{"from", Json::array({{{"podSelector", job_pods}}})}});
  if (spec.metrics_port > 0) {
    Json from = Json::array();
    if (!options.monitoring_namespace.empty()) {
      from.push_back({{"namespaceSelector",
                       {{"matchLabels", {{"kubernetes.io/metadata.name", options.monitoring_namespace}}}}}});
    }
    if (!options.operator_namespace.empty()) {
      Json operator_pods = {{"matchLabels", Json::object()}};
      for (const auto& [k, v] : options.operator_pod_labels) operator_pods["matchLabels"][k] = v;
      from.push_back({{"namespaceSelector",
                       {{"matchLabels", {{"kubernetes.io/metadata.name", options.operator_namespace}}}}},
                      {"podSelector", std::move(operator_pods)}});
    }
    Json port = {{"protocol", "TCP"}, {"port", spec.metrics_port}};
    // One metrics port per local rank.
    if (spec.nproc_per_node > 1) port["endPort"] = spec.metrics_port + spec.nproc_per_node - 1;
    if (!from.empty()) ingress.push_back({{"from", std::move(from)}, {"ports", Json::array({std::move(port)})}});
  }
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata", Metadata(spec, NetworkPolicyName(spec), JobLabels(spec))},
          {"spec",
           {{"podSelector", job_pods}, {"policyTypes", Json::array({"Ingress"})}, {"ingress", std::move(ingress)}}}};
}

Json DesiredPod(const JobSpec& spec, const PodSizing& sizing, int node_index, int attempt,
                const OperatorDefaults& defaults) {
  const PodOverrides& o = spec.overrides;
  // Labels: the user's, then ours over them.
  Json labels = o.labels.is_object() ? o.labels : Json::object();
  const Json ours = JobLabels(spec);
  for (auto it = ours.begin(); it != ours.end(); ++it) labels[it.key()] = it.value();
  labels[kNodeIndexLabel] = std::to_string(node_index);
  labels[kAttemptLabel] = std::to_string(attempt);
  if (!spec.run_policy.queue.empty()) labels[kQueueLabel] = spec.run_policy.queue;
  Json metadata = Metadata(spec, PodName(spec, node_index), std::move(labels));
  if (o.annotations.is_object() && !o.annotations.empty()) metadata["annotations"] = o.annotations;

  Json ports = Json::array();
  ports.push_back({{"name", "rdzv"}, {"containerPort", spec.master_port}, {"protocol", "TCP"}});
  if (spec.metrics_port > 0) {
    for (int i = 0; i < spec.nproc_per_node; ++i) {
      ports.push_back({{"name", "metrics-" + std::to_string(i)},
                       {"containerPort", spec.metrics_port + i},
                       {"protocol", "TCP"}});
    }
  }
  if (o.ports.is_array()) {
    for (const Json& p : o.ports) ports.push_back(p);
  }

  Json mounts = Json::array();
  mounts.push_back({{"name", kConfigVolume}, {"mountPath", kConfigDir}, {"readOnly", true}});
  mounts.push_back({{"name", kShmVolume}, {"mountPath", kShmDir}});
  if (o.volume_mounts.is_array()) {
    for (const Json& m : o.volume_mounts) mounts.push_back(m);
  }
  if (spec.disk_tier.enabled()) mounts.push_back({{"name", spec.disk_tier.volume}, {"mountPath", spec.disk_tier.mount_path}});
  Json volumes = Json::array();
  volumes.push_back({{"name", kConfigVolume}, {"configMap", {{"name", ConfigMapName(spec)}}}});
  volumes.push_back(
      {{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", FormatBytesQuantity(sizing.shm_bytes)}}}});
  if (o.volumes.is_array()) {
    for (const Json& v : o.volumes) volumes.push_back(v);
  }

  Json container = {{"name", kContainerName},
                    {"image", WorkerImage(spec, defaults)},
                    {"command", Json::array({defaults.pstar_command})},
                    {"args", Args(spec, sizing)},
                    {"env", Env(spec, node_index, attempt, defaults)},
                    {"ports", std::move(ports)},
                    {"resources", Resources(spec, sizing)},
                    {"volumeMounts", std::move(mounts)}};
  if (!spec.image_pull_policy.empty()) container["imagePullPolicy"] = spec.image_pull_policy;
  // What a Pod Security "restricted" namespace requires of a container, under
  // the user's own settings (theirs win key by key: an image that must run
  // as root says runAsNonRoot: false).
  Json security = {{"allowPrivilegeEscalation", false},
                   {"capabilities", {{"drop", Json::array({"ALL"})}}},
                   {"runAsNonRoot", true},
                   {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  if (o.security_context.is_object()) {
    for (auto it = o.security_context.begin(); it != o.security_context.end(); ++it) security[it.key()] = it.value();
  }
  container["securityContext"] = std::move(security);
  // The rest of the worker container as the template gives it (the image and
  // pull policy from there when spec.image names none).
  for (auto it = o.worker_fields.begin(); it != o.worker_fields.end(); ++it) {
    if (it.key() == "image" && !spec.image.empty()) continue;
    if (it.key() == "imagePullPolicy" && !spec.image_pull_policy.empty()) continue;
    if (it.key() == "image" || it.key() == "imagePullPolicy" || !container.contains(it.key())) {
      container[it.key()] = it.value();
    }
  }

  Json containers = Json::array({std::move(container)});
  for (const Json& sidecar : o.sidecars) containers.push_back(sidecar);
  Json pod_spec = {{"restartPolicy", "Never"},
                   {"hostname", PodName(spec, node_index)},
                   {"subdomain", ServiceName(spec)},
                   {"terminationGracePeriodSeconds", o.termination_grace_period_seconds},
                   {"containers", std::move(containers)},
                   {"volumes", std::move(volumes)}};
  if (o.node_selector.is_object()) pod_spec["nodeSelector"] = o.node_selector;
  if (o.tolerations.is_array()) pod_spec["tolerations"] = o.tolerations;
  if (o.affinity.is_object()) pod_spec["affinity"] = o.affinity;
  if (o.image_pull_secrets.is_array()) pod_spec["imagePullSecrets"] = o.image_pull_secrets;
  if (!o.service_account_name.empty()) pod_spec["serviceAccountName"] = o.service_account_name;
  if (!o.priority_class_name.empty()) pod_spec["priorityClassName"] = o.priority_class_name;
  if (!o.scheduler_name.empty()) pod_spec["schedulerName"] = o.scheduler_name;
  if (o.pod_security_context.is_object()) pod_spec["securityContext"] = o.pod_security_context;
  for (auto it = o.pod_fields.begin(); it != o.pod_fields.end(); ++it) pod_spec[it.key()] = it.value();

  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", std::move(metadata)}, {"spec", std::move(pod_spec)}};
}

Result<GangScheduler> ParseGangScheduler(const std::string& name) {
  if (name == "none" || name.empty()) return GangScheduler::kNone;
  if (name == "volcano") return GangScheduler::kVolcano;
  if (name == "scheduler-plugins") return GangScheduler::kSchedulerPlugins;
  if (name == "kueue") return GangScheduler::kKueue;
  return Status::InvalidArgument("gang scheduler '" + name +
                                 "' is not one of none, volcano, scheduler-plugins, kueue");
}

const char* GangSchedulerName(GangScheduler scheduler) {
  switch (scheduler) {
    case GangScheduler::kNone: return "none";
    case GangScheduler::kVolcano: return "volcano";
    case GangScheduler::kSchedulerPlugins: return "scheduler-plugins";
    case GangScheduler::kKueue: return "kueue";
  }
  return "none";
}

std::string GangApiGroupVersion(GangScheduler scheduler) {
  switch (scheduler) {
    case GangScheduler::kNone: return "";
    case GangScheduler::kVolcano: return "scheduling.volcano.sh/v1beta1";
    case GangScheduler::kSchedulerPlugins: return "scheduling.x-k8s.io/v1alpha1";
    case GangScheduler::kKueue: return "kueue.x-k8s.io/v1beta1";
  }
  return "";
}

std::string PodGroupName(const JobSpec& spec) { return spec.name; }

std::string KueuePodGroupName(const JobSpec& spec, int attempt) {
  return spec.name + "-" + std::to_string(attempt);
}

namespace {

int32_t MinMember(const JobSpec& spec) {
  return spec.run_policy.min_available > 0 ? spec.run_policy.min_available : spec.num_nodes;
}

// What `members` pods request together: memory from the sizing, the user's
// other requests (cpu, ...), and a GPU per rank on cuda jobs.
// A total that overflows is left out (the scheduler then does not pre-check it).
Json GangRequests(const JobSpec& spec, const PodSizing& sizing, int32_t members) {
  Json total = Json::object();
  int64_t product = 0;
  if (!__builtin_mul_overflow(sizing.request_bytes, int64_t(members), &product)) {
    total["memory"] = FormatBytesQuantity(product);
  }
  Json requests;
  if (spec.overrides.resources.is_object()) requests = spec.overrides.resources.value("requests", Json());
  if (requests.is_object()) {
    for (auto it = requests.begin(); it != requests.end(); ++it) {
      if (it.key() == "memory" || it.key() == "nvidia.com/gpu") continue;
      const std::string text = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
      const bool cpu = it.key() == "cpu";
      Result<int64_t> one = cpu ? ParseCpuMillis(text) : ParseQuantity(text);
      if (!one.ok() || __builtin_mul_overflow(*one, int64_t(members), &product)) continue;
      total[it.key()] = cpu ? std::to_string(product) + "m" : std::to_string(product);
    }
  }
  if (spec.device == JobDevice::kCuda) total["nvidia.com/gpu"] = std::to_string(int64_t(spec.nproc_per_node) * members);
  return total;
}

}  // namespace

Json DesiredPodGroup(const JobSpec& spec, const PodSizing& sizing, const GangSchedulingOptions& gang) {
  const int32_t members = MinMember(spec);
  Json group_spec = {{"minMember", members}, {"minResources", GangRequests(spec, sizing, members)}};
  if (gang.scheduler == GangScheduler::kVolcano) {
    if (!spec.run_policy.queue.empty()) group_spec["queue"] = spec.run_policy.queue;
    if (!spec.overrides.priority_class_name.empty()) group_spec["priorityClassName"] = spec.overrides.priority_class_name;
  }
  return {{"apiVersion", GangApiGroupVersion(gang.scheduler)},
          {"kind", "PodGroup"},
          {"metadata", Metadata(spec, PodGroupName(spec), JobLabels(spec))},
          {"spec", std::move(group_spec)}};
}

void ApplyGangScheduling(const JobSpec& spec, const GangSchedulingOptions& gang, int attempt, Json* pod) {
  Json& metadata = (*pod)["metadata"];
  Json& pod_spec = (*pod)["spec"];
  auto scheduler_name = [&](const char* usual) {
    if (!spec.overrides.scheduler_name.empty()) return;  // the job's own choice
    pod_spec["schedulerName"] = gang.scheduler_name.empty() ? usual : gang.scheduler_name;
  };
  switch (gang.scheduler) {
    case GangScheduler::kNone:
      return;
    case GangScheduler::kVolcano:
      metadata["annotations"][kVolcanoGroupAnnotation] = PodGroupName(spec);
      scheduler_name("volcano");
      return;
    case GangScheduler::kSchedulerPlugins:
      metadata["labels"][kCoschedulingGroupLabel] = PodGroupName(spec);
      scheduler_name("scheduler-plugins-scheduler");
      return;
    case GangScheduler::kKueue:
      metadata["labels"][kKueueQueueLabel] = spec.run_policy.queue.empty() ? "default" : spec.run_policy.queue;
      metadata["labels"][kKueuePodGroupLabel] = KueuePodGroupName(spec, attempt);
      metadata["annotations"][kKueueTotalCountAnnotation] = std::to_string(spec.num_nodes);
      // After the job's own gates, if any.
      if (!pod_spec["schedulingGates"].is_array()) pod_spec["schedulingGates"] = Json::array();
      pod_spec["schedulingGates"].push_back({{"name", kKueueAdmissionGate}});
      if (!gang.scheduler_name.empty() && spec.overrides.scheduler_name.empty()) {
        pod_spec["schedulerName"] = gang.scheduler_name;
      }
      return;
  }
}

}  // namespace pstar::op
