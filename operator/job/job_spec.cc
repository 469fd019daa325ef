#include "operator/job/job_spec.h"

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include "operator/job/desired_objects.h"
#include "operator/kube/quantity.h"
#include "worker/config/config.h"

namespace pstar::op {

namespace {

constexpr int32_t kMaxWorldSize = 4096;
constexpr int kDnsLabelMax = 63;

// Volume names and mount paths the operator uses in every pod.
const char* const kReservedVolumes[] = {kConfigVolume, kShmVolume};
const char* const kReservedMountPaths[] = {kConfigDir, kShmDir};

std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_float: return "a fraction";
    default: return "a number";
  }
}

Status Invalid(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(path + " " + what);
}

// A JSON object being read: every read is against `path` ("spec.nccl"), and
// keys that are not in the field table are errors.
class Fields {
 public:
  Fields(const Json* object, std::string path) : object_(object), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  std::string Path(const std::string& key) const { return path_ + "." + key; }

  // The value of `key`, or nullptr when absent or null.
  const Json* Get(const std::string& key) const {
    if (object_ == nullptr) return nullptr;
    auto it = object_->find(key);
    if (it == object_->end() || it->is_null()) return nullptr;
    return &*it;
  }

  Result<std::optional<int64_t>> Int(const std::string& key, int64_t min, int64_t max) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer()) return Invalid(Path(key), "must be an integer, got " + Describe(*v));
    const int64_t n = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                          ? std::numeric_limits<int64_t>::max()
                          : v->get<int64_t>();
    if (n < min) return Invalid(Path(key), "must be at least " + std::to_string(min) + ", got " + std::to_string(n));
    if (n > max) return Invalid(Path(key), "must be at most " + std::to_string(max) + ", got " + std::to_string(n));
    return std::optional<int64_t>(n);
  }

  Status Int32(const std::string& key, int64_t min, int64_t max, int32_t* out) const {
    PSTAR_ASSIGN_OR_RETURN(std::optional<int64_t> n, Int(key, min, max));
    if (n) *out = int32_t(*n);
    return Status::Ok();
  }

  Status String(const std::string& key, std::string* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return Invalid(Path(key), "must be a string, got " + Describe(*v));
    *out = v->get<std::string>();
    return Status::Ok();
  }

  Status Bool(const std::string& key, std::optional<bool>* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Invalid(Path(key), "must be true or false, got " + Describe(*v));
    *out = v->get<bool>();
    return Status::Ok();
  }

  // One of `allowed`; `out` keeps its value when the key is absent.
  Status Enum(const std::string& key, const std::vector<std::string>& allowed, std::string* out) const {
    std::string value;
    PSTAR_RETURN_IF_ERROR(String(key, &value));
    if (Get(key) == nullptr) return Status::Ok();
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return Invalid(Path(key), "must be one of " + list + ", got '" + value + "'");
    }
    *out = value;
    return Status::Ok();
  }

  // A byte quantity given as a string ("64Gi") or a plain integer; 0 when absent.
  Status Quantity(const std::string& key, int64_t* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (v->is_number_integer()) {
      PSTAR_ASSIGN_OR_RETURN(std::optional<int64_t> n, Int(key, 0, std::numeric_limits<int64_t>::max()));
      *out = *n;
      return Status::Ok();
    }
    if (!v->is_string()) return Invalid(Path(key), "must be a quantity like \"64Gi\", got " + Describe(*v));
    auto bytes = ParseQuantity(v->get<std::string>());
    if (!bytes.ok()) return Status::InvalidArgument(Path(key) + ": " + bytes.status().message());
    *out = *bytes;
    return Status::Ok();
  }

  // A Kubernetes object passed through as given (null when absent).
  Status Object(const std::string& key, Json* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_object()) return Invalid(Path(key), "must be an object, got " + Describe(*v));
    *out = *v;
    return Status::Ok();
  }

  // An array of objects passed through as given (null when absent).
  Status ObjectArray(const std::string& key, Json* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_array()) return Invalid(Path(key), "must be an array, got " + Describe(*v));
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_object()) {
        return Invalid(Path(key) + "[" + std::to_string(i) + "]", "must be an object, got " + Describe((*v)[i]));
      }
    }
    *out = *v;
    return Status::Ok();
  }

  // A map of strings (labels, annotations, nodeSelector).
  Status StringMap(const std::string& key, Json* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_object()) return Invalid(Path(key), "must be a map of strings, got " + Describe(*v));
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it.value().is_string()) {
        return Invalid(Path(key) + "." + it.key(), "must be a string, got " + Describe(it.value()));
      }
    }
    *out = *v;
    return Status::Ok();
  }

  // The fields of a nested object (absent = an empty one).
  Result<Fields> Child(const std::string& key) const {
    const Json* v = Get(key);
    if (v != nullptr && !v->is_object()) return Invalid(Path(key), "must be an object, got " + Describe(*v));
    return Fields(v, Path(key));
  }

 private:
  const Json* object_;
  std::string path_;
};

// Keys of the object at spec.<table_prefix> that no field path starts with.
Status CheckKnownKeys(const Json& object, const std::string& table_prefix, const std::string& path) {
  if (!object.is_object()) return Status::Ok();
  std::set<std::string> allowed;
  for (const std::string& p : JobSpecFieldPaths()) {
    if (p.compare(0, table_prefix.size(), table_prefix) != 0) continue;
    const std::string rest = p.substr(table_prefix.size());
    allowed.insert(rest.substr(0, rest.find('.')));
  }
  if (table_prefix == "template.spec.") {
    for (const std::string& name : PodSpecPassThroughFields()) allowed.insert(name);
    for (const char* owned : {"hostname", "subdomain", "restartPolicy", "ephemeralContainers"}) {
      if (object.contains(owned)) {
        return Status::InvalidArgument(path + "." + owned +
                                       " is set by the operator (pods <job>-node-<i> in the job's Service, "
                                       "restartPolicy Never: the operator restarts the gang)");
      }
    }
  }
  std::string unknown;
  int count = 0;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (allowed.count(it.key())) continue;
    unknown += (unknown.empty() ? "" : ", ") + it.key();
    ++count;
  }
  if (count == 0) return Status::Ok();
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return Status::InvalidArgument(path + ": unknown field" + (count > 1 ? "s " : " ") + unknown +
                                 " (allowed: " + list + ")");
}

