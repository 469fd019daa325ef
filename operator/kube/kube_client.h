// KubeClient: a thread-safe REST client for the Kubernetes API on cpprestsdk.
// Typed only by ResourceRef; objects are JSON. Reads (GET/LIST) retry on
// 429/5xx/transport errors with backoff; writes are never retried here (the
// reconciler requeues instead). WATCH streams events line by line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "operator/kube/kube_config.h"
#include "operator/kube/resource.h"
#include "worker/core/status.h"

namespace pstar::op {

// The outcome of one API call.
struct ApiResponse {
  int code = 0;        // HTTP status; 0 = no response (transport error or timeout)
  Json body;           // the decoded body (the object, list or Status), null when none
  std::string error;   // one line: the transport error or the Status message

  bool ok() const { return code >= 200 && code < 300; }
  bool not_found() const { return code == 404; }
  bool conflict() const { return code == 409; }
  bool already_exists() const { return code == 409 && reason() == "AlreadyExists"; }
  bool gone() const { return code == 410; }
  // The Status reason ("AlreadyExists", "Conflict", "NotFound", ...) or "".
  std::string reason() const;
  // OK when ok(); else an error "what: HTTP <code>: <error>".
  Status ToStatus(const std::string& what) const;
};

struct ListOptions {
  std::string label_selector, field_selector, resource_version, continue_token;
  int64_t limit = 0;  // 0 = no limit
};

struct WatchOptions {
  std::string label_selector, field_selector, resource_version;
  int timeout_seconds = 300;  // the server ends the stream after this long
  bool allow_bookmarks = true;
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  Json object;
};

enum class PatchType { kMerge, kJsonPatch };

struct DeleteOptions {
  std::string propagation_policy;  // "Background", "Foreground", "Orphan" or "" (server default)
  std::optional<int64_t> grace_period_seconds;
  std::string precondition_uid;               // "" = none
  std::string precondition_resource_version;  // "" = none
};

struct ClientOptions {
  std::chrono::milliseconds request_timeout{30000};
  std::string user_agent = "pstar-operator";
  // For GET/LIST on 429/5xx/transport errors: exponential backoff with
  // jitter, honoring Retry-After.
  int max_retries = 3;
  std::chrono::milliseconds retry_base_delay{200};
  double qps = 0;  // 0 = unlimited; else a client-side token bucket
  int burst = 0;   // bucket size (at least 1 when qps > 0)
};

class KubeClient {
 public:
  // Validates the config (server URL, PEMs) and builds the HTTP client.
  static Result<std::unique_ptr<KubeClient>> Create(const KubeConfig& config, ClientOptions options = {});
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  const KubeConfig& config() const;

  ApiResponse Get(const ResourceRef& r, const std::string& ns, const std::string& name);
  // ns "" = all namespaces.
  ApiResponse List(const ResourceRef& r, const std::string& ns, const ListOptions& options);
  // Pages through the whole list (`page_size` per page) and returns the items
  // and the list's resourceVersion. A 410 on a continue token restarts the
  // list from scratch once.
  Result<std::pair<std::vector<Json>, std::string>> ListAll(const ResourceRef& r, const std::string& ns,
                                                            ListOptions options, int64_t page_size = 500);
  ApiResponse Create(const ResourceRef& r, const std::string& ns, const Json& object);
  // PUT of the whole object; its metadata.resourceVersion makes it conditional.
  ApiResponse Replace(const ResourceRef& r, const std::string& ns, const Json& object);
  // PUT .../status.
  ApiResponse ReplaceStatus(const ResourceRef& r, const std::string& ns, const Json& object);
  ApiResponse Patch(const ResourceRef& r, const std::string& ns, const std::string& name, const Json& patch,
                    PatchType type, const std::string& subresource = "");
  ApiResponse Delete(const ResourceRef& r, const std::string& ns, const std::string& name,
                     const DeleteOptions& options = {});

  // Streams events to `on_event` until the server ends the stream (code 200),
  // `on_event` returns false (code 200), or *stop becomes true (checked at
  // least every second; code 200, error "stopped"). An ERROR event carrying a
  // 410 Status is returned as code 410; any other ERROR event as its code.
  // The client-side timeout is the server's timeoutSeconds plus a margin.
  ApiResponse Watch(const ResourceRef& r, const std::string& ns, const WatchOptions& options,
                    const std::function<bool(const WatchEvent&)>& on_event, const std::atomic<bool>* stop);

  // Cancels every request in flight (watches included) and makes every later
  // one fail at once: how a process that is giving up stops promptly, even
  // against a server that no longer answers.
  void Shutdown();

  // Requests to other paths (e.g. a fake server's control endpoints).
  // `method` is "GET", "POST", ...; body null = none.
  ApiResponse Raw(const std::string& method, const std::string& path_and_query, const Json& body = nullptr,
                  const std::string& content_type = "application/json");

 private:
  class Impl;
  explicit KubeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pstar::op
