// `pstar plan` and the live metrics endpoint of `pstar train`, as a user meets them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/test_util.h"

namespace pstar {
namespace {

using test::RunProcess;

const char* kJob =
    "model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 256, max_seq_len: 32}\n"
    "train: {batch_size: 2, seq_len: 16, steps: 3, log_every: 1}\n"
    "default_chunk_size: 8192\n";

TEST(Plan, PrintsTheMemoryPlanAndMatchesItsJson) {
  test::TempDir dir("plan");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  auto text = RunProcess({test::PstarBinary(), "plan", "--config", dir.path() + "/job.yaml"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* line : {"parameters", "chunks: param", "chunks: exp_avg_sq", "device: minimum",
                           "device: all resident", "host: minimum"}) {
    EXPECT_NE(text.out.find(line), std::string::npos) << line << "\n" << text.out;
  }
  auto json = RunProcess({test::PstarBinary(), "plan", "--config", dir.path() + "/job.yaml", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto p = nlohmann::json::parse(json.out);
  EXPECT_EQ(p["chunk_elems"].get<int64_t>(), 8192);
  EXPECT_EQ(p["model_bytes"].get<int64_t>(), 4 * p["chunks_per_kind"].get<int64_t>() * 8192 * 4);
  EXPECT_NE(text.out.find("(" + std::to_string(p["min_device_bytes"].get<int64_t>()) + " bytes)"),
            std::string::npos);

  // The minimum it prints is enough to train, and one byte less is refused with the numbers.
  const int64_t min = p["min_device_bytes"].get<int64_t>();
  auto ok = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                        "runtime.device_memory=" + std::to_string(min)});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("chunks move"), std::string::npos) << ok.out;
  auto small = RunProcess({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                           "runtime.device_memory=" + std::to_string(min - 1)});
  EXPECT_EQ(small.exit_code, 2);
  EXPECT_NE(small.err.find("need at least " + std::to_string(min) + " bytes"), std::string::npos) << small.err;

  auto bad = RunProcess({test::PstarBinary(), "plan", "--set", "runtime.device_memory=lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("runtime.device_memory"), std::string::npos) << bad.err;
}

// The plan ends with its verdict for the budgets the job would run with, and
// says it in its exit status: the host budget at which it turns is the one
// at which `pstar train` refuses the job.
TEST(Plan, EndsWithItsVerdictAndExitsOneWhenTheJobDoesNotFit) {
  test::TempDir dir("plan-verdict");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const std::vector<std::string> plan = {test::PstarBinary(), "plan", "--config", dir.path() + "/job.yaml"};
  auto fits = RunProcess(plan);
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_NE(fits.out.find("\nverdict: fits: host needs "), std::string::npos) << fits.out;
  std::vector<std::string> json = plan;
  json.push_back("--json");
  auto j = RunProcess(json);
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto verdict = nlohmann::json::parse(j.out)["verdict"];
  EXPECT_TRUE(verdict["fits"].get<bool>());
  const int64_t min_host = nlohmann::json::parse(j.out)["min_host_bytes"].get<int64_t>();
  ASSERT_EQ(verdict["tiers"].back()["tier"], "host");
  EXPECT_EQ(verdict["tiers"].back()["need_bytes"].get<int64_t>(), min_host);

  auto with = [&](std::vector<std::string> argv, int64_t host_bytes) {
    argv.insert(argv.end(), {"--set", "runtime.host_memory=" + std::to_string(host_bytes)});
    return RunProcess(argv);
  };
  auto at_min = with(plan, min_host);
  EXPECT_EQ(at_min.exit_code, 0) << at_min.out;
  auto below = with(plan, min_host - 1);
  EXPECT_EQ(below.exit_code, 1) << below.out << below.err;
  EXPECT_NE(below.out.find("host: minimum"), std::string::npos) << below.out;  // the plan is still printed
  EXPECT_NE(below.out.find("\nverdict: does not fit: host needs "), std::string::npos) << below.out;
  EXPECT_NE(below.out.find("(config), short by 1 B"), std::string::npos) << below.out;
  EXPECT_NE(below.out.find("\n  change: runtime.host_memory: at least "), std::string::npos) << below.out;
  auto below_json = with(json, min_host - 1);
  EXPECT_EQ(below_json.exit_code, 1);
  const auto refused = nlohmann::json::parse(below_json.out)["verdict"];
  EXPECT_FALSE(refused["fits"].get<bool>());
  EXPECT_FALSE(refused["tiers"].back()["fits"].get<bool>());
  EXPECT_FALSE(refused["changes"].empty());

  const std::vector<std::string> train = {test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml",
                                          "--set", "train.steps=1"};
  EXPECT_EQ(with(train, min_host).exit_code, 0);
  auto refused_train = with(train, min_host - 1);
  EXPECT_EQ(refused_train.exit_code, 2);
  EXPECT_NE(refused_train.err.find("host memory budget too small"), std::string::npos) << refused_train.err;
}

// One sample's value from a text exposition, or -1 when absent.
double Sample(const std::string& body, const std::string& series) {
  size_t at = body.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + series.size() + 2));
}

// `name{...}` with the constant labels plus `extra`, in the exposition's sorted order.
std::string Series(const std::string& name, std::map<std::string, std::string> extra = {}) {
  extra.insert({{"rank", "0"}});  // job and namespace come from the scrape target
  std::string out = name + "{";
  for (const auto& [k, v] : extra) out += (out.back() == '{' ? "" : ",") + k + "=\"" + v + "\"";
  return out + "}";
}

// What a rank really holds stays within what the plan (and so the operator's
// pod sizing) gives it: the default job's peak RSS against min_host_bytes.
TEST(Plan, TheDefaultJobsPeakRssIsWithinTheHostPlan) {
  if (test::kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer's shadow memory inflates RSS; the Release build checks this";
  auto plan = RunProcess({test::PstarBinary(), "plan", "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const int64_t planned = nlohmann::json::parse(plan.out)["min_host_bytes"].get<int64_t>();
  auto train = RunProcess({test::PstarBinary(), "train", "--set", "train.steps=20"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  rusage usage{};
  ASSERT_EQ(::getrusage(RUSAGE_CHILDREN, &usage), 0);
  const int64_t peak = int64_t(usage.ru_maxrss) * 1024;  // of either child: both must fit
  EXPECT_LE(peak, planned) << "peak RSS " << peak / (1 << 20) << " MiB, planned " << planned / (1 << 20) << " MiB";
}

TEST(Metrics, ServesLiveChunkSeriesDuringTraining) {
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/promtool"))
      << "/usr/bin/promtool is missing: install Debian's prometheus package (scripts/install-deps.sh)";
  test::TempDir dir("metrics");
  test::WriteText(dir.path() + "/job.yaml", kJob);
  const int port = test::FreePort();
  ASSERT_GT(port, 0);
  // A device tier of half the model: chunks move every step.
  auto plan = RunProcess({test::PstarBinary(), "plan", "--config", dir.path() + "/job.yaml", "--json"});
  ASSERT_EQ(plan.exit_code, 0);
  auto p = nlohmann::json::parse(plan.out);
  const int64_t budget = p["activation_bytes"].get<int64_t>() + p["model_bytes"].get<int64_t>() / 2;
  test::ChildProcess train({test::PstarBinary(), "train", "--config", dir.path() + "/job.yaml", "--set",
                            "train.steps=1000000", "--set", "metrics.port=" + std::to_string(port), "--set",
                            "metrics.bind_address=127.0.0.1", "--set",
                            "runtime.device_memory=" + std::to_string(budget)});
  std::string body;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double first_steps = -1;
  while (std::chrono::steady_clock::now() < deadline && train.Running()) {
    auto r = test::HttpGet(port, "/metrics");
    if (r.ok) {
      double steps = Sample(r.body, Series("patrickstar_steps_total"));
      if (first_steps < 0 && steps >= 1) first_steps = steps;
      if (first_steps >= 1 && steps >= first_steps + 2) {
        body = r.body;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(body.empty()) << "no live metrics within 60 s; stdout:\n" << train.Stdout();

  EXPECT_GT(Sample(body, Series("patrickstar_chunk_resident_bytes", {{"tier", "host"}, {"kind", "param"}})), 0);
  EXPECT_GE(Sample(body, Series("patrickstar_chunk_resident_bytes", {{"tier", "device"}, {"kind", "param"}})), 0);
  EXPECT_GT(Sample(body, Series("patrickstar_chunk_moved_bytes_total", {{"direction", "h2d"}})), 0);
  EXPECT_GT(Sample(body, Series("patrickstar_chunk_moved_bytes_total", {{"direction", "d2h"}})), 0);
  EXPECT_EQ(Sample(body, Series("patrickstar_device_capacity_bytes")), double(budget));
  EXPECT_GT(Sample(body, Series("patrickstar_non_model_bytes", {{"tier", "device"}})), 0);
  EXPECT_GT(Sample(body, Series("patrickstar_tokens_total")), 0);
  EXPECT_GT(Sample(body, Series("patrickstar_loss")), 0);
  EXPECT_NE(body.find("patrickstar_step_duration_seconds_bucket"), std::string::npos);
  EXPECT_NE(body.find("patrickstar_build_info"), std::string::npos);

  // The exposition as scraped mid-run passes promtool.
  const std::string path = dir.path() + "/scrape.txt";
  test::WriteText(path, body);
  auto check = RunProcess({"/bin/sh", "-c", "exec /usr/bin/promtool check metrics < \"$0\"", path});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;

  train.Signal(SIGINT);
  auto done = train.Wait();
  EXPECT_EQ(done.exit_code, 130) << done.err;
  EXPECT_NE(done.out.find("chunks: h2d_bytes="), std::string::npos) << done.out;
}

}  // namespace
}  // namespace pstar