// Every object the field table gives fixed keys (spec, spec.nccl, ...),
// checked before anything is read so that a misspelt field is never ignored.
Status CheckAllKnownKeys(const Json& spec) {
  std::set<std::string> parents = {""};
  for (const std::string& p : JobSpecFieldPaths()) {
    for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1)) {
      parents.insert(p.substr(0, dot + 1));
    }
  }
  for (const std::string& parent : parents) {  // "" first, then "hostMemory.", ...
    const Json* v = &spec;
    size_t start = 0;
    while (v != nullptr && start < parent.size()) {
      const size_t dot = parent.find('.', start);
      const std::string key = parent.substr(start, dot - start);
      auto it = v->is_object() ? v->find(key) : v->end();
      v = v->is_object() && it != v->end() ? &*it : nullptr;
      start = dot + 1;
    }
    if (v == nullptr) continue;
    const std::string path = parent.empty() ? "spec" : "spec." + parent.substr(0, parent.size() - 1);
    PSTAR_RETURN_IF_ERROR(CheckKnownKeys(*v, parent, path));
  }
  return Status::Ok();
}

bool IsDns1035Label(const std::string& s) {
  if (s.empty() || s.size() > size_t(kDnsLabelMax)) return false;
  if (!(s.front() >= 'a' && s.front() <= 'z')) return false;
  if (s.back() == '-') return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

// A label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric.
bool IsLabelValue(const std::string& s) {
  if (s.size() > size_t(kDnsLabelMax)) return false;
  if (s.empty()) return true;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  for (char c : s) {
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

bool IsReserved(const std::string& name) {
  const auto& r = ReservedEnvNames();
  return std::find(r.begin(), r.end(), name) != r.end();
}

// An array of EnvVar: each with a name and a value or valueFrom. Names must
// not be reserved or repeated (`seen` spans spec.env, the template's env and
// spec.nccl).
Status CheckEnv(const Json& env, const std::string& path, std::set<std::string>* seen) {
  for (size_t i = 0; i < env.size(); ++i) {
    const Json& e = env[i];
    const std::string at = path + "[" + std::to_string(i) + "]";
    auto name = e.find("name");
    if (name == e.end() || !name->is_string() || name->get<std::string>().empty()) {
      return Invalid(at, "needs a name");
    }
    const std::string n = name->get<std::string>();
    if (n.find('=') != std::string::npos) return Invalid(at, "name '" + n + "' must not contain '='");
    if (IsReserved(n)) return Status::InvalidArgument(path + ": " + n + " is set by the operator");
    if (!seen->insert(n).second) return Status::InvalidArgument(path + ": " + n + " is set twice");
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() != "name" && it.key() != "value" && it.key() != "valueFrom") {
        return Invalid(at, "has unknown field " + it.key() + " (allowed: name, value, valueFrom)");
      }
    }
    auto value = e.find("value");
    if (value != e.end() && !value->is_null() && !value->is_string()) {
      return Invalid(at + ".value", "must be a string, got " + Describe(*value));
    }
    auto from = e.find("valueFrom");
    if (from != e.end() && !from->is_null() && !from->is_object()) {
      return Invalid(at + ".valueFrom", "must be an object, got " + Describe(*from));
    }
  }
  return Status::Ok();
}

Status ParseNccl(const Fields& spec, NcclSpec* nccl, std::set<std::string>* env_names) {
  PSTAR_ASSIGN_OR_RETURN(Fields f, spec.Child("nccl"));
  PSTAR_RETURN_IF_ERROR(f.String("socketIfname", &nccl->socket_ifname));
  PSTAR_RETURN_IF_ERROR(f.Bool("ibDisable", &nccl->ib_disable));
  PSTAR_RETURN_IF_ERROR(f.String("debug", &nccl->debug));
  if (!nccl->socket_ifname.empty()) env_names->insert("NCCL_SOCKET_IFNAME");
  if (nccl->ib_disable) env_names->insert("NCCL_IB_DISABLE");
  if (!nccl->debug.empty()) env_names->insert("NCCL_DEBUG");
  Json env;
  PSTAR_RETURN_IF_ERROR(f.StringMap("env", &env));
  if (env.is_object()) {
    for (auto it = env.begin(); it != env.end(); ++it) {
      const std::string& key = it.key();
      if (key.rfind("NCCL_", 0) != 0 || key.size() == 5) {
        return Invalid(f.Path("env") + "." + key, "is not an NCCL variable (names start with NCCL_)");
      }
      if (!env_names->insert(key).second) {
        return Status::InvalidArgument(f.Path("env") + ": " + key + " is also set by spec.nccl's own fields");
      }
      nccl->env[key] = it.value().get<std::string>();
    }
  }
  return Status::Ok();
}

Status ParseHostMemory(const Fields& spec, HostMemorySpec* m) {
  PSTAR_ASSIGN_OR_RETURN(Fields f, spec.Child("hostMemory"));
  PSTAR_RETURN_IF_ERROR(f.Quantity("request", &m->request_bytes));
  PSTAR_RETURN_IF_ERROR(f.Quantity("limit", &m->limit_bytes));
  PSTAR_RETURN_IF_ERROR(f.Int32("headroomPercent", 0, 1000, &m->headroom_percent));
  PSTAR_RETURN_IF_ERROR(f.Quantity("shmSize", &m->shm_bytes));
  if (m->request_bytes > 0 && m->limit_bytes > 0 && m->limit_bytes < m->request_bytes) {
    return Invalid(f.Path("limit"), FormatBytesQuantity(m->limit_bytes) + " is below spec.hostMemory.request " +
                                        FormatBytesQuantity(m->request_bytes));
  }
  return Status::Ok();
}

Status ParseDiskTier(const Fields& spec, DiskTierSpec* d) {
  PSTAR_ASSIGN_OR_RETURN(Fields f, spec.Child("diskTier"));
  PSTAR_RETURN_IF_ERROR(f.String("volume", &d->volume));
  PSTAR_RETURN_IF_ERROR(f.String("mountPath", &d->mount_path));
  PSTAR_RETURN_IF_ERROR(f.Quantity("size", &d->size_bytes));
  if (d->volume.empty()) {
    if (d->size_bytes > 0) return Invalid(f.Path("volume"), "is required with spec.diskTier.size");
    return Status::Ok();
  }
  if (d->size_bytes <= 0) {
    return Invalid(f.Path("size"), "is required: the bytes the pod's ranks may take on the volume (e.g. 500Gi)");
  }
  const std::string& m = d->mount_path;
  if (m.empty() || m[0] != '/' || m == "/" || m.find("..") != std::string::npos || m.rfind("/dev", 0) == 0 ||
      m.rfind("/etc/pstar", 0) == 0) {
    return Invalid(f.Path("mountPath"), "must be an absolute path of its own (not /, /dev or /etc/pstar), got '" + m +
                                            "'");
  }
  return Status::Ok();
}

// The disk tier's volume is one of the template's: on node-local or per-pod
// storage (emptyDir not in memory, a generic ephemeral volume, or hostPath),
// mounted by the operator alone.
Status CheckDiskTierVolume(DiskTierSpec* d, const PodOverrides& o) {
  if (!d->enabled()) return Status::Ok();
  const Json* volume = nullptr;
  if (o.volumes.is_array()) {
    for (const Json& v : o.volumes) {
      if (v.is_object() && v.value("name", "") == d->volume) volume = &v;
    }
  }
  if (volume == nullptr) {
    return Invalid("spec.diskTier.volume", "'" + d->volume + "' is not a volume of spec.template.spec.volumes");
  }
  for (const char* kind : {"emptyDir", "ephemeral", "hostPath"}) {
    if (volume->contains(kind)) d->volume_kind = kind;
  }
  if (d->volume_kind.empty()) {
    return Invalid("spec.diskTier.volume", "'" + d->volume +
                                               "' must be an emptyDir, a generic ephemeral volume or a hostPath "
                                               "(local disk for scratch files)");
  }
  if (d->volume_kind == "emptyDir") {
    const Json& e = (*volume)["emptyDir"];
    if (e.is_object() && e.value("medium", "") == "Memory") {
      return Invalid("spec.diskTier.volume", "'" + d->volume +
                                                 "' is an emptyDir in memory: the disk tier is there to spare "
                                                 "host memory; use a disk-backed volume");
    }
  }
  if (o.volume_mounts.is_array()) {
    for (const Json& mount : o.volume_mounts) {
      if (mount.is_object() && mount.value("name", "") == d->volume) {
        return Invalid(o.worker_path + ".volumeMounts", "mounts '" + d->volume +
                                                             "', the disk tier's volume; spec.diskTier.mountPath "
                                                             "mounts it");
      }
      if (mount.is_object() && mount.value("mountPath", "") == d->mount_path) {
        return Invalid(o.worker_path + ".volumeMounts", "already mounts something at " + d->mount_path +
                                                             " (spec.diskTier.mountPath)");
      }
    }
  }
  return Status::Ok();
}

Status ParseRunPolicy(const Fields& spec, RunPolicy* r) {
  PSTAR_ASSIGN_OR_RETURN(Fields f, spec.Child("runPolicy"));
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  PSTAR_RETURN_IF_ERROR(f.Int32("backoffLimit", 0, kMax32, &r->backoff_limit));
  PSTAR_ASSIGN_OR_RETURN(r->active_deadline_seconds, f.Int("activeDeadlineSeconds", 1, kMax64));
  PSTAR_ASSIGN_OR_RETURN(r->ttl_seconds_after_finished, f.Int("ttlSecondsAfterFinished", 0, kMax64));
  std::string clean = "Running";
  PSTAR_RETURN_IF_ERROR(f.Enum("cleanPodPolicy", {"Running", "All", "None"}, &clean));
  r->clean_pod_policy = clean == "All" ? CleanPodPolicy::kAll : clean == "None" ? CleanPodPolicy::kNone
                                                                                 : CleanPodPolicy::kRunning;
  std::optional<bool> suspend;
  PSTAR_RETURN_IF_ERROR(f.Bool("suspend", &suspend));
  r->suspend = suspend.value_or(false);
  std::string restart = "ExitCode";
  PSTAR_RETURN_IF_ERROR(f.Enum("restartPolicy", {"ExitCode", "OnFailure", "Never"}, &restart));
  r->restart_policy = restart == "OnFailure" ? RestartPolicy::kOnFailure
                      : restart == "Never"   ? RestartPolicy::kNever
                                             : RestartPolicy::kExitCode;
  if (const Json* codes = f.Get("permanentExitCodes")) {
    const std::string path = f.Path("permanentExitCodes");
    if (!codes->is_array()) return Invalid(path, "must be an array of exit codes, got " + Describe(*codes));
    r->permanent_exit_codes.clear();
    for (size_t i = 0; i < codes->size(); ++i) {
      const Json& c = (*codes)[i];
      const std::string at = path + "[" + std::to_string(i) + "]";
      if (!c.is_number_integer()) return Invalid(at, "must be an integer, got " + Describe(c));
      const int64_t code = c.get<int64_t>();
      if (code < 1 || code > 255) return Invalid(at, "must be an exit code from 1 to 255, got " + std::to_string(code));
      r->permanent_exit_codes.push_back(int32_t(code));
    }
  }
  PSTAR_ASSIGN_OR_RETURN(Fields sched, f.Child("schedulingPolicy"));
  PSTAR_RETURN_IF_ERROR(sched.String("priorityClass", &r->priority_class));
  PSTAR_RETURN_IF_ERROR(sched.String("queue", &r->queue));
  PSTAR_RETURN_IF_ERROR(sched.Int32("minAvailable", 1, kMax32, &r->min_available));
  if (!IsLabelValue(r->queue)) {
    return Invalid(sched.Path("queue"), "'" + r->queue + "' is not a valid label value (at most 63 of A-Z a-z 0-9 . _ -)");
  }
  return Status::Ok();
}

Status CheckVolumes(const Json& volumes, const std::string& path) {
  if (!volumes.is_array()) return Status::Ok();
  std::set<std::string> names;
  for (size_t i = 0; i < volumes.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    auto name = volumes[i].find("name");
    if (name == volumes[i].end() || !name->is_string() || name->get<std::string>().empty()) {
      return Invalid(at, "needs a name");
    }
    const std::string n = name->get<std::string>();
    for (const char* r : kReservedVolumes) {
      if (n == r) return Invalid(at, "name '" + n + "' is used by the operator");
    }
    if (!names.insert(n).second) return Invalid(at, "name '" + n + "' is used twice");
  }
  return Status::Ok();
}

Status CheckVolumeMounts(const Json& mounts, const std::string& path) {
  if (!mounts.is_array()) return Status::Ok();
  for (size_t i = 0; i < mounts.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    auto name = mounts[i].find("name");
    auto mount_path = mounts[i].find("mountPath");
    if (name == mounts[i].end() || !name->is_string()) return Invalid(at, "needs a name");
    if (mount_path == mounts[i].end() || !mount_path->is_string()) return Invalid(at, "needs a mountPath");
    std::string p = mount_path->get<std::string>();
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    for (const char* r : kReservedMountPaths) {
      if (p == r) return Invalid(at + ".mountPath", p + " is mounted by the operator");
    }
  }
  return Status::Ok();
}

// The container's resources: requests and limits maps whose values are
// quantities (strings or numbers). Memory is read out for sizing.
Status ParseResources(const Fields& container, PodOverrides* o) {
  PSTAR_RETURN_IF_ERROR(container.Object("resources", &o->resources));
  if (o->resources.is_null()) return Status::Ok();
  const std::string path = container.Path("resources");
  for (auto it = o->resources.begin(); it != o->resources.end(); ++it) {
    if (it.key() == "claims") continue;
    if (it.key() != "requests" && it.key() != "limits") {
      return Invalid(path, "has unknown field " + it.key() + " (allowed: requests, limits, claims)");
    }
    if (!it.value().is_object()) return Invalid(path + "." + it.key(), "must be an object");
    for (auto r = it.value().begin(); r != it.value().end(); ++r) {
      if (!r.value().is_string() && !r.value().is_number()) {
        return Invalid(path + "." + it.key() + "." + r.key(), "must be a quantity, got " + Describe(r.value()));
      }
    }
  }
  Fields resources(&o->resources, path);
  PSTAR_ASSIGN_OR_RETURN(Fields requests, resources.Child("requests"));
  PSTAR_ASSIGN_OR_RETURN(Fields limits, resources.Child("limits"));
  PSTAR_RETURN_IF_ERROR(requests.Quantity("memory", &o->memory_request_bytes));
  PSTAR_RETURN_IF_ERROR(limits.Quantity("memory", &o->memory_limit_bytes));
  return Status::Ok();
}

// The JSON type each passed-through field must have.
enum class PassType { kBool, kString, kInt, kObject, kArray };

const std::vector<std::pair<std::string, PassType>>& PodSpecPassThroughTypes() {
  static const std::vector<std::pair<std::string, PassType>> kFields = {
      {"activeDeadlineSeconds", PassType::kInt},    {"automountServiceAccountToken", PassType::kBool},
      {"dnsConfig", PassType::kObject},             {"dnsPolicy", PassType::kString},
      {"enableServiceLinks", PassType::kBool},      {"hostAliases", PassType::kArray},
      {"hostIPC", PassType::kBool},                 {"hostNetwork", PassType::kBool},
      {"hostPID", PassType::kBool},                 {"hostUsers", PassType::kBool},
      {"initContainers", PassType::kArray},         {"nodeName", PassType::kString},
      {"os", PassType::kObject},                    {"overhead", PassType::kObject},
      {"preemptionPolicy", PassType::kString},      {"priority", PassType::kInt},
      {"readinessGates", PassType::kArray},         {"resourceClaims", PassType::kArray},
      {"resources", PassType::kObject},             {"runtimeClassName", PassType::kString},
      {"schedulingGates", PassType::kArray},        {"setHostnameAsFQDN", PassType::kBool},
      {"shareProcessNamespace", PassType::kBool},   {"topologySpreadConstraints", PassType::kArray},
  };
  return kFields;
}

// Container fields passed through on the worker container as given.
const std::vector<std::pair<std::string, PassType>>& WorkerPassThroughTypes() {
  static const std::vector<std::pair<std::string, PassType>> kFields = {
      {"envFrom", PassType::kArray},       {"lifecycle", PassType::kObject},
      {"livenessProbe", PassType::kObject}, {"readinessProbe", PassType::kObject},
      {"startupProbe", PassType::kObject},  {"resizePolicy", PassType::kArray},
      {"stdin", PassType::kBool},           {"stdinOnce", PassType::kBool},
      {"tty", PassType::kBool},             {"terminationMessagePath", PassType::kString},
      {"terminationMessagePolicy", PassType::kString}, {"volumeDevices", PassType::kArray},
      {"workingDir", PassType::kString},
  };
  return kFields;
}

Status CheckPassType(const Json& v, PassType type, const std::string& path) {
  bool ok = false;
  const char* want = "";
  switch (type) {
    case PassType::kBool: ok = v.is_boolean(); want = "true or false"; break;
    case PassType::kString: ok = v.is_string(); want = "a string"; break;
    case PassType::kInt: ok = v.is_number_integer(); want = "an integer"; break;
    case PassType::kObject: ok = v.is_object(); want = "an object"; break;
    case PassType::kArray: ok = v.is_array(); want = "an array"; break;
  }
  if (!ok) return Invalid(path, std::string("must be ") + want + ", got " + Describe(v));
  if (type == PassType::kArray) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_object()) {
        return Invalid(path + "[" + std::to_string(i) + "]", "must be an object, got " + Describe(v[i]));
      }
    }
  }
  return Status::Ok();
}

