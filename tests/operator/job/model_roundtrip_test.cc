// The objects the operator creates, through the official Kubernetes Python
// models (tests/fixtures/k8s_model_roundtrip.py): a misspelt or misplaced
// field is dropped by the models and reported.
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "operator/job/desired_objects.h"
#include "tests/operator/job/job_fixtures.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

using test::FullJob;
using test::MinimalJob;
using test::MustParse;

constexpr const char* kPython = "/usr/bin/python3";

std::string Fixture() { return pstar::test::SourceDir() + "/tests/fixtures/k8s_model_roundtrip.py"; }

std::string WriteJson(const std::string& dir, const std::string& name, const Json& value) {
  const std::string path = dir + "/" + name + ".json";
  std::ofstream(path) << value.dump(2);
  return path;
}

// Runs the fixture on `files`; skips the test when it cannot run here.
pstar::test::ProcessResult RunFixture(const std::vector<std::string>& files) {
  std::vector<std::string> argv = {kPython, Fixture()};
  argv.insert(argv.end(), files.begin(), files.end());
  return pstar::test::RunProcess(argv);
}

// Specs covering every override: a cpu job, a cuda job with every field set,
// and a one-node cuda job without metrics, with a fixed limit only.
std::vector<JobSpec> Specs() {
  Json quiet = MinimalJob("quiet");
  quiet["spec"]["device"] = "cuda";
  quiet["spec"]["numNodes"] = 1;
  quiet["spec"]["metricsPort"] = 0;
  quiet["spec"]["nccl"] = {{"ibDisable", false}};
  quiet["spec"]["template"] = {
      {"container", {{"resources", {{"limits", {{"memory", "16Gi"}, {"nvidia.com/gpu", 2}}},
                                    {"requests", {{"nvidia.com/gpu", "2"}, {"cpu", "500m"}}}}}}}};
  return {MustParse(MinimalJob()), MustParse(FullJob()), MustParse(quiet)};
}

TEST(ModelRoundTripTest, DesiredObjectsMatchTheKubernetesModels) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is missing";
  pstar::test::TempDir dir("roundtrip");
  std::vector<std::string> files;
  int objects = 0;
  for (const JobSpec& spec : Specs()) {
    auto sizing = SizePods(spec);
    ASSERT_TRUE(sizing.ok()) << spec.name << ": " << sizing.status().message();
    files.push_back(WriteJson(dir.path(), spec.name + "-service", DesiredService(spec)));
    files.push_back(WriteJson(dir.path(), spec.name + "-configmap", DesiredConfigMap(spec)));
    files.push_back(WriteJson(dir.path(), spec.name + "-secret", DesiredStoreTokenSecret(spec, "0123abcd")));
    NetworkPolicyOptions policy;
    policy.enabled = true;
    policy.operator_namespace = "pstar-system";
    policy.operator_pod_labels = {{"app.kubernetes.io/name", "patrickstar"}, {"app.kubernetes.io/component", "operator"}};
    files.push_back(WriteJson(dir.path(), spec.name + "-netpol", DesiredNetworkPolicy(spec, policy)));
    Json pods = Json::array();
    for (int i = 0; i < spec.num_nodes; ++i) pods.push_back(DesiredPod(spec, *sizing, i, i % 2));
    files.push_back(WriteJson(dir.path(), spec.name + "-pods", pods));
    objects += 4 + spec.num_nodes;
  }
  const auto result = RunFixture(files);
  if (result.exit_code == 77) GTEST_SKIP() << result.err;
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find(std::to_string(objects) + " objects checked: all round-trip"), std::string::npos)
      << result.out << result.err;
}

TEST(ModelRoundTripTest, CrdMatchesTheKubernetesModels) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is missing";
  // The CEL rules are checked by CrdTest; the installed models predate them.
  const auto result = RunFixture(
      {"--ignore-key", "x-kubernetes-validations", pstar::test::SourceDir() + "/crds/patrickstarjob.yaml"});
  if (result.exit_code == 77) GTEST_SKIP() << result.err;
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("1 objects checked: all round-trip"), std::string::npos) << result.out << result.err;
}

TEST(ModelRoundTripTest, MisspeltFieldsAreCaught) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is missing";
  pstar::test::TempDir dir("roundtrip-bad");
  const JobSpec spec = MustParse(FullJob());
  auto sizing = SizePods(spec);
  ASSERT_TRUE(sizing.ok());
  Json pod = DesiredPod(spec, *sizing, 0, 0);
  pod["spec"]["containers"][0]["volumeMount"] = pod["spec"]["containers"][0]["volumeMounts"];
  auto result = RunFixture({WriteJson(dir.path(), "pod", pod)});
  if (result.exit_code == 77) GTEST_SKIP() << result.err;
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("Pod.spec.containers[0].volumeMount"), std::string::npos) << result.err;

  Json svc = DesiredService(spec);
  svc["spec"]["publishNotReadyAddresses"] = "true";  // a string where the model has a boolean
  svc["metadata"]["ownerReferences"][0]["controler"] = true;
  result = RunFixture({WriteJson(dir.path(), "svc", svc)});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("Service.metadata.ownerReferences[0].controler"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace pstar::op
