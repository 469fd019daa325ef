// The pod's command, run as the kubelet would run it (env set, $(VAR)
// references in args expanded): the real pstar binary must accept the
// arguments, the ConfigMap's YAML and the host budget, and train.
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "operator/job/desired_objects.h"
#include "tests/operator/job/job_fixtures.h"
#include "tests/test_util.h"

namespace pstar::op {
namespace {

// Kubernetes' $(VAR) expansion of container args from the container's env.
std::string Expand(const std::string& arg, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < arg.size(); ++i) {
    if (arg.compare(i, 2, "$(") == 0) {
      const size_t end = arg.find(')', i);
      auto it = end == std::string::npos ? env.end() : env.find(arg.substr(i + 2, end - i - 2));
      if (it != env.end()) {
        out += it->second;
        i = end;
        continue;
      }
    }
    out += arg[i];
  }
  return out;
}

TEST(WorkerCommandTest, PstarRunsThePodCommand) {
  Json job = test::MinimalJob();
  job["spec"]["numNodes"] = 1;
  job["spec"]["masterPort"] = pstar::test::FreePort();
  job["spec"]["metricsPort"] = pstar::test::FreePorts(2);  // two ranks: port and port + 1
  job["spec"]["config"]["train"]["steps"] = 2;
  const JobSpec spec = test::MustParse(job);
  auto sizing = SizePods(spec);
  ASSERT_TRUE(sizing.ok()) << sizing.status().message();
  const Json pod = DesiredPod(spec, *sizing, 0, 0);
  const Json& container = pod["spec"]["containers"][0];

  pstar::test::TempDir dir("worker-command");
  const std::string config_path = dir.path() + "/job.yaml";
  std::ofstream(config_path) << DesiredConfigMap(spec)["data"]["job.yaml"].get<std::string>();

  // The pod's env, with what DNS and the downward API would give on one machine.
  std::map<std::string, std::string> env;
  std::vector<std::string> env_list;
  for (const Json& e : container["env"]) {
    std::string value = e.contains("value") ? e["value"].get<std::string>() : "127.0.0.1";  // POD_IP
    if (e["name"] == "MASTER_ADDR") value = "127.0.0.1";
    env[e["name"]] = value;
    env_list.push_back(e["name"].get<std::string>() + "=" + value);
  }
  std::vector<std::string> argv = {pstar::test::PstarBinary()};
  for (const Json& a : container["args"]) {
    std::string arg = Expand(a.get<std::string>(), env);
    argv.push_back(arg == kConfigPath ? config_path : arg);
  }
  pstar::test::ChildProcess worker(argv, env_list);
  const auto result = worker.Wait();
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  // The budget the operator computed is the one the worker runs with.
  char budget[64];
  std::snprintf(budget, sizeof budget, "host budget %.1f MiB (config)",
                double(sizing->worker_host_budget_bytes) / double(1 << 20));
  EXPECT_NE(result.out.find(budget), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("summary: steps=2"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("metrics: http://127.0.0.1:" + std::to_string(spec.metrics_port + 1) + "/metrics"),
            std::string::npos)
      << result.out;
}

}  // namespace
}  // namespace pstar::op