// The worker container's fields, from spec.template.spec.containers[worker]
// or the older spec.template.container (both: an error).
Status ParseWorkerContainer(const Json& container, const std::string& path, const std::string& spec_image,
                            PodOverrides* o, std::set<std::string>* env_names) {
  o->worker_path = path;
  static const std::set<std::string> kRead = {"name",           "image",     "imagePullPolicy", "volumeMounts",
                                              "securityContext", "resources", "env",            "ports"};
  for (auto it = container.begin(); it != container.end(); ++it) {
    const std::string& key = it.key();
    if (key == "command" || key == "args") {
      return Invalid(path + "." + key, "is set by the operator (pstar launch ... -- train); put the worker's "
                                       "settings in spec.config");
    }
    if (kRead.count(key)) continue;
    const auto& pass = WorkerPassThroughTypes();
    auto found = std::find_if(pass.begin(), pass.end(), [&](const auto& f) { return f.first == key; });
    if (found == pass.end()) return Invalid(path, "has unknown field " + key);
    if (it.value().is_null()) continue;
    PSTAR_RETURN_IF_ERROR(CheckPassType(it.value(), found->second, path + "." + key));
    o->worker_fields[key] = it.value();
  }
  Fields c(&container, path);
  std::string image;
  PSTAR_RETURN_IF_ERROR(c.String("image", &image));
  if (!image.empty() && !spec_image.empty() && image != spec_image) {
    return Invalid(path + ".image", "'" + image + "' conflicts with spec.image '" + spec_image + "'");
  }
  if (!image.empty()) o->worker_fields["image"] = image;
  std::string pull_policy;
  PSTAR_RETURN_IF_ERROR(c.Enum("imagePullPolicy", {"Always", "IfNotPresent", "Never"}, &pull_policy));
  if (!pull_policy.empty()) o->worker_fields["imagePullPolicy"] = pull_policy;
  PSTAR_RETURN_IF_ERROR(c.ObjectArray("volumeMounts", &o->volume_mounts));
  PSTAR_RETURN_IF_ERROR(CheckVolumeMounts(o->volume_mounts, c.Path("volumeMounts")));
  PSTAR_RETURN_IF_ERROR(c.Object("securityContext", &o->security_context));
  PSTAR_RETURN_IF_ERROR(ParseResources(c, o));
  PSTAR_RETURN_IF_ERROR(c.ObjectArray("env", &o->env));
  if (o->env.is_array()) PSTAR_RETURN_IF_ERROR(CheckEnv(o->env, c.Path("env"), env_names));
  PSTAR_RETURN_IF_ERROR(c.ObjectArray("ports", &o->ports));
  if (o->ports.is_array()) {
    for (size_t i = 0; i < o->ports.size(); ++i) {
      const std::string name = o->ports[i].value("name", "");
      if (name == "rdzv" || name.rfind("metrics-", 0) == 0) {
        return Invalid(c.Path("ports") + "[" + std::to_string(i) + "].name",
                       "'" + name + "' is the operator's (rdzv, metrics-<local rank>)");
      }
    }
  }
  return Status::Ok();
}

