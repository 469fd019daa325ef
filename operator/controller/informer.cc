#include "operator/controller/informer.h"

#include <algorithm>

namespace pstar::op {
namespace {

const Json& Metadata(const Json& obj) {
  static const Json kEmpty = Json::object();
  if (obj.is_object()) {
    auto it = obj.find("metadata");
    if (it != obj.end() && it->is_object()) return *it;
  }
  return kEmpty;
}

std::string ResourceVersion(const Json& obj) { return Metadata(obj).value("resourceVersion", ""); }

}  // namespace

std::string ObjectKey(const std::string& ns, const std::string& name) { return ns.empty() ? name : ns + "/" + name; }

std::string ObjectKey(const Json& object) {
  const Json& meta = Metadata(object);
  return ObjectKey(meta.value("namespace", ""), meta.value("name", ""));
}

Informer::Informer(KubeClient& client, ResourceRef resource, std::string ns, InformerOptions options)
    : client_(client),
      resource_(std::move(resource)),
      ns_(std::move(ns)),
      options_(std::move(options)),
      rng_(std::random_device{}()) {}

Informer::~Informer() { Stop(); }

void Informer::AddHandlers(InformerHandlers handlers) { handlers_.push_back(std::move(handlers)); }

void Informer::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Informer::Stop() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stop_ = true;
  }
  sleep_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!synced_.load()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

bool Informer::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(sleep_mu_);
  sleep_cv_.wait_for(lock, d, [this] { return stop_.load(); });
  return !stop_.load();
}

std::chrono::milliseconds Informer::NextBackoff() {
  backoff_ = backoff_.count() == 0 ? options_.initial_backoff : std::min(backoff_ * 2, options_.max_backoff);
  double jitter = std::uniform_real_distribution<double>(0.8, 1.2)(rng_);
  return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(backoff_.count()) * jitter));
}

std::string Informer::IndexValue(const Json& obj) const {
  if (options_.index_label.empty()) return "";
  const Json& meta = Metadata(obj);
  auto labels = meta.find("labels");
  if (labels == meta.end() || !labels->is_object()) return "";
  auto it = labels->find(options_.index_label);
  return it != labels->end() && it->is_string() ? it->get<std::string>() : "";
}

void Informer::InsertLocked(const std::string& key, const ObjectPtr& obj) {
  auto it = cache_.find(key);
  if (it != cache_.end()) EraseLocked(key);
  cache_[key] = obj;
  std::string v = IndexValue(*obj);
  if (!v.empty()) index_[v].insert(key);
}

void Informer::EraseLocked(const std::string& key) {
  auto it = cache_.find(key);
  if (it == cache_.end()) return;
  std::string v = IndexValue(*it->second);
  if (!v.empty()) {
    auto ix = index_.find(v);
    if (ix != index_.end()) {
      ix->second.erase(key);
      if (ix->second.empty()) index_.erase(ix);
    }
  }
  cache_.erase(it);
}

bool Informer::DoList() {
  ListOptions lo;
  lo.label_selector = options_.label_selector;
  auto listed = client_.ListAll(resource_, ns_, lo, options_.page_size);
  if (!listed.ok()) return false;
  std::vector<Delta> deltas;
  {
    std::unique_lock<std::shared_mutex> lock(cache_mu_);
    std::set<std::string> seen;
    for (auto& item : listed->first) {
      if (options_.transform) options_.transform(&item);
      auto obj = std::make_shared<const Json>(std::move(item));
      std::string key = ObjectKey(*obj);
      seen.insert(key);
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        deltas.push_back({Delta::kAdd, nullptr, obj});
      } else if (ResourceVersion(*it->second) != ResourceVersion(*obj)) {
        deltas.push_back({Delta::kUpdate, it->second, obj});
      }
      InsertLocked(key, obj);
    }
    std::vector<std::string> gone;
    for (const auto& [key, obj] : cache_) {
      if (!seen.count(key)) gone.push_back(key);
    }
    for (const auto& key : gone) {
      deltas.push_back({Delta::kDelete, cache_[key], nullptr});
      EraseLocked(key);
    }
    last_rv_ = listed->second;
  }
  synced_ = true;
  Deliver(deltas);
  return true;
}

