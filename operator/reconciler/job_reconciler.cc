#include "operator/reconciler/job_reconciler.h"

#include <cstdio>

#include "operator/kube/resource.h"

namespace pstar::op {

namespace {

using std::chrono::milliseconds;

constexpr const char* kManagedSelector = "app.kubernetes.io/managed-by=pstar-operator";

bool OwnedBy(const Json& child, const std::string& uid) {
  const Json refs = child["metadata"].value("ownerReferences", Json::array());
  for (const Json& r : refs) {
    if (r.value("uid", "") == uid && r.value("controller", false)) return true;
  }
  return false;
}

const ResourceRef& RefFor(const Json& object) {
  const std::string kind = object.value("kind", "");
  if (kind == "Service") return Services();
  if (kind == "ConfigMap") return ConfigMaps();
  if (kind == "Secret") return Secrets();
  if (kind == "NetworkPolicy") return NetworkPolicies();
  if (kind == "PodGroup") {
    return object.value("apiVersion", "") == VolcanoPodGroups().api_version() ? VolcanoPodGroups()
                                                                               : CoschedulingPodGroups();
  }
  return Pods();
}

// 128 bits from the kernel, as hex: a job's store token. Empty if the kernel
// gives none (the job then waits: no pods without their Secret).
std::string RandomToken() {
  unsigned char bytes[16];
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool ok = f != nullptr && std::fread(bytes, 1, sizeof bytes, f) == sizeof bytes;
  if (f != nullptr) std::fclose(f);
  if (!ok) return "";
  std::string token;
  for (unsigned char b : bytes) {
    static const char kHex[] = "0123456789abcdef";
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

}  // namespace

JobReconciler::JobReconciler(KubeClient& client, ReconcilerOptions options, OperatorMetrics* metrics)
    : client_(client), options_(std::move(options)), metrics_(metrics) {
  InformerHandlers job_handlers;
  job_handlers.on_add = [this](const ObjectPtr& job) { queue_.Add(ObjectKey(*job)); };
  job_handlers.on_update = [this](const ObjectPtr&, const ObjectPtr& job) { queue_.Add(ObjectKey(*job)); };
  job_handlers.on_delete = [this](const ObjectPtr& job) {
    std::lock_guard<std::mutex> lock(mu_);
    superseded_rv_.erase(ObjectKey(*job));
    create_failures_.erase(ObjectKey(*job));
    for (auto it = reported_refusals_.lower_bound(ObjectKey(*job) + "/"); it != reported_refusals_.end() &&
                                                                         it->first.rfind(ObjectKey(*job) + "/", 0) == 0;) {
      it = reported_refusals_.erase(it);
    }
    planner_->Forget((*job)["metadata"].value("uid", ""));
    if (progress_) progress_->Forget(ObjectKey(*job));
  };
  planner_ = std::make_unique<JobPlanner>(options_.planner_threads, options_.planner,
                                          [this](const std::string& key) { queue_.Add(key); });
  if (options_.poll_progress) {
    progress_ = std::make_unique<ProgressPoller>(options_.progress, [this](const std::string& key) { queue_.Add(key); });
  }
  InformerHandlers child_handlers;
  child_handlers.on_add = [this](const ObjectPtr& o) { EnqueueOwner(*o); };
  child_handlers.on_update = [this](const ObjectPtr&, const ObjectPtr& o) { EnqueueOwner(*o); };
  child_handlers.on_delete = [this](const ObjectPtr& o) { EnqueueOwner(*o); };

  // What the cache of each child keeps: the reconciler reads pods' metadata
  // and status, and only whether a Service, Secret or NetworkPolicy exists
  // (ConfigMaps are compared and updated, so they stay whole). Server-side
  // apply's managedFields are dropped everywhere.
  auto metadata_only = [](const char* keep) {
    return [keep](Json* object) {
      for (auto it = object->begin(); it != object->end();) {
        const std::string& key = it.key();
        if (key == "metadata" || key == "apiVersion" || key == "kind" || (keep != nullptr && key == keep)) {
          ++it;
        } else {
          it = object->erase(it);
        }
      }
      if (object->contains("metadata") && (*object)["metadata"].is_object()) (*object)["metadata"].erase("managedFields");
    };
  };
  auto informer = [&](const ResourceRef& ref, const std::string& selector, InformerHandlers handlers,
                      std::function<void(Json*)> transform = nullptr) {
    InformerOptions o;
    o.label_selector = selector;
    o.index_label = kJobNameLabel;
    o.transform = std::move(transform);
    auto i = std::make_unique<Informer>(client_, ref, ref.namespaced ? options_.watch_namespace : "", o);
    i->AddHandlers(std::move(handlers));
    return i;
  };
  jobs_ = informer(PatrickStarJobs(), "", job_handlers);
  InformerHandlers pod_handlers = child_handlers;
  pod_handlers.on_update = [this](const ObjectPtr& before, const ObjectPtr& after) {
    RecordPodExit(*before, *after);  // first: the reconcile it triggers may end the job
    EnqueueOwner(*after);
  };
  pods_ = informer(Pods(), kManagedSelector, pod_handlers, metadata_only("status"));
  services_ = informer(Services(), kManagedSelector, child_handlers, metadata_only(nullptr));
  config_maps_ = informer(ConfigMaps(), kManagedSelector, child_handlers);
  secrets_ = informer(Secrets(), kManagedSelector, child_handlers, metadata_only(nullptr));
  if (options_.defaults.network_policy.enabled) {
    network_policies_ = informer(NetworkPolicies(), kManagedSelector, child_handlers, metadata_only(nullptr));
  }
  if (options_.watch_nodes) nodes_ = informer(Nodes(), "", {});
}

JobReconciler::~JobReconciler() { Stop(); }

Status JobReconciler::Start(milliseconds sync_timeout) {
  std::vector<Informer*> all = {jobs_.get(), pods_.get(), services_.get(), config_maps_.get(), secrets_.get()};
  if (network_policies_) all.push_back(network_policies_.get());
  if (nodes_) all.push_back(nodes_.get());
  {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    if (stopping_) return Status::FailedPrecondition("stopped before the caches synced");
    for (Informer* i : all) i->Start();
  }
  const auto deadline = std::chrono::steady_clock::now() + sync_timeout;
  for (Informer* i : all) {
    // In short waits, so that Stop() can end a start that cannot finish.
    while (!i->WaitForSync(milliseconds(100))) {
      if (stopping_) return Status::FailedPrecondition("stopped before the caches synced");
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string hint;
        if (i == jobs_.get()) hint = " (is the PatrickStarJob CRD, crds/patrickstarjob.yaml, installed?)";
        return Status::FailedPrecondition("the " + i->resource().plural + " cache did not sync within " +
                                          std::to_string(sync_timeout.count() / 1000) + " s" + hint);
      }
    }
  }
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (stopping_) return Status::FailedPrecondition("stopped before the workers started");
  started_ = true;
  for (int w = 0; w < options_.workers; ++w) workers_.emplace_back([this] { RunWorker(); });
  return Status::Ok();
}

void JobReconciler::Stop() {
  stopping_ = true;
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  queue_.ShutDown();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  for (auto* i : {&jobs_, &pods_, &services_, &config_maps_, &secrets_, &network_policies_, &nodes_}) {
    if (*i) (*i)->Stop();
  }
}

bool JobReconciler::Synced() const {
  return started_ && jobs_->HasSynced() && pods_->HasSynced() && services_->HasSynced() &&
         config_maps_->HasSynced() && secrets_->HasSynced() &&
         (!network_policies_ || network_policies_->HasSynced()) && (!nodes_ || nodes_->HasSynced());
}

OperatorSnapshot JobReconciler::Snapshot() const {
  OperatorSnapshot s;
  s.queue_depth = int64_t(queue_.Len());
  for (const auto& job : jobs_->List()) {
    JobSnapshot j;
    j.phase = "Pending";
    const auto meta = job->find("metadata");
    if (meta != job->end() && meta->is_object()) {
      j.ns = meta->value("namespace", "");
      j.name = meta->value("name", "");
    }
    if (job->contains("status") && (*job)["status"].is_object()) {
      const Json& status = (*job)["status"];
      if (status.contains("phase") && status["phase"].is_string() && !status["phase"].get<std::string>().empty()) {
        j.phase = status["phase"].get<std::string>();
      }
      if (status.contains("restarts") && status["restarts"].is_number_integer()) {
        j.restarts = status["restarts"].get<int64_t>();
      }
    }
    ++s.jobs_by_phase[j.phase];
    s.jobs.push_back(std::move(j));
  }
  for (const Informer* i : {jobs_.get(), pods_.get(), services_.get(), config_maps_.get(), secrets_.get(),
                            network_policies_.get(), nodes_.get()}) {
    if (i == nullptr) continue;
    s.watch_restarts[i->resource().plural] = i->watch_restarts.load();
    s.relists[i->resource().plural] = i->relists.load();
  }
  return s;
}

void JobReconciler::RecordPodExit(const Json& before, const Json& after) {
  auto phase = [](const Json& pod) {
    const auto s = pod.find("status");
    return s != pod.end() && s->is_object() ? s->value("phase", "") : std::string();
  };
  const std::string now = phase(after);
  if ((now != "Succeeded" && now != "Failed") || phase(before) == now) return;
  const Json labels = after["metadata"].value("labels", Json::object());
  if (!labels.contains(kJobNameLabel) || !labels[kJobNameLabel].is_string()) return;
  auto job = jobs_->Get(after["metadata"].value("namespace", ""), labels[kJobNameLabel].get<std::string>());
  if (job == nullptr) return;
  const int code = PodExitCode(after);
  std::string why;  // the container's reason: OOMKilled, Error, Completed, ...
  if (after["status"].contains("containerStatuses") && after["status"]["containerStatuses"].is_array()) {
    for (const Json& c : after["status"]["containerStatuses"]) {
      const Json::json_pointer p("/state/terminated/reason");
      if (c.contains(p) && c.at(p).is_string()) why = c.at(p).get<std::string>();
    }
  }
  std::string message = "pod " + after["metadata"].value("name", "") +
                        (code >= 0 ? " exited with code " + std::to_string(code) : " " + now);
  if (code > 128 && code < 160) message += " (signal " + std::to_string(code - 128) + ")";
  if (!why.empty()) message += ": " + why;
  RecordEvents(*job, {{code == 0 ? "Normal" : "Warning", "ExitedWithCode", message}});
}

void JobReconciler::EnqueueOwner(const Json& child) {
  const Json labels = child["metadata"].value("labels", Json::object());
  if (!labels.contains(kJobNameLabel) || !labels[kJobNameLabel].is_string()) return;
  queue_.Add(ObjectKey(child["metadata"].value("namespace", ""), labels[kJobNameLabel].get<std::string>()));
}

void JobReconciler::RunWorker() {
  while (auto key = queue_.Get()) {
    const auto start = std::chrono::steady_clock::now();
    auto result = ReconcileKey(*key);
    const auto took = std::chrono::steady_clock::now() - start;
    if (!result.ok()) {
      std::fprintf(stderr, "pstar-operator: reconcile %s: %s\n", key->c_str(), result.status().message().c_str());
      if (metrics_) metrics_->RecordReconcile("error", took);
      queue_.AddRateLimited(*key);
    } else if (result->has_value() && **result <= milliseconds(250)) {
      // A conflict or a cache behind our own write: look again soon.
      if (metrics_) metrics_->RecordReconcile("requeue", took);
      queue_.Forget(*key);
      queue_.AddAfter(*key, **result);
    } else {
      if (metrics_) metrics_->RecordReconcile("success", took);
      queue_.Forget(*key);
      if (result->has_value()) queue_.AddAfter(*key, **result);
    }
    queue_.Done(*key);
  }
}

bool JobReconciler::GangApiServed() {
  const GangScheduler scheduler = options_.defaults.gang.scheduler;
  if (scheduler == GangScheduler::kNone) return false;
  std::lock_guard<std::mutex> lock(gang_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (gang_checked_ && now - gang_checked_at_ < kGangApiRecheck) return gang_api_served_;
  // The group/version's resource list: served when it lists the resource the
  // scheduler's objects (or, for Kueue, its workloads) live in.
  const std::string wanted = scheduler == GangScheduler::kKueue ? "workloads" : "podgroups";
  ApiResponse r = client_.Raw("GET", "/apis/" + GangApiGroupVersion(scheduler));
  if (r.ok() || r.not_found()) {
    bool served = false;
    if (r.ok() && r.body.is_object() && r.body.contains("resources") && r.body["resources"].is_array()) {
      for (const Json& resource : r.body["resources"]) {
        if (resource.is_object() && resource.value("name", "") == wanted) served = true;
      }
    }
    gang_api_served_ = served;
    gang_checked_ = true;
    gang_checked_at_ = now;
  }  // any other answer says nothing: keep what was known (or "not served" at first)
  return gang_api_served_;
}

JobObservation JobReconciler::Observe(const Json& job) {
  JobObservation o;
  o.job = job;
  const std::string ns = job["metadata"].value("namespace", "");
  const std::string name = job["metadata"].value("name", "");
  const std::string uid = job["metadata"].value("uid", "");
  for (const auto& pod : pods_->ListByLabel(ns, kJobNameLabel, name)) {
    if (OwnedBy(*pod, uid)) o.pods.push_back(*pod);
  }
  JobSpec named;  // the children's names depend on the job's name alone
  named.name = name;
  named.ns = ns;
  auto service = services_->Get(ns, ServiceName(named));
  o.service_exists = service != nullptr && OwnedBy(*service, uid);
  auto config_map = config_maps_->Get(ns, ConfigMapName(named));
  if (config_map != nullptr && OwnedBy(*config_map, uid)) o.config_map = *config_map;
  auto secret = secrets_->Get(ns, StoreTokenSecretName(named));
  o.store_token_exists = secret != nullptr && OwnedBy(*secret, uid);
  if (!o.store_token_exists) o.fresh_store_token = RandomToken();
  if (network_policies_) {
    auto policy = network_policies_->Get(ns, NetworkPolicyName(named));
    o.network_policy_exists = policy != nullptr && OwnedBy(*policy, uid);
  }
  if (nodes_) {
    for (const auto& node : nodes_->List()) o.nodes.push_back(*node);
  }
  o.gang_api_served = GangApiServed();
  o.now = std::chrono::system_clock::now();
  o.plan = planner_->Find(ObjectKey(job), job);
  o.plan_pending = o.plan == nullptr;
  if (progress_) {
    // Rank 0 is local rank 0 of node 0's pod in the current attempt.
    const std::string key = ObjectKey(job);
    std::string ip;
    int port = 0;
    if (o.plan != nullptr && o.plan->spec.ok() && o.plan->spec->metrics_port > 0) {
      const std::string attempt = std::to_string(
          job.contains("status") && job["status"].is_object() ? job["status"].value("restarts", int64_t(0)) : 0);
      for (const Json& pod : o.pods) {
        const Json labels = pod["metadata"].value("labels", Json::object());
        if (labels.value(kNodeIndexLabel, "") != "0" || labels.value(kAttemptLabel, "") != attempt) continue;
        const Json status = pod.value("status", Json::object());
        if (status.value("phase", "") == "Running") ip = status.value("podIP", "");
      }
      port = o.plan->spec->metrics_port;
    }
    if (!ip.empty()) {
      progress_->Track(key, ip, port);
    } else {
      progress_->Untrack(key);
    }
    if (auto p = progress_->Latest(key)) o.progress = ProgressStatus(*p);
  }
  return o;
}

Status JobReconciler::ApiFailure(const std::string& verb, const ResourceRef& ref, const ApiResponse& response) {
  if (metrics_) metrics_->RecordApiError(verb, ref.plural);
  return response.ToStatus(verb + " " + ref.plural);
}

Result<std::optional<milliseconds>> JobReconciler::ReconcileKey(const std::string& key) {
  const size_t slash = key.find('/');
  const std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
  auto cached = jobs_->Get(ns, name);
  if (cached == nullptr) return std::optional<milliseconds>();
  const Json& job = *cached;
  const std::string rv = job["metadata"].value("resourceVersion", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = superseded_rv_.find(key);
    if (it != superseded_rv_.end()) {
      if (it->second == rv) return std::optional<milliseconds>(milliseconds(100));
      superseded_rv_.erase(it);
    }
  }

  JobObservation observed = Observe(job);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = create_failures_.find(key);
    if (it != create_failures_.end()) observed.create_failure = it->second;
  }
  JobActions actions = DecideJobActions(observed, options_.defaults);

  if (actions.status) {
    Json updated = job;
    updated["status"] = *actions.status;
    ApiResponse r = client_.ReplaceStatus(PatrickStarJobs(), ns, updated);
    if (r.conflict()) return std::optional<milliseconds>(milliseconds(50));  // re-read, then decide again
    if (r.not_found()) return std::optional<milliseconds>();
    if (!r.ok()) return ApiFailure("update status", PatrickStarJobs(), r);
    {
      std::lock_guard<std::mutex> lock(mu_);
      superseded_rv_[key] = rv;
    }
    const int64_t before = job.contains("status") && job["status"].is_object() ? job["status"].value("restarts", 0) : 0;
    if (metrics_ && actions.status->value("restarts", 0) > before) metrics_->RecordGangRestart();
  }
  RecordEvents(job, actions.events);

  Status first_error;
  for (const std::string& pod : actions.delete_pods) {
    DeleteOptions d;
    d.propagation_policy = "Background";
    ApiResponse r = client_.Delete(Pods(), ns, pod, d);
    if (!r.ok() && !r.not_found() && first_error.ok()) first_error = ApiFailure("delete", Pods(), r);
  }
  // Replace first: pods created in this pass must read the new config.
  for (const Json& object : actions.replace) {
    const ResourceRef& ref = RefFor(object);
    ApiResponse r = client_.Replace(ref, ns, object);
    if (!r.ok() && first_error.ok()) first_error = ApiFailure("update", ref, r);
  }
  std::string pod_refusal;
  bool created_pods = false;
  for (const Json& object : actions.create) {
    const ResourceRef& ref = RefFor(object);
    ApiResponse r = client_.Create(ref, ns, object);
    const std::string refusal_key = key + "/" + ref.kind;
    if (r.ok()) {
      created_pods = created_pods || ref.kind == "Pod";
      std::lock_guard<std::mutex> lock(mu_);
      reported_refusals_.erase(refusal_key);
      continue;
    }
    if (r.already_exists()) {
      // Ours (the cache is behind), or someone else's object by that name.
      const std::string child = object["metadata"].value("name", "");
      ApiResponse existing = client_.Get(ref, ns, child);
      if (!existing.ok() || OwnedBy(existing.body, job["metadata"].value("uid", ""))) continue;
      const std::string message = ref.kind + " " + child + " already exists and is not owned by this job; " +
                                  "delete or rename it";
      RecordEvents(job, {{"Warning", "NameConflict", message}});
      if (first_error.ok()) first_error = Status::FailedPrecondition(message);
      continue;
    }
    if (first_error.ok()) first_error = ApiFailure("create", ref, r);
    if (r.code == 422 || r.code == 400 || r.code == 403) {
      // The cluster refuses this object: the user needs to know why, once
      // per distinct refusal. For pods the Created condition says it (and
      // DecideJobActions records the event).
      const std::string message = r.ToStatus("create " + ref.plural).message();
      if (ref.kind == "Pod") {
        if (pod_refusal.empty()) pod_refusal = message;
        continue;
      }
      bool report = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::string& last = reported_refusals_[refusal_key];
        report = last != message;
        last = message;
      }
      if (report) RecordEvents(job, {{"Warning", "CreateFailed", message}});
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pod_refusal.empty()) {
      create_failures_[key] = pod_refusal;
    } else if (created_pods) {
      create_failures_.erase(key);
    }
  }
  if (actions.delete_job) {
    DeleteOptions d;
    d.propagation_policy = "Background";
    ApiResponse r = client_.Delete(PatrickStarJobs(), ns, name, d);
    if (!r.ok() && !r.not_found() && first_error.ok()) first_error = ApiFailure("delete", PatrickStarJobs(), r);
  }
  if (!first_error.ok()) return first_error;
  return actions.requeue_after;
}

void JobReconciler::RecordEvents(const Json& job, const std::vector<JobEvent>& events) {
  const std::string ns = job["metadata"].value("namespace", "");
  const std::string name = job["metadata"].value("name", "");
  for (const JobEvent& e : events) {
    const auto now = std::chrono::system_clock::now();
    const std::string stamp = FormatTime(now);
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "%llx%04llx",
                  static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                      now.time_since_epoch()).count()),
                  static_cast<unsigned long long>(event_seq_.fetch_add(1) & 0xffff));
    Json event = {
        {"apiVersion", "v1"},
        {"kind", "Event"},
        {"metadata", {{"name", name + "." + suffix}, {"namespace", ns}}},
        {"involvedObject",
         {{"apiVersion", PatrickStarJobs().api_version()},
          {"kind", PatrickStarJobs().kind},
          {"name", name},
          {"namespace", ns},
          {"uid", job["metadata"].value("uid", "")},
          {"resourceVersion", job["metadata"].value("resourceVersion", "")}}},
        {"reason", e.reason},
        {"message", e.message},
        {"type", e.type},
        {"source", {{"component", "pstar-operator"}}},
        {"reportingComponent", "pstar-operator"},
        {"reportingInstance", options_.identity},
        {"firstTimestamp", stamp},
        {"lastTimestamp", stamp},
        {"count", 1},
    };
    ApiResponse r = client_.Create(Events(), ns, event);
    if (!r.ok()) {
      if (metrics_) metrics_->RecordApiError("create", "events");
      continue;  // events are best effort: the status says the same
    }
    if (metrics_) metrics_->RecordEvent(e.type);
  }
}

}  // namespace pstar::op