Status ParseTemplate(const Fields& spec, PodOverrides* o, std::set<std::string>* env_names) {
  PSTAR_ASSIGN_OR_RETURN(Fields t, spec.Child("template"));
  PSTAR_ASSIGN_OR_RETURN(Fields meta, t.Child("metadata"));
  PSTAR_RETURN_IF_ERROR(meta.StringMap("labels", &o->labels));
  PSTAR_RETURN_IF_ERROR(meta.StringMap("annotations", &o->annotations));
  if (o->labels.is_null()) o->labels = Json::object();
  if (o->annotations.is_null()) o->annotations = Json::object();
  for (auto it = o->labels.begin(); it != o->labels.end(); ++it) {
    if (!IsLabelValue(it.value().get<std::string>())) {
      return Invalid(meta.Path("labels") + "." + it.key(), "'" + it.value().get<std::string>() +
                                                               "' is not a valid label value");
    }
  }

  PSTAR_ASSIGN_OR_RETURN(Fields pod, t.Child("spec"));
  PSTAR_RETURN_IF_ERROR(pod.StringMap("nodeSelector", &o->node_selector));
  PSTAR_RETURN_IF_ERROR(pod.ObjectArray("tolerations", &o->tolerations));
  PSTAR_RETURN_IF_ERROR(pod.Object("affinity", &o->affinity));
  PSTAR_RETURN_IF_ERROR(pod.ObjectArray("volumes", &o->volumes));
  PSTAR_RETURN_IF_ERROR(CheckVolumes(o->volumes, pod.Path("volumes")));
  PSTAR_RETURN_IF_ERROR(pod.ObjectArray("imagePullSecrets", &o->image_pull_secrets));
  PSTAR_RETURN_IF_ERROR(pod.String("serviceAccountName", &o->service_account_name));
  PSTAR_RETURN_IF_ERROR(pod.String("priorityClassName", &o->priority_class_name));
  PSTAR_RETURN_IF_ERROR(pod.String("schedulerName", &o->scheduler_name));
  PSTAR_RETURN_IF_ERROR(
      pod.Int32("terminationGracePeriodSeconds", 0, 7 * 24 * 3600, &o->termination_grace_period_seconds));
  PSTAR_RETURN_IF_ERROR(pod.Object("securityContext", &o->pod_security_context));
  for (const auto& [name, type] : PodSpecPassThroughTypes()) {
    const Json* v = pod.Get(name);
    if (v == nullptr) continue;
    PSTAR_RETURN_IF_ERROR(CheckPassType(*v, type, pod.Path(name)));
    o->pod_fields[name] = *v;
  }

  // The worker container: containers[name=worker] (a PodTemplateSpec, as in
  // a PyTorchJob), or the older `container` object; other containers are
  // sidecars, passed through.
  std::string spec_image;
  PSTAR_RETURN_IF_ERROR(spec.String("image", &spec_image));
  Json containers;
  PSTAR_RETURN_IF_ERROR(pod.ObjectArray("containers", &containers));
  const Json* worker = nullptr;
  std::string worker_path;
  std::set<std::string> names;
  if (containers.is_array()) {
    for (size_t i = 0; i < containers.size(); ++i) {
      const std::string at = pod.Path("containers") + "[" + std::to_string(i) + "]";
      const Json& c = containers[i];
      auto name = c.find("name");
      if (name == c.end() || !name->is_string() || name->get<std::string>().empty()) {
        return Invalid(at + ".name", "is required");
      }
      if (!names.insert(name->get<std::string>()).second) {
        return Invalid(at + ".name", "'" + name->get<std::string>() + "' is used twice");
      }
      if (*name == kWorkerContainerName) {
        worker = &c;
        worker_path = at;
      } else {
        auto image = c.find("image");
        if (image == c.end() || !image->is_string() || image->get<std::string>().empty()) {
          return Invalid(at + ".image", "is required (a sidecar runs its own image)");
        }
        o->sidecars.push_back(c);
      }
    }
  }
  const Json* old = t.Get("container");
  if (old != nullptr && !old->is_object()) return Invalid(t.Path("container"), "must be an object, got " + Describe(*old));
  if (old != nullptr && worker != nullptr) {
    return Invalid(t.Path("container"), "and " + worker_path + " (the worker container) are two forms of one thing: "
                                        "keep spec.template.spec.containers[name=worker]");
  }
  if (worker != nullptr) return ParseWorkerContainer(*worker, worker_path, spec_image, o, env_names);
  if (old != nullptr) {
    // The form before spec.template became a PodTemplateSpec: the same
    // fields (CheckAllKnownKeys allowed only env, resources, securityContext
    // and volumeMounts there).
    Json converted = *old;
    converted["name"] = kWorkerContainerName;
    return ParseWorkerContainer(converted, t.Path("container"), spec_image, o, env_names);
  }
  return Status::Ok();
}

