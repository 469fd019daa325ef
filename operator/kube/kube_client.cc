#include "operator/kube/kube_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <boost/asio/ssl.hpp>
#include <cpprest/http_client.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

namespace pstar::op {

namespace {
// The largest response body read (a list of thousands of pods is a few MiB).
constexpr utility::size64_t kMaxResponseBytes = utility::size64_t(512) << 20;
}  // namespace
namespace {

namespace http = web::http;
namespace client = web::http::client;
using Clock = std::chrono::steady_clock;

std::string OneLine(std::string s, size_t max = 300) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// Appends "k=v" to a query string being built.
void AddParam(std::string& query, const std::string& key, const std::string& value) {
  if (value.empty()) return;
  query += query.empty() ? '?' : '&';
  query += key + "=" + UrlEncode(value);
}

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

// All certificates in a PEM buffer.
Result<std::vector<std::shared_ptr<X509>>> ParseCertificates(const std::string& pem, const std::string& what) {
  std::vector<std::shared_ptr<X509>> certs;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())),
                                                &BIO_free);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert, &X509_free);
  }
  ERR_clear_error();  // the read that ends the loop leaves "no start line"
  if (certs.empty()) return Status::InvalidArgument(what + ": no PEM certificate found");
  return certs;
}

Status CheckPrivateKey(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())),
                                                &BIO_free);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) return Status::InvalidArgument("client key: not a PEM private key: " + OpenSslError());
  EVP_PKEY_free(key);
  return Status::Ok();
}

// Rate limiting: a token bucket refilled at qps, holding up to burst tokens.
// Tokens may go negative: a caller reserves one and sleeps for its turn.
class TokenBucket {
 public:
  TokenBucket(double qps, int burst) : qps_(qps), burst_(std::max(1, burst)), tokens_(burst_), last_(Clock::now()) {}
  void Acquire() {
    if (qps_ <= 0) return;
    std::chrono::duration<double> wait{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto now = Clock::now();
      tokens_ = std::min<double>(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * qps_);
      last_ = now;
      tokens_ -= 1;
      if (tokens_ < 0) wait = std::chrono::duration<double>(-tokens_ / qps_);
    }
    if (wait.count() > 0) std::this_thread::sleep_for(wait);
  }

 private:
  const double qps_;
  const int burst_;
  std::mutex mu_;
  double tokens_;
  Clock::time_point last_;
};

// Waits for a pplx task, checking *stop every 200 ms; on stop cancels the
// request (which closes its connection) and waits for the task to finish.
// Returns false when stopped.
template <typename T>
bool WaitOrStop(const pplx::task<T>& task, const std::atomic<bool>* stop, pplx::cancellation_token_source& cts,
                const std::atomic<bool>* shut_down = nullptr) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto state = std::make_shared<State>();
  task.then([state](pplx::task<T>) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  bool stopped = false;
  while (!state->done) {
    state->cv.wait_for(lock, std::chrono::milliseconds(200));
    if (!stopped && ((stop != nullptr && stop->load()) || (shut_down != nullptr && shut_down->load()))) {
      stopped = true;
      cts.cancel();
    }
  }
  return !stopped;
}

}  // namespace

