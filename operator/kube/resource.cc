#include "operator/kube/resource.h"

namespace pstar::op {

std::string ResourceRef::api_version() const { return group.empty() ? version : group + "/" + version; }

std::string ResourceRef::Path(const std::string& ns, const std::string& name,
                              const std::string& subresource) const {
  std::string path = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced && !ns.empty()) path += "/namespaces/" + ns;
  path += "/" + plural;
  if (!name.empty()) {
    path += "/" + name;
    if (!subresource.empty()) path += "/" + subresource;
  }
  return path;
}

const ResourceRef& Pods() {
  static const ResourceRef r{"", "v1", "pods", "Pod", true};
  return r;
}
const ResourceRef& Services() {
  static const ResourceRef r{"", "v1", "services", "Service", true};
  return r;
}
const ResourceRef& ConfigMaps() {
  static const ResourceRef r{"", "v1", "configmaps", "ConfigMap", true};
  return r;
}
const ResourceRef& Secrets() {
  static const ResourceRef r{"", "v1", "secrets", "Secret", true};
  return r;
}
const ResourceRef& NetworkPolicies() {
  static const ResourceRef r{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true};
  return r;
}
const ResourceRef& VolcanoPodGroups() {
  static const ResourceRef r{"scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", true};
  return r;
}
const ResourceRef& CoschedulingPodGroups() {
  static const ResourceRef r{"scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", true};
  return r;
}
const ResourceRef& Events() {
  static const ResourceRef r{"", "v1", "events", "Event", true};
  return r;
}
const ResourceRef& Nodes() {
  static const ResourceRef r{"", "v1", "nodes", "Node", false};
  return r;
}
const ResourceRef& Leases() {
  static const ResourceRef r{"coordination.k8s.io", "v1", "leases", "Lease", true};
  return r;
}
const ResourceRef& PatrickStarJobs() {
  static const ResourceRef r{"patrickstar.io", "v1alpha1", "patrickstarjobs", "PatrickStarJob", true};
  return r;
}

}  // namespace pstar::op