int Digits(int64_t n) {
  int d = 1;
  while (n >= 10) {
    n /= 10;
    ++d;
  }
  return d;
}

}  // namespace

const std::vector<std::string>& ReservedEnvNames() {
  static const std::vector<std::string> kNames = {
      "RANK",   "WORLD_SIZE", "LOCAL_RANK",     "LOCAL_WORLD_SIZE", "MASTER_ADDR",     "MASTER_PORT", "PSTAR_RDZV_ID",
      "NODE_RANK", "NNODES",  "NPROC_PER_NODE", "PSTAR_JOB_NAME",   "PSTAR_NAMESPACE", "POD_IP",
      "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
      "PSTAR_STORE_TOKEN"};
  return kNames;
}

const std::vector<std::string>& JobSpecFieldPaths() {
  static const std::vector<std::string> kPaths = {
      "numNodes",
      "nprocPerNode",
      "device",
      "image",
      "imagePullPolicy",
      "config",
      "masterPort",
      "metricsPort",
      "exportDir",
      "nccl.socketIfname",
      "nccl.ibDisable",
      "nccl.debug",
      "nccl.env",
      "hostMemory.request",
      "hostMemory.limit",
      "hostMemory.headroomPercent",
      "hostMemory.shmSize",
      "diskTier.volume",
      "diskTier.mountPath",
      "diskTier.size",
      "runPolicy.backoffLimit",
      "runPolicy.activeDeadlineSeconds",
      "runPolicy.ttlSecondsAfterFinished",
      "runPolicy.cleanPodPolicy",
      "runPolicy.suspend",
      "runPolicy.restartPolicy",
      "runPolicy.permanentExitCodes",
      "runPolicy.schedulingPolicy.priorityClass",
      "runPolicy.schedulingPolicy.queue",
      "runPolicy.schedulingPolicy.minAvailable",
      "env",
      "template.metadata.labels",
      "template.metadata.annotations",
      "template.spec.nodeSelector",
      "template.spec.tolerations",
      "template.spec.affinity",
      "template.spec.volumes",
      "template.spec.imagePullSecrets",
      "template.spec.serviceAccountName",
      "template.spec.priorityClassName",
      "template.spec.schedulerName",
      "template.spec.terminationGracePeriodSeconds",
      "template.spec.securityContext",
      "template.spec.containers",
      "template.container.volumeMounts",
      "template.container.securityContext",
      "template.container.resources",
      "template.container.env",
  };
  return kPaths;
}