std::string ApiResponse::reason() const {
  if (body.is_object() && body.value("kind", "") == "Status") {
    auto it = body.find("reason");
    if (it != body.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

Status ApiResponse::ToStatus(const std::string& what) const {
  if (ok()) return Status::Ok();
  std::string msg = what + ": " + (code == 0 ? std::string("no response") : "HTTP " + std::to_string(code));
  if (!error.empty()) msg += ": " + error;
  if (code == 404) return Status::NotFound(msg);
  if (code == 400 || code == 422) return Status::InvalidArgument(msg);
  if (code == 409 || code == 410) return Status::FailedPrecondition(msg);
  return Status::Internal(msg);
}

class KubeClient::Impl {
 public:
  Impl(KubeConfig config, ClientOptions options)
      : config_(std::move(config)),
        options_(std::move(options)),
        bucket_(options_.qps, options_.burst),
        rng_(std::random_device{}()) {}

  Status Init() {
    if (!config_.ca_pem.empty()) {
      auto certs = ParseCertificates(config_.ca_pem, "certificate authority");
      if (!certs.ok()) return certs.status();
      ca_certs_ = std::move(*certs);
    }
    if (!config_.client_cert_pem.empty()) {
      auto certs = ParseCertificates(config_.client_cert_pem, "client certificate");
      if (!certs.ok()) return certs.status();
      PSTAR_RETURN_IF_ERROR(CheckPrivateKey(config_.client_key_pem));
    }
    if (!config_.token_file.empty()) {
      std::string token;
      if (!ReadToken(&token)) return Status::NotFound("token file " + config_.token_file + ": cannot read file");
    }
    try {
      base_ = web::uri(config_.server);
      if (base_.scheme() != "http" && base_.scheme() != "https")
        return Status::InvalidArgument("server " + config_.server + ": not an http(s) URL");
      client_ = std::make_unique<client::http_client>(base_, MakeConfig(options_.request_timeout));
    } catch (const std::exception& e) {
      return Status::InvalidArgument("server " + config_.server + ": " + OneLine(e.what()));
    }
    return Status::Ok();
  }

  client::http_client_config MakeConfig(std::chrono::milliseconds timeout) const {
    client::http_client_config cfg;
    cfg.set_timeout(timeout);
    cfg.set_validate_certificates(!config_.insecure_skip_tls_verify);
    auto ca = ca_certs_;
    std::string cert = config_.client_cert_pem, key = config_.client_key_pem;
    cfg.set_ssl_context_callback([ca, cert, key](boost::asio::ssl::context& ctx) {
      if (!ca.empty()) {
        // Trust exactly the configured CAs, not the system roots.
        X509_STORE* store = X509_STORE_new();
        for (const auto& c : ca) X509_STORE_add_cert(store, c.get());
        SSL_CTX_set_cert_store(ctx.native_handle(), store);
      }
      if (!cert.empty()) {
        ctx.use_certificate_chain(boost::asio::buffer(cert.data(), cert.size()));
        ctx.use_private_key(boost::asio::buffer(key.data(), key.size()), boost::asio::ssl::context::pem);
      }
    });
    return cfg;
  }

  // The bearer token: the static one, or token_file re-read when its mtime
  // or size changes.
  bool ReadToken(std::string* token) {
    if (config_.token_file.empty()) {
      *token = config_.token;
      return true;
    }
    std::lock_guard<std::mutex> lock(token_mu_);
    struct stat st {};
    if (::stat(config_.token_file.c_str(), &st) != 0) {
      *token = cached_token_.empty() ? config_.token : cached_token_;
      return !token->empty();
    }
    if (!token_loaded_ || st.st_mtim.tv_sec != token_mtime_.tv_sec || st.st_mtim.tv_nsec != token_mtime_.tv_nsec ||
        st.st_size != token_size_) {
      std::ifstream in(config_.token_file);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        std::string t = ss.str();
        while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
        cached_token_ = t;
        token_mtime_ = st.st_mtim;
        token_size_ = st.st_size;
        token_loaded_ = true;
      }
    }
    *token = cached_token_;
    return token_loaded_;
  }

  http::http_request MakeRequest(const std::string& method, const std::string& path_and_query, const Json& body,
                                 const std::string& content_type) {
    http::http_request req(method);
    req.set_request_uri(path_and_query);
    req.headers().add("User-Agent", options_.user_agent);
    req.headers().add("Accept", "application/json");
    std::string token;
    if (ReadToken(&token) && !token.empty()) req.headers().add("Authorization", "Bearer " + token);
    if (!body.is_null()) req.set_body(body.dump(), content_type);
    return req;
  }

  static ApiResponse Decode(int code, const std::string& text) {
    ApiResponse r;
    r.code = code;
    if (!text.empty()) {
      r.body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (r.body.is_discarded()) {
        // Not JSON: an error page, or text such as a pod's log (kept as a string).
        r.body = r.ok() ? Json(text) : Json(nullptr);
        if (!r.ok()) r.error = OneLine(text);
      }
    }
    if (!r.ok() && r.error.empty()) {
      if (r.body.is_object() && r.body.contains("message") && r.body["message"].is_string())
        r.error = OneLine(r.body["message"].get<std::string>());
      else
        r.error = "HTTP " + std::to_string(code);
    }
    return r;
  }

  // One request, no retries. `retry_after` gets the Retry-After seconds (or -1).
  // Cancels every request in flight and fails every later one at once.
  void Shutdown() {
    shut_down_ = true;
    shutdown_cts_.cancel();
    std::lock_guard<std::mutex> lock(retry_mu_);
    retry_cv_.notify_all();
  }

  ApiResponse ShutDownResponse(const std::string& method, const std::string& path) const {
    ApiResponse r;
    r.error = method + " " + path + ": the client is shut down";
    return r;
  }

  ApiResponse DoOnce(const std::string& method, const std::string& path, const Json& body,
                     const std::string& content_type, int* retry_after) {
    bucket_.Acquire();
    *retry_after = -1;
    if (shut_down_) return ShutDownResponse(method, path);
    try {
      http::http_response resp =
          client_->request(MakeRequest(method, path, body, content_type), shutdown_cts_.get_token()).get();
      // A declared body beyond any real list is refused before it is read
      // (a broken or hostile server could otherwise hold the call or the memory).
      const utility::size64_t declared = resp.headers().content_length();
      if (declared > kMaxResponseBytes) {
        ApiResponse r;
        r.error = method + " " + path + ": the response declares " + std::to_string(declared) +
                  " bytes, more than the " + std::to_string(kMaxResponseBytes >> 20) + " MiB the operator reads";
        return r;
      }
      std::string text = resp.extract_utf8string(true).get();
      auto it = resp.headers().find("Retry-After");
      if (it != resp.headers().end()) {
        try {
          *retry_after = std::stoi(it->second);
        } catch (...) {
        }
      }
      return Decode(resp.status_code(), text);
    } catch (const std::exception& e) {
      ApiResponse r;
      r.error = method + " " + path + ": " + OneLine(e.what());
      return r;
    }
  }

  // GETs retry on 429, 5xx and transport errors; other methods run once.
  ApiResponse Do(const std::string& method, const std::string& path, const Json& body = nullptr,
                 const std::string& content_type = "application/json") {
    const bool retryable_method = method == "GET";
    for (int attempt = 0;; ++attempt) {
      int retry_after = -1;
      ApiResponse r = DoOnce(method, path, body, content_type, &retry_after);
      bool retryable = r.code == 0 || r.code == 429 || (r.code >= 500 && r.code != 501);
      if (!retryable_method || !retryable || attempt >= options_.max_retries || shut_down_) return r;
      std::unique_lock<std::mutex> lock(retry_mu_);
      retry_cv_.wait_for(lock, RetryDelay(attempt, retry_after), [&] { return shut_down_.load(); });
    }
  }

  std::chrono::milliseconds RetryDelay(int attempt, int retry_after) {
    double base = static_cast<double>(options_.retry_base_delay.count()) * (1 << std::min(attempt, 10));
    double jitter;
    {
      std::lock_guard<std::mutex> lock(rng_mu_);
      jitter = std::uniform_real_distribution<double>(0.5, 1.5)(rng_);
    }
    auto delay = std::chrono::milliseconds(static_cast<int64_t>(std::min(base * jitter, 10000.0)));
    if (retry_after > 0) delay = std::max(delay, std::chrono::milliseconds(std::min(retry_after, 60) * 1000));
    return delay;
  }

  ApiResponse Watch(const ResourceRef& r, const std::string& ns, const WatchOptions& options,
                    const std::function<bool(const WatchEvent&)>& on_event, const std::atomic<bool>* stop) {
    std::string query = "?watch=true";
    AddParam(query, "labelSelector", options.label_selector);
    AddParam(query, "fieldSelector", options.field_selector);
    AddParam(query, "resourceVersion", options.resource_version);
    if (options.allow_bookmarks) query += "&allowWatchBookmarks=true";
    if (options.timeout_seconds > 0) query += "&timeoutSeconds=" + std::to_string(options.timeout_seconds);
    const std::string path = r.Path(ns) + query;

    ApiResponse result;
    bucket_.Acquire();
    // A client of its own: the timeout is an inactivity timeout per read,
    // longer than the server's timeoutSeconds, so only a dead server trips it.
    auto timeout = std::chrono::seconds(std::max(options.timeout_seconds, 0) + 30);
    try {
      client::http_client watch_client(base_, MakeConfig(timeout));
      pplx::cancellation_token_source cts;
      auto resp_task = watch_client.request(MakeRequest("GET", path, nullptr, ""), cts.get_token());
      if (!WaitOrStop(resp_task, stop, cts, &shut_down_)) {
        result.code = 200;
        result.error = "stopped";
        try { resp_task.wait(); } catch (...) {}
        return result;
      }
      http::http_response resp = resp_task.get();
      if (resp.status_code() != 200) {
        std::string text = resp.extract_utf8string(true).get();
        return Decode(resp.status_code(), text);
      }
      // Read what has arrived as it arrives: wait for one byte, then take
      // whatever else is buffered. (A large getn would wait for a full buffer.)
      auto sbuf = resp.body().streambuf();
      using Traits = concurrency::streams::streambuf<uint8_t>::traits;
      std::vector<uint8_t> buf(64 * 1024);
      std::string pending;
      result.code = 200;
      while (true) {
        auto next = sbuf.bumpc();
        if (!WaitOrStop(next, stop, cts, &shut_down_)) {
          try { next.wait(); } catch (...) {}
          result.error = "stopped";
          return result;
        }
        auto first = next.get();
        if (first == Traits::eof()) break;  // the server ended the stream
        pending.push_back(static_cast<char>(first));
        size_t n = std::min(sbuf.in_avail(), buf.size());
        if (n > 0) n = sbuf.getn(buf.data(), n).get();
        pending.append(reinterpret_cast<const char*>(buf.data()), n);
        size_t start = 0;
        for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
          std::string_view line(pending.data() + start, nl - start);
          if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
          Json event = Json::parse(line, nullptr, false);
          if (event.is_discarded() || !event.is_object()) {
            result.code = 0;
            result.error = "watch " + r.plural + ": malformed event: " + OneLine(std::string(line), 120);
            cts.cancel();
            return result;
          }
          WatchEvent ev;
          ev.type = event.value("type", "");
          ev.object = event.contains("object") ? event["object"] : Json();
          if (ev.type == "ERROR") {
            result.code = ev.object.is_object() ? ev.object.value("code", 500) : 500;
            result.body = ev.object;
            result.error = ev.object.is_object() ? OneLine(ev.object.value("message", "watch error")) : "watch error";
            cts.cancel();
            return result;
          }
          if (!on_event(ev)) {
            cts.cancel();
            return result;
          }
        }
        pending.erase(0, start);
        if (stop != nullptr && stop->load()) {
          cts.cancel();
          result.error = "stopped";
          return result;
        }
      }
    } catch (const std::exception& e) {
      result = ApiResponse();
      result.error = "watch " + r.plural + ": " + OneLine(e.what());
    }
    return result;
  }

  KubeConfig config_;
  ClientOptions options_;
  TokenBucket bucket_;
  std::vector<std::shared_ptr<X509>> ca_certs_;
  web::uri base_;
  std::unique_ptr<client::http_client> client_;  // shared by all plain requests (thread-safe)
  std::atomic<bool> shut_down_{false};
  pplx::cancellation_token_source shutdown_cts_;
  std::mutex retry_mu_;
  std::condition_variable retry_cv_;  // a retry's backoff ends early at shutdown

  std::mutex token_mu_;
  std::string cached_token_;
  timespec token_mtime_{};
  off_t token_size_ = -1;
  bool token_loaded_ = false;

  std::mutex rng_mu_;
  std::mt19937_64 rng_;
};

Result<std::unique_ptr<KubeClient>> KubeClient::Create(const KubeConfig& config, ClientOptions options) {
  auto impl = std::make_unique<Impl>(config, std::move(options));
  PSTAR_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(impl)));
}

