// HttpEndpoint: a minimal HTTP/1.x server for a few GET paths (/metrics,
// /healthz, ...) on one thread.
// The worker serves its own endpoint instead of prometheus-cpp's civetweb
// exposer: civetweb runs its request threads on a small fixed stack from
// which glibc also carves every loaded library's static TLS, and with the
// CUDA runtime loaded that left too little stack and the first scrape crashed.
// This thread has an ordinary stack and serves up to 64 connections at once
// with one poll, each request within a total deadline of 5 s, so stalled
// clients cannot delay a scrape; stopping closes every connection.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "worker/core/status.h"

namespace pstar {

class HttpEndpoint {
 public:
  struct Reply {
    int code = 200;  // 200, or e.g. 503 from a failing health check
    std::string body;
    std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  };
  // Answers GET of one path; paths without a handler get 404.
  using Handler = std::function<Reply()>;
  using Routes = std::map<std::string, Handler>;

  // Listens on address:port (port 0: the OS picks). Fails with a one-line
  // message naming address:port and the reason.
  static Result<std::unique_ptr<HttpEndpoint>> Start(const std::string& address, int port, Routes routes);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  using Clock = std::chrono::steady_clock;
  void Serve();
  // The whole HTTP response to one request's bytes.
  std::string ResponseFor(const std::string& request) const;

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: written once to stop Serve
  int port_ = 0;
  Routes routes_;
  std::thread thread_;
};

}  // namespace pstar