const std::vector<std::string>& PodSpecPassThroughFields() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& [name, type] : PodSpecPassThroughTypes()) names.push_back(name);
    return names;
  }();
  return kNames;
}

int MaxJobNameLength(int32_t num_nodes) {
  return kDnsLabelMax - int(std::string("-node-").size()) - Digits(std::max<int64_t>(0, int64_t(num_nodes) - 1));
}

namespace {

// spec.config.runtime as the user wrote it, or null when it is not an object.
const Json* ConfigRuntime(const JobSpec& s) {
  auto it = s.config.find("runtime");
  return it != s.config.end() && it->is_object() ? &*it : nullptr;
}

// Memory fixed in two places (spec.hostMemory and the template's resources)
// must agree, and the limit be at least the request.
Status CheckMemoryAgrees(const JobSpec& s) {
  const PodOverrides& o = s.overrides;
  auto agree = [](int64_t a, int64_t b, const std::string& a_path, const std::string& b_path) -> Status {
    if (a > 0 && b > 0 && a != b) {
      return Status::InvalidArgument(b_path + " " + FormatBytesQuantity(b) + " conflicts with " + a_path + " " +
                                     FormatBytesQuantity(a) + "; set one");
    }
    return Status::Ok();
  };
  PSTAR_RETURN_IF_ERROR(agree(s.host_memory.request_bytes, o.memory_request_bytes, "spec.hostMemory.request",
                              o.worker_path + ".resources.requests.memory"));
  PSTAR_RETURN_IF_ERROR(agree(s.host_memory.limit_bytes, o.memory_limit_bytes, "spec.hostMemory.limit",
                              o.worker_path + ".resources.limits.memory"));
  const int64_t request = std::max(s.host_memory.request_bytes, o.memory_request_bytes);
  const int64_t limit = std::max(s.host_memory.limit_bytes, o.memory_limit_bytes);
  if (request > 0 && limit > 0 && limit < request) {
    return Status::InvalidArgument("the memory limit " + FormatBytesQuantity(limit) + " is below the request " +
                                   FormatBytesQuantity(request));
  }
  return Status::Ok();
}

// GPUs are the operator's to set on cuda jobs: one per rank.
Status CheckGpuResources(const JobSpec& s) {
  const PodOverrides& o = s.overrides;
  if (s.device != JobDevice::kCuda || !o.resources.is_object()) return Status::Ok();
  for (const char* section : {"requests", "limits"}) {
    auto sec = o.resources.find(section);
    if (sec == o.resources.end() || !sec->is_object()) continue;
    auto gpu = sec->find("nvidia.com/gpu");
    if (gpu == sec->end()) continue;
    const std::string value = gpu->is_string() ? gpu->get<std::string>() : gpu->dump();
    if (value != std::to_string(s.nproc_per_node)) {
      return Status::InvalidArgument(o.worker_path + ".resources." + section + ".nvidia.com/gpu is " + value +
                                     ", but a cuda job gets one GPU per rank (" + std::to_string(s.nproc_per_node) +
                                     "); leave it to the operator");
    }
  }
  return Status::Ok();
}

}  // namespace