bool Informer::ApplyEvent(const WatchEvent& event, Delta* delta) {
  std::string rv = ResourceVersion(event.object);
  std::unique_lock<std::shared_mutex> lock(cache_mu_);
  if (!rv.empty()) last_rv_ = rv;
  if (event.type == "BOOKMARK") return false;
  if (!event.object.is_object()) return false;
  std::string key = ObjectKey(event.object);
  auto it = cache_.find(key);
  if (event.type == "DELETED") {
    if (it == cache_.end()) return false;
    *delta = {Delta::kDelete, it->second, nullptr};
    EraseLocked(key);
    return true;
  }
  if (event.type != "ADDED" && event.type != "MODIFIED") return false;
  if (it != cache_.end() && ResourceVersion(*it->second) == rv) return false;  // nothing new
  Json object = event.object;
  if (options_.transform) options_.transform(&object);
  auto obj = std::make_shared<const Json>(std::move(object));
  *delta = it == cache_.end() ? Delta{Delta::kAdd, nullptr, obj} : Delta{Delta::kUpdate, it->second, obj};
  InsertLocked(key, obj);
  return true;
}

void Informer::Deliver(const std::vector<Delta>& deltas) {
  for (const auto& d : deltas) {
    for (const auto& h : handlers_) {
      switch (d.type) {
        case Delta::kAdd:
          if (h.on_add) h.on_add(d.new_obj);
          break;
        case Delta::kUpdate:
          if (h.on_update) h.on_update(d.old_obj, d.new_obj);
          break;
        case Delta::kDelete:
          if (h.on_delete) h.on_delete(d.old_obj);
          break;
      }
    }
  }
}

void Informer::Run() {
  bool need_list = true;
  bool first_list = true, first_watch = true;
  while (!stop_.load()) {
    if (need_list) {
      if (!first_list) ++relists;
      first_list = false;
      if (!DoList()) {
        if (!SleepFor(NextBackoff())) return;
        continue;
      }
      need_list = false;
    }
    if (!first_watch) ++watch_restarts;
    first_watch = false;
    WatchOptions wo;
    wo.label_selector = options_.label_selector;
    wo.resource_version = LastResourceVersion();
    wo.allow_bookmarks = true;
    int lo = std::max(1, options_.min_watch_timeout_seconds);
    int hi = std::max(lo, options_.max_watch_timeout_seconds);
    wo.timeout_seconds = std::uniform_int_distribution<int>(lo, hi)(rng_);
    int64_t events = 0;
    ApiResponse end = client_.Watch(
        resource_, ns_, wo,
        [&](const WatchEvent& ev) {
          ++events;
          ++events_received;
          Delta delta;
          if (ApplyEvent(ev, &delta)) Deliver({delta});
          return !stop_.load();
        },
        &stop_);
    if (stop_.load()) return;
    if (end.gone()) {
      need_list = true;  // our resourceVersion is too old: relist and diff
      backoff_ = std::chrono::milliseconds(0);
      continue;
    }
    if (end.code == 200) {
      if (events > 0) backoff_ = std::chrono::milliseconds(0);
      // A stream that ends at once without events is treated like an error
      // so a misbehaving server is not hammered.
      if (events == 0 && !SleepFor(std::min(NextBackoff(), std::chrono::milliseconds(1000)))) return;
      continue;
    }
    if (!SleepFor(NextBackoff())) return;
  }
}

ObjectPtr Informer::Get(const std::string& ns, const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  auto it = cache_.find(ObjectKey(ns, name));
  return it == cache_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> Informer::List() const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  std::vector<ObjectPtr> out;
  out.reserve(cache_.size());
  for (const auto& [key, obj] : cache_) out.push_back(obj);
  return out;
}

std::vector<ObjectPtr> Informer::ListNamespace(const std::string& ns) const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  std::vector<ObjectPtr> out;
  const std::string prefix = ns + "/";
  for (auto it = cache_.lower_bound(prefix); it != cache_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::vector<ObjectPtr> Informer::ListByLabel(const std::string& ns, const std::string& key,
                                             const std::string& value) const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  std::vector<ObjectPtr> out;
  auto in_ns = [&](const Json& obj) { return ns.empty() || Metadata(obj).value("namespace", "") == ns; };
  if (!options_.index_label.empty() && key == options_.index_label) {
    auto ix = index_.find(value);
    if (ix == index_.end()) return out;
    for (const auto& k : ix->second) {
      const auto& obj = cache_.at(k);
      if (in_ns(*obj)) out.push_back(obj);
    }
    return out;
  }
  for (const auto& [k, obj] : cache_) {
    if (!in_ns(*obj)) continue;
    const Json& meta = Metadata(*obj);
    auto labels = meta.find("labels");
    if (labels == meta.end() || !labels->is_object()) continue;
    auto it = labels->find(key);
    if (it != labels->end() && it->is_string() && it->get<std::string>() == value) out.push_back(obj);
  }
  return out;
}

size_t Informer::Size() const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  return cache_.size();
}

std::string Informer::LastResourceVersion() const {
  std::shared_lock<std::shared_mutex> lock(cache_mu_);
  return last_rv_;
}

}  // namespace pstar::op
