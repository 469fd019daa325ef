// Every example job in examples/jobs/ parses with the operator's ParseJob and
// sizes with SizePods, as the operator would do on `kubectl apply`; the
// expectations pin what each example is for (its shape, its device, a
// checkpoint volume), and the sizing numbers are printed for the docs.
#include <yaml-cpp/yaml.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "operator/job/desired_objects.h"
#include "operator/job/job_spec.h"
#include "operator/job/sizing.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

namespace fs = std::filesystem;

// YAML to JSON, keeping scalar types: an unquoted scalar that reads as a
// bool, an integer or a float becomes one; quoted scalars stay strings.
Json ToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = ToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(ToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;  // quoted
      if (text == "true" || text == "false") return text == "true";
      if (text == "null" || text == "~") return nullptr;
      int64_t i;
      if (YAML::convert<int64_t>::decode(node, i)) return i;
      double d;
      if (YAML::convert<double>::decode(node, d)) return d;
      return text;
    }
    default:
      return nullptr;
  }
}

std::vector<std::string> ExampleFiles() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(pstar::test::SourceDir() + "/examples/jobs")) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Json LoadExample(const std::string& name) {
  Json job = ToJson(YAML::LoadFile(pstar::test::SourceDir() + "/examples/jobs/" + name));
  // What the API server adds before the operator sees the job.
  job["metadata"]["namespace"] = "default";
  job["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001";
  job["metadata"]["generation"] = 1;
  return job;
}

TEST(ExamplesTest, TheExpectedExamplesExist) {
  std::vector<std::string> names;
  for (const auto& f : ExampleFiles()) names.push_back(fs::path(f).filename().string());
  for (const char* want : {"tiny-cpu.yaml", "gpt2-124m.yaml", "gpt2-1.5b.yaml", "gpt-10b.yaml"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

TEST(ExamplesTest, EveryExampleParsesAndSizes) {
  const auto files = ExampleFiles();
  ASSERT_FALSE(files.empty());
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const Json job = LoadExample(fs::path(path).filename().string());
    EXPECT_EQ(job.value("apiVersion", ""), kApiVersion);
    EXPECT_EQ(job.value("kind", ""), kKind);
    auto spec = ParseJob(job);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    auto sizing = SizePods(*spec);
    ASSERT_TRUE(sizing.ok()) << sizing.status().message();
    EXPECT_GT(sizing->request_bytes, 0);
    EXPECT_GE(sizing->limit_bytes, sizing->request_bytes);
    // Every pod can be built from it.
    for (int i = 0; i < spec->num_nodes; ++i) {
      const Json pod = DesiredPod(*spec, *sizing, i, 0);
      EXPECT_EQ(pod["metadata"]["name"], PodName(*spec, i));
    }
    std::printf("%-16s %2d x %d %-4s %s per pod (limit %s), %lld parameters\n", spec->name.c_str(),
                spec->num_nodes, spec->nproc_per_node, spec->device == JobDevice::kCuda ? "cuda" : "cpu",
                HumanBytes(sizing->request_bytes).c_str(), HumanBytes(sizing->limit_bytes).c_str(),
                static_cast<long long>(sizing->parameters));
  }
}

// Checkpoints go to a volume of the template, so a restarted gang resumes.
void ExpectCheckpointVolume(const JobSpec& spec) {
  const std::string dir = spec.config["checkpoint"].value("dir", "");
  ASSERT_FALSE(dir.empty());
  bool mounted = false;
  for (const Json& m : spec.overrides.volume_mounts) {
    const std::string mount = m.value("mountPath", "");
    if (dir.rfind(mount + "/", 0) == 0) {
      mounted = true;
      bool declared = false;
      for (const Json& v : spec.overrides.volumes) declared |= v.value("name", "") == m.value("name", "");
      EXPECT_TRUE(declared) << "volume " << m.value("name", "");
    }
  }
  EXPECT_TRUE(mounted) << dir << " is not on a mounted volume";
}

TEST(ExamplesTest, TinyCpuIsASmallCpuGang) {
  auto spec = ParseJob(LoadExample("tiny-cpu.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->device, JobDevice::kCpu);
  EXPECT_EQ(spec->num_nodes, 2);
  EXPECT_EQ(spec->nproc_per_node, 1);
  EXPECT_EQ(spec->config["model"].value("preset", ""), "tiny");
  EXPECT_EQ(spec->config["data"].value("source", ""), "generated");
  // It runs anywhere, so it keeps no checkpoints: they would need a shared volume.
  EXPECT_FALSE(spec->config.contains("checkpoint"));
  auto sizing = SizePods(*spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  // Small enough for any node, and for the fake kubelet's default 64Gi node.
  EXPECT_LT(sizing->limit_bytes, int64_t(4) << 30);
}

TEST(ExamplesTest, GpuExamplesUsePersistentCheckpoints) {
  for (const char* name : {"gpt2-124m.yaml", "gpt2-1.5b.yaml", "gpt-10b.yaml"}) {
    SCOPED_TRACE(name);
    auto spec = ParseJob(LoadExample(name));
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(spec->device, JobDevice::kCuda);
    ExpectCheckpointVolume(*spec);
    bool pvc = false;
    for (const Json& v : spec->overrides.volumes) pvc |= v.contains("persistentVolumeClaim");
    EXPECT_TRUE(pvc);
    // The worker runs as a non-root user: fsGroup lets it write the checkpoints.
    const Json& psc = spec->overrides.pod_security_context;
    ASSERT_TRUE(psc.is_object());
    EXPECT_EQ(psc.value("runAsNonRoot", false), true);
    EXPECT_EQ(psc.value("fsGroup", 0), 10001);
    auto sizing = SizePods(*spec);
    ASSERT_TRUE(sizing.ok()) << sizing.status().message();
    EXPECT_EQ(DesiredPod(*spec, *sizing, 0, 0)["spec"]["securityContext"]["fsGroup"], 10001);
  }
}

TEST(ExamplesTest, TheLlamaFineTuneImportsFromOneVolumeAndExportsToAnother) {
  auto spec = ParseJob(LoadExample("llama-3.1-8b-finetune.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->device, JobDevice::kCuda);
  ExpectCheckpointVolume(*spec);
  EXPECT_EQ(spec->export_dir, "/exports/llama-3.1-8b-finetuned");
  const std::string init_from = spec->config["model"].value("init_from", "");
  bool read_only_models = false;
  for (const Json& m : spec->overrides.volume_mounts) {
    if (init_from.rfind(m.value("mountPath", "") + "/", 0) == 0) read_only_models = m.value("readOnly", false);
  }
  EXPECT_TRUE(read_only_models) << init_from << " is on a read-only volume";
  auto sizing = SizePods(*spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  EXPECT_GT(sizing->parameters, int64_t(8'000'000'000));
  EXPECT_LT(sizing->parameters, int64_t(8'100'000'000));
  // The rank-0 pod exports: its worker is told where.
  const Json pod = DesiredPod(*spec, *sizing, 0, 0);
  const std::string args = pod["spec"]["containers"][0]["args"].dump();
  EXPECT_NE(args.find("checkpoint.export_dir=/exports/llama-3.1-8b-finetuned"), std::string::npos) << args;
}

TEST(ExamplesTest, TenBillionModelIsTenBillion) {
  auto spec = ParseJob(LoadExample("gpt-10b.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->world_size(), 32);
  auto sizing = SizePods(*spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  EXPECT_GT(sizing->parameters, int64_t(9'500'000'000));
  EXPECT_LT(sizing->parameters, int64_t(11'000'000'000));
}

}  // namespace
}  // namespace pstar::op
