#include "operator/kube/kube_config.h"

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace pstar::op {
namespace {

using pstar::test::TempDir;
using pstar::test::WriteText;

std::string B64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (s.size() - i == 1) {
    uint32_t v = uint8_t(s[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (s.size() - i == 2) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

using test::ScopedEnv;

TEST(Base64, DecodesWithAndWithoutPadding) {
  EXPECT_EQ(*DecodeBase64("aGVsbG8="), "hello");
  EXPECT_EQ(*DecodeBase64("aGVsbG8"), "hello");
  EXPECT_EQ(*DecodeBase64("aGVs\nbG8h"), "hell" "o!");
  EXPECT_EQ(*DecodeBase64(B64(std::string("\x00\xff\x10", 3))), std::string("\x00\xff\x10", 3));
  EXPECT_FALSE(DecodeBase64("a$b").ok());
}

TEST(LoadKubeconfig, InlineDataAndCurrentContext) {
  TempDir dir("kubeconfig");
  const std::string path = dir.path() + "/config";
  WriteText(path, "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
                  "clusters:\n"
                  "- name: c1\n  cluster:\n    server: https://10.0.0.1:6443/\n"
                  "    certificate-authority-data: " + B64("CA-PEM") + "\n"
                  "- name: c2\n  cluster:\n    server: http://127.0.0.1:8080\n    insecure-skip-tls-verify: true\n"
                  "users:\n"
                  "- name: u1\n  user:\n    client-certificate-data: " + B64("CERT") + "\n"
                  "    client-key-data: " + B64("KEY") + "\n    token: abc\n"
                  "contexts:\n"
                  "- name: dev\n  context:\n    cluster: c1\n    user: u1\n    namespace: team\n"
                  "- name: other\n  context:\n    cluster: c2\n    user: u1\n");
  auto c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server, "https://10.0.0.1:6443");
  EXPECT_EQ(c->ca_pem, "CA-PEM");
  EXPECT_EQ(c->client_cert_pem, "CERT");
  EXPECT_EQ(c->client_key_pem, "KEY");
  EXPECT_EQ(c->token, "abc");
  EXPECT_EQ(c->default_namespace, "team");
  EXPECT_FALSE(c->insecure_skip_tls_verify);

  auto other = LoadKubeconfig(path, "other");
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_EQ(other->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(other->insecure_skip_tls_verify);
  EXPECT_EQ(other->default_namespace, "default");
}

TEST(LoadKubeconfig, FilesRelativeToTheKubeconfig) {
  TempDir dir("kubeconfig");
  std::filesystem::create_directories(dir.path() + "/kube/certs");
  WriteText(dir.path() + "/kube/certs/ca.crt", "CA-FILE");
  WriteText(dir.path() + "/kube/certs/client.crt", "CERT-FILE");
  WriteText(dir.path() + "/abs-client.key", "KEY-FILE");
  WriteText(dir.path() + "/kube/token", "tok\n");
  const std::string path = dir.path() + "/kube/config";
  WriteText(path, "current-context: x\n"
                  "clusters:\n- name: c\n  cluster:\n    server: https://h:1\n"
                  "    certificate-authority: certs/ca.crt\n"
                  "users:\n- name: u\n  user:\n    client-certificate: certs/client.crt\n"
                  "    client-key: " + dir.path() + "/abs-client.key\n    tokenFile: token\n"
                  "contexts:\n- name: x\n  context: {cluster: c, user: u}\n");
  auto c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->ca_pem, "CA-FILE");
  EXPECT_EQ(c->client_cert_pem, "CERT-FILE");
  EXPECT_EQ(c->client_key_pem, "KEY-FILE");
  EXPECT_EQ(c->token_file, dir.path() + "/kube/token");
}

// Each bad kubeconfig gives one line naming the file and the problem.
TEST(LoadKubeconfig, ErrorsAreOneLineAndNameTheFile) {
  TempDir dir("kubeconfig");
  const std::string path = dir.path() + "/config";
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"current-context: [unclosed\n", "invalid YAML"},
      {"- a\n- b\n", "not a kubeconfig"},
      {"clusters: []\n", "no current-context"},
      {"current-context: nope\ncontexts: []\n", "context \"nope\" not found"},
      {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n", "cluster \"c\""},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {server: https://h}\n"
       "contexts:\n- name: x\n  context: {cluster: c, user: u}\n",
       "user \"u\""},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {certificate-authority: missing.crt, server: https://h}\n"
       "contexts:\n- name: x\n  context: {cluster: c}\n",
       "missing.crt"},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {server: https://h}\n"
       "users:\n- name: u\n  user:\n    exec: {command: aws}\n"
       "contexts:\n- name: x\n  context: {cluster: c, user: u}\n",
       "exec credential plugins are not supported"},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {server: https://h}\n"
       "users:\n- name: u\n  user:\n    auth-provider: {name: gcp}\n"
       "contexts:\n- name: x\n  context: {cluster: c, user: u}\n",
       "auth-provider plugins are not supported"},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {server: ftp://h}\n"
       "contexts:\n- name: x\n  context: {cluster: c}\n",
       "not an http(s) URL"},
      {"current-context: x\nclusters:\n- name: c\n  cluster: {server: https://h, certificate-authority-data: \"!!\"}\n"
       "contexts:\n- name: x\n  context: {cluster: c}\n",
       "certificate-authority-data"},
  };
  for (const auto& c : cases) {
    WriteText(path, c.text);
    auto r = LoadKubeconfig(path);
    ASSERT_FALSE(r.ok()) << c.text;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  auto missing = LoadKubeconfig(dir.path() + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir.path() + "/nope"), std::string::npos);
}

TEST(LoadInClusterConfig, ReadsTheServiceAccountDirectory) {
  TempDir dir("sa");
  WriteText(dir.path() + "/token", "sa-token\n");
  WriteText(dir.path() + "/ca.crt", "CA");
  WriteText(dir.path() + "/namespace", "ops\n");
  ScopedEnv host("KUBERNETES_SERVICE_HOST", "10.96.0.1");
  ScopedEnv port("KUBERNETES_SERVICE_PORT", "443");
  auto c = LoadInClusterConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->token_file, dir.path() + "/token");
  EXPECT_EQ(c->ca_pem, "CA");
  EXPECT_EQ(c->default_namespace, "ops");

  ScopedEnv v6("KUBERNETES_SERVICE_HOST", "fd00::1");
  auto c6 = LoadInClusterConfig(dir.path());
  ASSERT_TRUE(c6.ok());
  EXPECT_EQ(c6->server, "https://[fd00::1]:443");

  std::filesystem::remove(dir.path() + "/ca.crt");
  auto no_ca = LoadInClusterConfig(dir.path());
  ASSERT_FALSE(no_ca.ok());
  EXPECT_NE(no_ca.status().message().find("ca.crt"), std::string::npos);
}

TEST(LoadInClusterConfig, NeedsTheEnvironment) {
  ScopedEnv host("KUBERNETES_SERVICE_HOST", nullptr);
  auto c = LoadInClusterConfig("/nonexistent");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("KUBERNETES_SERVICE_HOST"), std::string::npos);
}

