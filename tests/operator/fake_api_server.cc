#include "tests/operator/fake_api_server.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace pstar::test {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(const FakeApiServerOptions& options) {
  std::unique_ptr<FakeApiServer> server(new FakeApiServer());
  server->dir_ = std::make_unique<TempDir>("fake-apiserver");
  const std::string dir = server->dir_->path();
  const std::string port_file = dir + "/port";
  server->kubeconfig_path_ = dir + "/kubeconfig";
  server->token_ = options.token;
  std::vector<std::string> argv = {"/usr/bin/python3", SourceDir() + "/tests/fake_kube/fake_apiserver.py",
                                   "--port", "0", "--port-file", port_file, "--kubeconfig-out",
                                   server->kubeconfig_path_};
  if (options.tls) {
    server->tls_dir_ = dir + "/tls";
    argv.insert(argv.end(), {"--tls-dir", server->tls_dir_});
  }
  if (!options.token.empty()) argv.insert(argv.end(), {"--token", options.token});
  if (options.kubelet) {
    argv.push_back("--kubelet");
    if (!options.bin_dir.empty()) argv.insert(argv.end(), {"--bin-dir", options.bin_dir});
    argv.insert(argv.end(), {"--work-dir", dir + "/kubelet"});
    std::filesystem::create_directories(dir + "/kubelet");
    for (const auto& node : options.nodes) argv.insert(argv.end(), {"--node", node});
  }
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  server->process_ = std::make_unique<ChildProcess>(argv, options.env);

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    std::string text = Slurp(port_file);
    if (!text.empty() && text.back() == '\n' && std::filesystem::exists(server->kubeconfig_path_)) {
      server->port_ = std::stoi(text);
      break;
    }
    if (!server->process_->Running()) {
      ProcessResult r = server->process_->Wait();
      return Status::Internal("fake apiserver exited with " + std::to_string(r.exit_code) + ": " + r.err);
    }
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Internal("fake apiserver did not write " + port_file + " within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  server->base_url_ = std::string(options.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(server->port_);
  auto config = op::LoadKubeconfig(server->kubeconfig_path_);
  if (!config.ok()) return config.status();
  server->config_ = *config;
  op::ClientOptions client_options;
  client_options.max_retries = 0;
  auto client = op::KubeClient::Create(server->config_, client_options);
  if (!client.ok()) return client.status();
  server->client_ = std::move(*client);
  return server;
}

FakeApiServer::~FakeApiServer() { Stop(); }

void FakeApiServer::Stop() {
  if (!process_) return;
  if (process_->Running()) {
    process_->Signal(SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (process_->Running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (process_->Running()) process_->Signal(SIGKILL);
  }
  process_->Wait();
}

std::string FakeApiServer::Output() const { return process_ ? process_->Stdout() : ""; }

op::ApiResponse FakeApiServer::Post(const std::string& path, const op::Json& body) {
  return client_->Raw("POST", path, body);
}

op::ApiResponse FakeApiServer::Get(const std::string& path) { return client_->Raw("GET", path); }

op::ApiResponse FakeApiServer::InjectFault(const std::string& method, const std::string& path_regex, int status,
                                           int count) {
  return Post("/fake/faults", {{"method", method}, {"path", path_regex}, {"status", status}, {"count", count}});
}

op::ApiResponse FakeApiServer::DropWatches() { return Post("/fake/drop-watches"); }
op::ApiResponse FakeApiServer::Compact() { return Post("/fake/compact"); }

op::Json FakeApiServer::Stats() {
  op::ApiResponse r = Get("/fake/stats");
  return r.ok() ? r.body : op::Json();
}

}  // namespace pstar::test
