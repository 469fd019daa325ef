// ResourceRef: which REST collection an object lives in, and the URL paths of
// its collection, objects and subresources.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace pstar::op {

using Json = nlohmann::json;

struct ResourceRef {
  std::string group;    // "" for the core API
  std::string version;  // "v1"
  std::string plural;   // "pods"
  std::string kind;     // "Pod"
  bool namespaced = true;

  // "v1" for core, else "group/version".
  std::string api_version() const;
  // "/api/v1/namespaces/ns/pods/name/status"; ns "" = all namespaces (or a
  // cluster-scoped resource), name "" = the collection.
  std::string Path(const std::string& ns, const std::string& name = "",
                   const std::string& subresource = "") const;
};

const ResourceRef& Pods();
const ResourceRef& Services();
const ResourceRef& ConfigMaps();
const ResourceRef& Secrets();
const ResourceRef& NetworkPolicies();   // networking.k8s.io/v1
const ResourceRef& Events();
const ResourceRef& Nodes();             // cluster-scoped
const ResourceRef& Leases();            // coordination.k8s.io/v1
const ResourceRef& PatrickStarJobs();   // patrickstar.io/v1alpha1
const ResourceRef& VolcanoPodGroups();       // scheduling.volcano.sh/v1beta1
const ResourceRef& CoschedulingPodGroups();  // scheduling.x-k8s.io/v1alpha1 (scheduler-plugins)

}  // namespace pstar::op