TEST(ResolveConfig, FlagThenEnvThenHome) {
  TempDir dir("resolve");
  const std::string text =
      "current-context: x\nclusters:\n- name: c\n  cluster: {server: https://SERVER}\n"
      "contexts:\n- name: x\n  context: {cluster: c}\n";
  auto write = [&](const std::string& path, const std::string& server) {
    std::string t = text;
    t.replace(t.find("SERVER"), 6, server);
    WriteText(path, t);
  };
  std::filesystem::create_directories(dir.path() + "/home/.kube");
  write(dir.path() + "/flag", "flag");
  write(dir.path() + "/env", "env");
  write(dir.path() + "/home/.kube/config", "home");
  ScopedEnv home("HOME", (dir.path() + "/home").c_str());
  ScopedEnv svc("KUBERNETES_SERVICE_HOST", nullptr);
  {
    ScopedEnv env("KUBECONFIG", (dir.path() + "/missing:" + dir.path() + "/env").c_str());
    EXPECT_EQ(ResolveConfig(dir.path() + "/flag")->server, "https://flag");
    EXPECT_EQ(ResolveConfig("")->server, "https://env");
  }
  ScopedEnv env("KUBECONFIG", nullptr);
  EXPECT_EQ(ResolveConfig("")->server, "https://home");
  std::filesystem::remove(dir.path() + "/home/.kube/config");
  auto none = ResolveConfig("");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("KUBECONFIG"), std::string::npos);
  EXPECT_NE(none.status().message().find(".kube/config"), std::string::npos);
}

}  // namespace
}  // namespace pstar::op
