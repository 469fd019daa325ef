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

std::unique_ptr<OperatorMetrics> StartWith(OperatorSnapshot snapshot, bool legacy_names = false) {
  OperatorMetricsOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.snapshot = [snapshot] { return snapshot; };
  o.legacy_names = legacy_names;
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

  EXPECT_NE(text.find("# TYPE patrickstar_operator_job_phase gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE patrickstar_operator_job_restarts gauge"), std::string::npos) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_phase{name="alpha",namespace="ml",phase="Running"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_phase{name="beta",namespace="ml",phase="Restarting"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_phase{name="alpha",namespace="research",phase="Succeeded"})"), 1)
      << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_restarts{name="alpha",namespace="ml"})"), 0) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_restarts{name="beta",namespace="ml"})"), 3) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_restarts{name="alpha",namespace="research"})"), 1) << text;
  // One series per job and metric: only the current phase, no zeros for the others.
  EXPECT_EQ(CountLines(text, "patrickstar_operator_job_phase{"), 3) << text;
  EXPECT_EQ(CountLines(text, "patrickstar_operator_job_restarts{"), 3) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_job_phase{name="alpha",namespace="ml",phase="Pending"})"), -1) << text;
  // The cluster-wide totals stay, with every phase present.
  EXPECT_EQ(Series(text, R"(patrickstar_operator_jobs{phase="Restarting"})"), 1) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_jobs{phase="Failed"})"), 0) << text;

  // /metrics serves the same series.
  const auto reply = pstar::test::HttpGet(m->port(), "/metrics");
  EXPECT_EQ(reply.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(Series(reply.body, R"(patrickstar_operator_job_restarts{name="beta",namespace="ml"})"), 3) << reply.body;
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
  EXPECT_EQ(CountLines(text, "patrickstar_operator_job_phase{"), 0) << text;
  EXPECT_EQ(CountLines(text, "patrickstar_operator_job_restarts{"), 0) << text;
  EXPECT_EQ(Series(text, R"(patrickstar_operator_jobs{phase="Running"})"), 0) << text;
}

// One prefix for both binaries: the operator's series are
// patrickstar_operator_*. Their names before 0.2 (pstar_operator_*) are
// served beside them only when asked for, with the same samples.
TEST(OperatorMetricsTest, LegacyNamesOnlyWhenAskedFor) {
  OperatorSnapshot s;
  s.jobs_by_phase = {{"Running", 2}};
  s.jobs = {{"ml", "alpha", "Running", 4}};
  s.leader = true;
  auto current = StartWith(s);
  ASSERT_NE(current, nullptr);
  current->RecordReconcile("success", std::chrono::milliseconds(3));
  const std::string text = current->Render();
  EXPECT_EQ(text.find("pstar_operator_"), std::string::npos) << "no series under the old prefix:\n" << text;
  EXPECT_EQ(Series(text, "patrickstar_operator_leader"), 1) << text;

  auto both = StartWith(s, /*legacy_names=*/true);
  ASSERT_NE(both, nullptr);
  both->RecordReconcile("success", std::chrono::milliseconds(3));
  const std::string legacy = both->Render();
  for (const std::string& series :
       {std::string("operator_leader"), std::string(R"(operator_jobs{phase="Running"})"),
        std::string(R"(operator_job_restarts{name="alpha",namespace="ml"})"),
        std::string(R"(operator_reconciles_total{result="success"})"),
        std::string("operator_reconcile_duration_seconds_count")}) {
    EXPECT_EQ(Series(legacy, "pstar_" + series), Series(legacy, "patrickstar_" + series)) << series;
    EXPECT_GE(Series(legacy, "pstar_" + series), 0) << series << "\n" << legacy;
  }
  EXPECT_NE(legacy.find("# TYPE pstar_operator_reconcile_duration_seconds histogram"), std::string::npos);
  EXPECT_NE(legacy.find("# HELP pstar_operator_leader Deprecated name of patrickstar_operator_leader."),
            std::string::npos)
      << legacy;
  EXPECT_EQ(CountLines(legacy, "process_resident_memory_bytes "), 1) << "unprefixed series once";
}

}  // namespace
}  // namespace pstar::op
