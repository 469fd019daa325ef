// Informer: a local, watch-maintained cache of one resource in one namespace
// (or all), optionally label-selected. It LISTs (paged), then WATCHes from the
// list's resourceVersion with bookmarks, and calls handlers for every change.
// A watch that ends is resumed from the last seen resourceVersion; a 410
// (history compacted) triggers a relist whose diff against the cache is
// delivered, so handlers also see objects deleted while the watch was down.
// Errors back off exponentially with jitter (capped) and retry.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/kube_client.h"

namespace pstar::op {

using ObjectPtr = std::shared_ptr<const Json>;

// "ns/name" (or "name" for cluster-scoped objects) of an object.
std::string ObjectKey(const Json& object);
// The same from parts.
std::string ObjectKey(const std::string& ns, const std::string& name);

// Called on the informer's thread; keep them short (e.g. enqueue a key).
struct InformerHandlers {
  std::function<void(const ObjectPtr&)> on_add;
  std::function<void(const ObjectPtr& old_obj, const ObjectPtr& new_obj)> on_update;
  std::function<void(const ObjectPtr&)> on_delete;  // the last known state
};

struct InformerOptions {
  std::string label_selector;  // "" = everything
  std::string index_label;     // a label key to index by, e.g. "patrickstar.io/job-name"
  int64_t page_size = 500;
  // Each watch asks the server to end it after a random time in this range.
  int min_watch_timeout_seconds = 300;
  int max_watch_timeout_seconds = 600;
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
  // Applied to every object before it is cached and handed to the handlers:
  // drops what the controller never reads (a pod's spec, a Secret's data),
  // so the cache of thousands of objects stays small. Null: kept whole.
  std::function<void(Json*)> transform;
};

class Informer {
 public:
  // ns "" = all namespaces. `client` must outlive the informer.
  Informer(KubeClient& client, ResourceRef resource, std::string ns, InformerOptions options = {});
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Register before Start().
  void AddHandlers(InformerHandlers handlers);
  void Start();
  // Ends the thread promptly (the watch's stop flag). Idempotent.
  void Stop();

  // True once the first LIST has filled the cache.
  bool HasSynced() const { return synced_.load(); }
  bool WaitForSync(std::chrono::milliseconds timeout);

  ObjectPtr Get(const std::string& ns, const std::string& name) const;
  std::vector<ObjectPtr> List() const;
  std::vector<ObjectPtr> ListNamespace(const std::string& ns) const;
  // Objects in `ns` ("" = any) whose label `key` equals `value`; uses the
  // index when `key` is the index label.
  std::vector<ObjectPtr> ListByLabel(const std::string& ns, const std::string& key, const std::string& value) const;
  size_t Size() const;
  // The resourceVersion the next watch starts from.
  std::string LastResourceVersion() const;

  const ResourceRef& resource() const { return resource_; }

  // Counters for metrics.
  std::atomic<int64_t> watch_restarts{0};  // watches started after the first
  std::atomic<int64_t> relists{0};         // LISTs after the first
  std::atomic<int64_t> events_received{0};

 private:
  struct Delta {
    enum Type { kAdd, kUpdate, kDelete } type;
    ObjectPtr old_obj, new_obj;
  };

  void Run();
  bool DoList();  // false on error
  // Applies one watch event to the cache; returns the delta to deliver, if any.
  bool ApplyEvent(const WatchEvent& event, Delta* delta);
  void Deliver(const std::vector<Delta>& deltas);
  void InsertLocked(const std::string& key, const ObjectPtr& obj);
  void EraseLocked(const std::string& key);
  std::string IndexValue(const Json& obj) const;
  // Sleeps up to `d`, returning early on Stop(); false when stopping.
  bool SleepFor(std::chrono::milliseconds d);
  std::chrono::milliseconds NextBackoff();

  KubeClient& client_;
  const ResourceRef resource_;
  const std::string ns_;
  const InformerOptions options_;
  std::vector<InformerHandlers> handlers_;

  mutable std::shared_mutex cache_mu_;
  std::map<std::string, ObjectPtr> cache_;  // ordered: a namespace is a key range
  std::map<std::string, std::set<std::string>> index_;  // index label value -> keys
  std::string last_rv_;                                 // guarded by cache_mu_

  std::atomic<bool> synced_{false};
  std::atomic<bool> stop_{false};
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::thread thread_;
  std::chrono::milliseconds backoff_{0};
  std::mt19937_64 rng_;
};

}  // namespace pstar::op
