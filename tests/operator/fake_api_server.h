// FakeApiServer: starts tests/fake_kube/fake_apiserver.py as a child process
// on a free loopback port and offers its kubeconfig, a client, and helpers
// for the /fake/ control endpoints. Stopped (SIGTERM, then SIGKILL) on
// destruction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "operator/kube/kube_client.h"
#include "tests/test_util.h"
#include "worker/core/status.h"

namespace pstar::test {

struct FakeApiServerOptions {
  bool tls = true;
  std::string token = "fake-token";  // "" = no authentication
  bool kubelet = false;              // run pods as local processes
  std::string bin_dir;               // with kubelet: where pod commands are looked up
  std::vector<std::string> nodes;    // with kubelet: "NAME:MEM:CPU[:GPU]"
  std::vector<std::string> extra_args;
  std::vector<std::string> env;      // "NAME=value" for the server process
};

class FakeApiServer {
 public:
  // Starts the server and waits (up to 60 s) for it to listen.
  static Result<std::unique_ptr<FakeApiServer>> Start(const FakeApiServerOptions& options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  int port() const { return port_; }
  const std::string& kubeconfig_path() const { return kubeconfig_path_; }
  const std::string& base_url() const { return base_url_; }  // "https://127.0.0.1:port"
  const std::string& tls_dir() const { return tls_dir_; }     // ca.crt, server.crt, ...
  const std::string& token() const { return token_; }
  // The kubeconfig the server wrote, parsed.
  op::KubeConfig config() const { return config_; }
  // A client for tests (no retries, so faults are seen as they are).
  op::KubeClient& client() { return *client_; }

  // Control endpoints.
  op::ApiResponse Post(const std::string& path, const op::Json& body = op::Json::object());
  op::ApiResponse Get(const std::string& path);
  // Makes the next `count` requests matching method and path regex fail with `status`.
  op::ApiResponse InjectFault(const std::string& method, const std::string& path_regex, int status, int count);
  op::ApiResponse DropWatches();
  op::ApiResponse Compact();
  op::Json Stats();

  // SIGTERM, wait up to 10 s, then SIGKILL. Idempotent.
  void Stop();
  // What the server printed (for failure messages).
  std::string Output() const;

 private:
  FakeApiServer() = default;

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
  std::string kubeconfig_path_, base_url_, tls_dir_, token_;
  op::KubeConfig config_;
  std::unique_ptr<op::KubeClient> client_;
};

}  // namespace pstar::test
