#include "operator/kube/kube_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace pstar::op {
namespace {

namespace fs = std::filesystem;

Result<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(what + " " + path + ": cannot read file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// Finds the entry named `name` in a list of {name, <field>: {...}} maps.
YAML::Node FindNamed(const YAML::Node& list, const std::string& name, const std::string& field) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const auto& item : list) {
    if (item.IsMap() && item["name"] && item["name"].as<std::string>() == name) return item[field];
  }
  return YAML::Node();
}

std::string Str(const YAML::Node& map, const char* key) {
  if (!map || !map.IsMap() || !map[key] || map[key].IsNull()) return "";
  return map[key].as<std::string>();
}

// Reads `<key>-data` (base64) or `<key>` (a file relative to `base`).
Result<std::string> DataOrFile(const YAML::Node& map, const std::string& key, const fs::path& base,
                               const std::string& where) {
  std::string data = Str(map, (key + "-data").c_str());
  if (!data.empty()) {
    auto decoded = DecodeBase64(data);
    if (!decoded.ok()) return Status::InvalidArgument(where + ": " + key + "-data: " + decoded.status().message());
    return decoded;
  }
  std::string file = Str(map, key.c_str());
  if (file.empty()) return std::string();
  fs::path p(file);
  if (p.is_relative()) p = base / p;
  auto text = ReadFile(p.string(), where + ": " + key);
  return text;
}

}  // namespace

std::string EncodeBase64(const std::string& bytes) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> DecodeBase64(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  bool padding = false;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '=') { padding = true; continue; }
    int v = value(c);
    if (v < 0 || padding) return Status::InvalidArgument("invalid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (bits >= 6) return Status::InvalidArgument("invalid base64 length");
  return out;
}

Result<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  const std::string where = "kubeconfig " + path;
  auto text = ReadFile(path, "kubeconfig");
  if (!text.ok()) return text.status();
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(where + ": invalid YAML: " + e.msg + " (line " +
                                   std::to_string(e.mark.line + 1) + ")");
  }
  if (!root.IsMap()) return Status::InvalidArgument(where + ": not a kubeconfig (expected a map)");
  try {
    std::string ctx_name = context.empty() ? Str(root, "current-context") : context;
    if (ctx_name.empty()) return Status::InvalidArgument(where + ": no current-context and no context given");
    YAML::Node ctx = FindNamed(root["contexts"], ctx_name, "context");
    if (!ctx || !ctx.IsMap()) return Status::NotFound(where + ": context \"" + ctx_name + "\" not found");
    std::string cluster_name = Str(ctx, "cluster");
    YAML::Node cluster = FindNamed(root["clusters"], cluster_name, "cluster");
    if (!cluster || !cluster.IsMap())
      return Status::NotFound(where + ": cluster \"" + cluster_name + "\" (context \"" + ctx_name + "\") not found");
    std::string user_name = Str(ctx, "user");
    YAML::Node user;
    if (!user_name.empty()) {
      user = FindNamed(root["users"], user_name, "user");
      if (!user || !user.IsMap())
        return Status::NotFound(where + ": user \"" + user_name + "\" (context \"" + ctx_name + "\") not found");
    }
    const fs::path base = fs::path(path).parent_path();

    KubeConfig config;
    config.server = Str(cluster, "server");
    if (config.server.empty()) return Status::InvalidArgument(where + ": cluster \"" + cluster_name + "\" has no server");
    while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
    if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0)
      return Status::InvalidArgument(where + ": server \"" + config.server + "\" is not an http(s) URL");
    std::string insecure = Str(cluster, "insecure-skip-tls-verify");
    config.insecure_skip_tls_verify = insecure == "true";
    PSTAR_ASSIGN_OR_RETURN(config.ca_pem, DataOrFile(cluster, "certificate-authority", base, where));
    if (user && user.IsMap()) {
      if (user["exec"]) return Status::FailedPrecondition(where + ": user \"" + user_name + "\": exec credential plugins are not supported");
      if (user["auth-provider"])
        return Status::FailedPrecondition(where + ": user \"" + user_name + "\": auth-provider plugins are not supported");
      PSTAR_ASSIGN_OR_RETURN(config.client_cert_pem, DataOrFile(user, "client-certificate", base, where));
      PSTAR_ASSIGN_OR_RETURN(config.client_key_pem, DataOrFile(user, "client-key", base, where));
      if (config.client_cert_pem.empty() != config.client_key_pem.empty())
        return Status::InvalidArgument(where + ": user \"" + user_name + "\" has a client certificate without a key or vice versa");
      config.token = Str(user, "token");
      std::string token_file = Str(user, "tokenFile");
      if (!token_file.empty()) {
        fs::path p(token_file);
        if (p.is_relative()) p = base / p;
        config.token_file = p.string();
        auto tok = ReadFile(config.token_file, where + ": tokenFile");
        if (!tok.ok()) return tok.status();
      }
      if (!Str(user, "username").empty() && config.token.empty() && config.token_file.empty() &&
          config.client_cert_pem.empty())
        return Status::FailedPrecondition(where + ": user \"" + user_name + "\": basic auth is not supported");
    }
    std::string ns = Str(ctx, "namespace");
    if (!ns.empty()) config.default_namespace = ns;
    return config;
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(where + ": malformed kubeconfig: " + e.msg);
  }
}

Result<KubeConfig> LoadInClusterConfig(const std::string& dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0')
    return Status::FailedPrecondition("in-cluster config: KUBERNETES_SERVICE_HOST/PORT are not set");
  KubeConfig config;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  config.server = "https://" + h + ":" + port;
  config.token_file = dir + "/token";
  auto token = ReadFile(config.token_file, "in-cluster config: token");
  if (!token.ok()) return token.status();
  if (Trim(*token).empty()) return Status::InvalidArgument("in-cluster config: token " + config.token_file + " is empty");
  auto ca = ReadFile(dir + "/ca.crt", "in-cluster config: CA");
  if (!ca.ok()) return ca.status();
  config.ca_pem = *ca;
  auto ns = ReadFile(dir + "/namespace", "in-cluster config: namespace");
  if (ns.ok() && !Trim(*ns).empty()) config.default_namespace = Trim(*ns);
  return config;
}

Result<KubeConfig> ResolveConfig(const std::string& kubeconfig_flag) {
  if (!kubeconfig_flag.empty()) return LoadKubeconfig(kubeconfig_flag);
  const char* env = std::getenv("KUBECONFIG");
  if (env != nullptr && *env != '\0') {
    // KUBECONFIG may list several files; the first that exists is used.
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(':', start);
      if (end == std::string::npos) end = list.size();
      std::string file = list.substr(start, end - start);
      if (!file.empty() && fs::exists(file)) return LoadKubeconfig(file);
      start = end + 1;
    }
    return Status::NotFound("no kubeconfig: none of the files in $KUBECONFIG (" + list + ") exists");
  }
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  if (host != nullptr && *host != '\0') return LoadInClusterConfig();
  const char* home = std::getenv("HOME");
  std::string default_path = std::string(home ? home : "") + "/.kube/config";
  if (home != nullptr && fs::exists(default_path)) return LoadKubeconfig(default_path);
  return Status::NotFound("no Kubernetes config: no --kubeconfig flag, $KUBECONFIG unset, "
                          "KUBERNETES_SERVICE_HOST unset (not in a cluster), and " + default_path +
                          " does not exist");
}

}  // namespace pstar::op