namespace {

// Metadata: what the pods are named after and owned by.
Status ParseMetadata(const Json& job, JobSpec* s) {
  auto metadata = job.find("metadata");
  if (metadata == job.end() || !metadata->is_object()) return Status::InvalidArgument("metadata is required");
  Fields meta(&*metadata, "metadata");
  PSTAR_RETURN_IF_ERROR(meta.String("name", &s->name));
  PSTAR_RETURN_IF_ERROR(meta.String("namespace", &s->ns));
  PSTAR_RETURN_IF_ERROR(meta.String("uid", &s->uid));
  PSTAR_ASSIGN_OR_RETURN(std::optional<int64_t> generation,
                         meta.Int("generation", 0, std::numeric_limits<int64_t>::max()));
  s->generation = generation.value_or(0);
  if (s->name.empty()) return Status::InvalidArgument("metadata.name is required");
  if (s->ns.empty()) s->ns = "default";
  return Status::Ok();
}

// The world's shape, and a name that leaves room for the pods' names.
Status ParseShape(Fields& spec, JobSpec* s) {
  PSTAR_RETURN_IF_ERROR(spec.Int32("numNodes", 1, kMaxWorldSize, &s->num_nodes));
  PSTAR_RETURN_IF_ERROR(spec.Int32("nprocPerNode", 1, kMaxWorldSize, &s->nproc_per_node));
  if (int64_t(s->num_nodes) * s->nproc_per_node > kMaxWorldSize) {
    return Status::InvalidArgument("spec.numNodes x spec.nprocPerNode = " +
                                   std::to_string(int64_t(s->num_nodes) * s->nproc_per_node) +
                                   " ranks; the world size must be at most " + std::to_string(kMaxWorldSize));
  }
  if (!IsDns1035Label(s->name)) {
    return Status::InvalidArgument("metadata.name '" + s->name +
                                   "' must be a DNS label: lowercase letters, digits and '-', starting with a letter");
  }
  const int max_name = MaxJobNameLength(s->num_nodes);
  if (int(s->name.size()) > max_name) {
    return Status::InvalidArgument("metadata.name '" + s->name + "' is " + std::to_string(s->name.size()) +
                                   " characters; at most " + std::to_string(max_name) +
                                   " leave room for the pod names (<name>-node-" + std::to_string(s->num_nodes - 1) +
                                   ") within 63");
  }
  return Status::Ok();
}

// The device, the image and the worker's config, which the worker's own
// parser checks (JSON is YAML), so that a job the worker would reject fails
// here, before any pod starts.
Status ParseWorker(Fields& spec, JobSpec* s) {
  std::string device = "cuda";
  PSTAR_RETURN_IF_ERROR(spec.Enum("device", {"cuda", "cpu"}, &device));
  s->device = device == "cpu" ? JobDevice::kCpu : JobDevice::kCuda;
  PSTAR_RETURN_IF_ERROR(spec.String("image", &s->image));
  PSTAR_RETURN_IF_ERROR(spec.Enum("imagePullPolicy", {"Always", "IfNotPresent", "Never"}, &s->image_pull_policy));
  const Json* config = spec.Get("config");
  if (config == nullptr) return Status::InvalidArgument("spec.config is required (the worker's job config)");
  if (!config->is_object()) return Invalid("spec.config", "must be an object, got " + Describe(*config));
  s->config = *config;
  // The directories a job imports from lie on the pods' volumes, not here.
  auto parsed = ParseConfig(config->dump(), "spec.config", {}, ConfigOptions{.read_init_from = false});
  if (!parsed.ok()) return parsed.status();
  // spec.device sets the worker's runtime.device; a config saying otherwise
  // would train on the other device than the pods were sized and given GPUs for.
  const Json* runtime = ConfigRuntime(*s);
  if (runtime != nullptr && runtime->contains("device") && ComputeDeviceName(parsed->runtime.device) != device) {
    return Invalid("spec.config.runtime.device",
                   "is \"" + std::string(ComputeDeviceName(parsed->runtime.device)) + "\" but spec.device is \"" + device +
                       "\"; spec.device sets it: remove it from the config");
  }
  return Status::Ok();
}

// The rendezvous port and the ranks' metrics ports, apart.
Status ParsePorts(Fields& spec, JobSpec* s) {
  PSTAR_RETURN_IF_ERROR(spec.Int32("masterPort", 1, 65535, &s->master_port));
  PSTAR_RETURN_IF_ERROR(spec.Int32("metricsPort", 0, 65535, &s->metrics_port));
  if (s->metrics_port == 0) return Status::Ok();
  const int64_t last = int64_t(s->metrics_port) + s->nproc_per_node - 1;
  if (last > 65535) {
    return Invalid("spec.metricsPort", std::to_string(s->metrics_port) + " leaves no room for " +
                                           std::to_string(s->nproc_per_node) + " ranks' ports (up to " +
                                           std::to_string(last) + ")");
  }
  if (s->master_port >= s->metrics_port && s->master_port <= last) {
    return Invalid("spec.masterPort", std::to_string(s->master_port) + " clashes with the metrics ports " +
                                          std::to_string(s->metrics_port) + "-" + std::to_string(last));
  }
  return Status::Ok();
}

// What is set in two places must agree: the disk tier's keys, the gang's
// minimum, the priority class, the memory, a cuda job's GPUs.
Status CheckAgreement(JobSpec* s) {
  const Json* runtime = ConfigRuntime(*s);
  if (s->disk_tier.enabled() && runtime != nullptr) {
    for (const char* key : {"nvme_path", "nvme_memory", "nvme_spill"}) {
      if (runtime->contains(key)) {
        return Invalid(std::string("spec.config.runtime.") + key,
                       "is set but spec.diskTier sets it for the pods: remove it from the config");
      }
    }
  }
  if (s->run_policy.min_available > s->num_nodes) {
    return Status::InvalidArgument("spec.runPolicy.schedulingPolicy.minAvailable must be at most numNodes (" +
                                   std::to_string(s->num_nodes) + "), got " +
                                   std::to_string(s->run_policy.min_available));
  }
  // One priority class, from either place.
  PodOverrides& o = s->overrides;
  const std::string& policy_class = s->run_policy.priority_class;
  if (!policy_class.empty() && !o.priority_class_name.empty() && policy_class != o.priority_class_name) {
    return Status::InvalidArgument("spec.template.spec.priorityClassName '" + o.priority_class_name +
                                   "' conflicts with spec.runPolicy.schedulingPolicy.priorityClass '" + policy_class + "'");
  }
  if (o.priority_class_name.empty()) o.priority_class_name = policy_class;
  PSTAR_RETURN_IF_ERROR(CheckMemoryAgrees(*s));
  return CheckGpuResources(*s);
}

}  // namespace

