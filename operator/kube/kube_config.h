// KubeConfig: where the API server is and how to authenticate to it, loaded
// from a kubeconfig file (development) or the pod's service account (in
// cluster). Every error is one line naming the file and the problem.
#pragma once

#include <string>

#include "worker/core/status.h"

namespace pstar::op {

struct KubeConfig {
  std::string server;  // "https://host:port" or "http://host:port"
  std::string ca_pem;  // trusted CA certificates; "" = the system roots
  std::string client_cert_pem, client_key_pem;  // client certificate auth when both set
  std::string token;       // bearer token (static)
  std::string token_file;  // bearer token file, re-read when it changes: in-cluster tokens rotate
  bool insecure_skip_tls_verify = false;
  std::string default_namespace = "default";
};

// Parses a kubeconfig: current-context (or `context` when given), its cluster
// (server, certificate-authority(-data), insecure-skip-tls-verify), user
// (client-certificate(-data), client-key(-data), token, tokenFile) and
// namespace. File paths are relative to the kubeconfig's directory. exec and
// auth-provider plugins are rejected as not supported.
Result<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");

// The pod's service account: KUBERNETES_SERVICE_HOST/PORT and
// `dir`/{token,ca.crt,namespace}. The token is read through token_file so a
// rotated token is picked up.
inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";
Result<KubeConfig> LoadInClusterConfig(const std::string& dir = kServiceAccountDir);

// The operator's choice: `kubeconfig_flag` if set, else $KUBECONFIG, else the
// in-cluster config when KUBERNETES_SERVICE_HOST is set, else ~/.kube/config.
// The error says what was tried.
Result<KubeConfig> ResolveConfig(const std::string& kubeconfig_flag);

// Standard base64 (padding optional, whitespace ignored); nullopt-like error on bad input.
Result<std::string> DecodeBase64(const std::string& text);
// Standard base64 with padding (a Secret's data).
std::string EncodeBase64(const std::string& bytes);

}  // namespace pstar::op