KubeClient::KubeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KubeClient::~KubeClient() = default;

void KubeClient::Shutdown() { impl_->Shutdown(); }

const KubeConfig& KubeClient::config() const { return impl_->config_; }

ApiResponse KubeClient::Get(const ResourceRef& r, const std::string& ns, const std::string& name) {
  return impl_->Do("GET", r.Path(ns, name));
}

ApiResponse KubeClient::List(const ResourceRef& r, const std::string& ns, const ListOptions& options) {
  std::string query;
  AddParam(query, "labelSelector", options.label_selector);
  AddParam(query, "fieldSelector", options.field_selector);
  AddParam(query, "resourceVersion", options.resource_version);
  AddParam(query, "continue", options.continue_token);
  if (options.limit > 0) AddParam(query, "limit", std::to_string(options.limit));
  return impl_->Do("GET", r.Path(ns) + query);
}

Result<std::pair<std::vector<Json>, std::string>> KubeClient::ListAll(const ResourceRef& r, const std::string& ns,
                                                                      ListOptions options, int64_t page_size) {
  const std::string what = "list " + r.plural + (ns.empty() ? "" : " in " + ns);
  bool restarted = false;
  options.limit = page_size;
  options.continue_token.clear();
  std::vector<Json> items;
  std::string list_rv;
  while (true) {
    ApiResponse resp = List(r, ns, options);
    if (resp.gone() && !options.continue_token.empty() && !restarted) {
      // The continue token expired: start over once, from the latest state.
      restarted = true;
      items.clear();
      options.continue_token.clear();
      options.resource_version.clear();
      continue;
    }
    if (!resp.ok()) return resp.ToStatus(what);
    if (!resp.body.is_object()) return Status::Internal(what + ": response is not an object");
    if (auto it = resp.body.find("items"); it != resp.body.end() && it->is_array()) {
      for (auto& item : *it) items.push_back(std::move(item));
    }
    const Json& meta = resp.body.contains("metadata") ? resp.body["metadata"] : Json::object();
    list_rv = meta.is_object() ? meta.value("resourceVersion", "") : "";
    std::string cont = meta.is_object() ? meta.value("continue", "") : "";
    if (cont.empty()) break;
    options.continue_token = cont;
    options.resource_version.clear();  // a continue token carries its own RV
  }
  return std::make_pair(std::move(items), list_rv);
}

