// OperatorMetrics renders what the snapshot callback reports: the per-job
// series carry one phase per job and the job's restarts, labelled by
// namespace and name, and /metrics serves the same text.
#include "operator/metrics/operator_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/test_util.h"

namespace pstar::op {
namespace {

// The value of one series in exposition text (-1 when absent).
double Series(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// Lines starting with `prefix` (samples of one metric).
int CountLines(const std::string& text, const std::string& prefix) {
  int n = 0;
  for (size_t at = text.find("\n" + prefix); at != std::string::npos; at = text.find("\n" + prefix, at + 1)) ++n;
  return n;
}

std::unique_ptr<OperatorMetrics> StartWith(OperatorSnapshot snapshot) {
  OperatorMetricsOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.snapshot = [snapshot] { return snapshot; };
  auto m = OperatorMetrics::Start(std::move(o));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(OperatorMetricsTest, PerJobPhaseAndRestarts) {
  OperatorSnapshot s;
  s.jobs_by_phase = {{"Running", 1}, {"Restarting", 1}, {"Succeeded", 1}};
  s.jobs = {{"ml", "alpha", "Running", 0}, {"ml", "beta", "Restarting", 3}, {"research", "alpha", "Succeeded", 1}};
  auto m = StartWith(s);
  ASSERT_NE(m, nullptr);
  const std::string text = m->Render();

  EXPECT_NE(text.find("# TYPE pstar_operator_job_phase gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE pstar_operator_job_restarts gauge"), std::string::npos) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_phase{name="alpha",namespace="ml",phase="Running"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_phase{name="beta",namespace="ml",phase="Restarting"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_phase{name="alpha",namespace="research",phase="Succeeded"})"), 1)
      << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_restarts{name="alpha",namespace="ml"})"), 0) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_restarts{name="beta",namespace="ml"})"), 3) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_restarts{name="alpha",namespace="research"})"), 1) << text;
  // One series per job and metric: only the current phase, no zeros for the others.
  EXPECT_EQ(CountLines(text, "pstar_operator_job_phase{"), 3) << text;
  EXPECT_EQ(CountLines(text, "pstar_operator_job_restarts{"), 3) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_job_phase{name="alpha",namespace="ml",phase="Pending"})"), -1) << text;
  // The cluster-wide totals stay, with every phase present.
  EXPECT_EQ(Series(text, R"(pstar_operator_jobs{phase="Restarting"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_jobs{phase="Failed"})"), 0) << text;

  // /metrics serves the same series.
  const auto reply = pstar::test::HttpGet(m->port(), "/metrics");
  EXPECT_EQ(reply.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(Series(reply.body, R"(pstar_operator_job_restarts{name="beta",namespace="ml"})"), 3) << reply.body;
}

TEST(OperatorMetricsTest, ServesTheStandardProcessSeries) {
  auto m = StartWith(OperatorSnapshot{});
  ASSERT_NE(m, nullptr);
  const std::string text = m->Render();
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos) << text;
  EXPECT_GT(Series(text, "process_resident_memory_bytes"), 1 << 20) << text;
  EXPECT_GE(Series(text, "process_open_fds"), 3) << text;
  EXPECT_GE(Series(text, "process_threads"), 1) << text;
  EXPECT_GT(Series(text, "process_start_time_seconds"), 1.7e9) << text;
}

TEST(OperatorMetricsTest, NoJobsNoPerJobSeries) {
  auto m = StartWith(OperatorSnapshot{});
  ASSERT_NE(m, nullptr);
  const std::string text = m->Render();
  EXPECT_EQ(CountLines(text, "pstar_operator_job_phase{"), 0) << text;
  EXPECT_EQ(CountLines(text, "pstar_operator_job_restarts{"), 0) << text;
  EXPECT_EQ(Series(text, R"(pstar_operator_jobs{phase="Running"})"), 0) << text;
}

}  // namespace
}  // namespace pstar::op