// spec.exportDir lies on a volume the worker mounts writable, and the
// config does not set the key it sets.
Status CheckExportDir(const JobSpec& s) {
  if (s.export_dir.empty()) return Status::Ok();
  const std::string& d = s.export_dir;
  bool dotdot = false;
  std::stringstream parts(d);
  for (std::string part; std::getline(parts, part, '/');) dotdot = dotdot || part == "..";
  if (d.front() != '/' || d == "/" || dotdot) {
    return Invalid("spec.exportDir", "must be an absolute path below / without '..', got '" + d + "'");
  }
  const Json* checkpoint = s.config.contains("checkpoint") ? &s.config["checkpoint"] : nullptr;
  if (checkpoint != nullptr && checkpoint->is_object() && checkpoint->contains("export_dir")) {
    return Invalid("spec.config.checkpoint.export_dir", "is set but spec.exportDir sets it: remove it from the config");
  }
  const Json& mounts = s.overrides.volume_mounts;
  if (mounts.is_array()) {
    for (const Json& m : mounts) {
      if (!m.is_object() || !m.contains("mountPath") || !m["mountPath"].is_string()) continue;
      std::string at = m["mountPath"].get<std::string>();
      while (at.size() > 1 && at.back() == '/') at.pop_back();
      if (d != at && d.rfind(at + "/", 0) != 0) continue;
      if (m.value("readOnly", false)) {
        return Invalid("spec.exportDir", d + " is on '" + m.value("name", "") + "', which the worker mounts readOnly");
      }
      return Status::Ok();
    }
  }
  return Invalid("spec.exportDir", d + " is on no volume the worker container mounts (give the volume and its "
                                        "volumeMount in spec.template): it would be lost with the pod");
}

Result<JobSpec> ParseJob(const Json& job) {
  if (!job.is_object()) return Status::InvalidArgument("the job must be an object, got " + Describe(job));
  JobSpec s;
  PSTAR_RETURN_IF_ERROR(ParseMetadata(job, &s));
  auto spec_it = job.find("spec");
  if (spec_it == job.end() || spec_it->is_null()) return Status::InvalidArgument("spec is required");
  if (!spec_it->is_object()) return Invalid("spec", "must be an object, got " + Describe(*spec_it));
  PSTAR_RETURN_IF_ERROR(CheckAllKnownKeys(*spec_it));
  Fields spec(&*spec_it, "spec");
  PSTAR_RETURN_IF_ERROR(ParseShape(spec, &s));
  PSTAR_RETURN_IF_ERROR(ParseWorker(spec, &s));
  PSTAR_RETURN_IF_ERROR(ParsePorts(spec, &s));
  std::set<std::string> env_names;
  PSTAR_RETURN_IF_ERROR(ParseNccl(spec, &s.nccl, &env_names));
  PSTAR_RETURN_IF_ERROR(ParseHostMemory(spec, &s.host_memory));
  PSTAR_RETURN_IF_ERROR(ParseDiskTier(spec, &s.disk_tier));
  PSTAR_RETURN_IF_ERROR(ParseRunPolicy(spec, &s.run_policy));
  PSTAR_RETURN_IF_ERROR(spec.ObjectArray("env", &s.env));
  if (s.env.is_null()) s.env = Json::array();
  PSTAR_RETURN_IF_ERROR(CheckEnv(s.env, "spec.env", &env_names));
  PSTAR_RETURN_IF_ERROR(ParseTemplate(spec, &s.overrides, &env_names));
  PSTAR_RETURN_IF_ERROR(CheckDiskTierVolume(&s.disk_tier, s.overrides));
  PSTAR_RETURN_IF_ERROR(spec.String("exportDir", &s.export_dir));
  PSTAR_RETURN_IF_ERROR(CheckExportDir(s));
  PSTAR_RETURN_IF_ERROR(CheckAgreement(&s));
  return s;
}

}  // namespace pstar::op