ApiResponse KubeClient::Create(const ResourceRef& r, const std::string& ns, const Json& object) {
  return impl_->Do("POST", r.Path(ns), object);
}

namespace {
std::string NameOf(const Json& object) {
  if (object.is_object() && object.contains("metadata") && object["metadata"].is_object())
    return object["metadata"].value("name", "");
  return "";
}
}  // namespace

ApiResponse KubeClient::Replace(const ResourceRef& r, const std::string& ns, const Json& object) {
  std::string name = NameOf(object);
  if (name.empty()) return ApiResponse{0, nullptr, "replace " + r.plural + ": object has no metadata.name"};
  return impl_->Do("PUT", r.Path(ns, name), object);
}

ApiResponse KubeClient::ReplaceStatus(const ResourceRef& r, const std::string& ns, const Json& object) {
  std::string name = NameOf(object);
  if (name.empty()) return ApiResponse{0, nullptr, "replace status " + r.plural + ": object has no metadata.name"};
  return impl_->Do("PUT", r.Path(ns, name, "status"), object);
}

ApiResponse KubeClient::Patch(const ResourceRef& r, const std::string& ns, const std::string& name, const Json& patch,
                              PatchType type, const std::string& subresource) {
  const char* ct = type == PatchType::kMerge ? "application/merge-patch+json" : "application/json-patch+json";
  return impl_->Do("PATCH", r.Path(ns, name, subresource), patch, ct);
}

ApiResponse KubeClient::Delete(const ResourceRef& r, const std::string& ns, const std::string& name,
                               const DeleteOptions& options) {
  Json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (!options.propagation_policy.empty()) body["propagationPolicy"] = options.propagation_policy;
  if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
  if (!options.precondition_uid.empty()) body["preconditions"]["uid"] = options.precondition_uid;
  if (!options.precondition_resource_version.empty())
    body["preconditions"]["resourceVersion"] = options.precondition_resource_version;
  return impl_->Do("DELETE", r.Path(ns, name), body);
}

ApiResponse KubeClient::Watch(const ResourceRef& r, const std::string& ns, const WatchOptions& options,
                              const std::function<bool(const WatchEvent&)>& on_event, const std::atomic<bool>* stop) {
  return impl_->Watch(r, ns, options, on_event, stop);
}

ApiResponse KubeClient::Raw(const std::string& method, const std::string& path_and_query, const Json& body,
                            const std::string& content_type) {
  return impl_->Do(method, path_and_query, body, content_type);
}

}  // namespace pstar::op
