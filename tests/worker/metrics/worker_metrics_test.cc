#include <gtest/gtest.h>

#include <chrono>

#include "worker/metrics/worker_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "worker/core/build_info.h"

namespace pstar {
namespace {

using Labels = std::map<std::string, std::string>;

constexpr const char* kPromtool = "/usr/bin/promtool";

// GET over a plain socket; fails the test when the request does.
test::HttpResponse HttpGet(int port, const std::string& path) {
  test::HttpResponse resp = test::HttpGet(port, path);
  EXPECT_TRUE(resp.ok) << resp.error;
  return resp;
}

// The text exposition format, parsed just enough for these tests (no escapes
// in label values, no timestamps).
struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> type, help;  // by family name

  // The value of the one sample with exactly these labels.
  std::optional<double> Get(const std::string& name, const Labels& labels) const {
    std::optional<double> found;
    for (const Sample& s : samples) {
      if (s.name != name || s.labels != labels) continue;
      EXPECT_FALSE(found.has_value()) << "duplicate sample " << name;
      found = s.value;
    }
    return found;
  }
  int Count(const std::string& name) const {
    int n = 0;
    for (const Sample& s : samples) n += s.name == name;
    return n;
  }
};

Exposition Parse(const std::string& body) {
  Exposition e;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t sp = rest.find(' ');
      auto& table = line[2] == 'H' ? e.help : e.type;
      table[rest.substr(0, sp)] = sp == std::string::npos ? "" : rest.substr(sp + 1);
      continue;
    }
    if (line[0] == '#') continue;
    Sample s;
    const size_t value_at = line.rfind(' ');
    const std::string series = line.substr(0, value_at);
    s.value = std::strtod(line.c_str() + value_at + 1, nullptr);
    const size_t brace = series.find('{');
    s.name = series.substr(0, brace);
    if (brace != std::string::npos) {
      // name="value",name="value"}
      size_t i = brace + 1;
      while (i < series.size() && series[i] != '}') {
        const size_t eq = series.find('=', i);
        const size_t close = series.find('"', eq + 2);
        s.labels[series.substr(i, eq - i)] = series.substr(eq + 2, close - eq - 2);
        i = close + 1;
        if (i < series.size() && series[i] == ',') ++i;
      }
    }
    e.samples.push_back(std::move(s));
  }
  return e;
}

// job and namespace come from the scrape target (metrics.job_labels is off).
const Labels kConstant = {{"rank", "3"}};

Labels With(Labels extra) {
  extra.insert(kConstant.begin(), kConstant.end());
  return extra;
}

// With the deprecated label options off unless asked for.
std::unique_ptr<WorkerMetrics> StartOnLoopback(bool job_labels = false, bool device_label = false) {
  MetricsOptions options;
  options.job_labels = job_labels;
  options.device_label = device_label;
  options.bind_address = "127.0.0.1";
  options.port = 0;
  options.job = "pretrain-7";
  options.ns = "";  // -> "default"
  options.rank = "3";
  Result<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start(options);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return nullptr;
  EXPECT_GT((*m)->port(), 0);
  return std::move(m).value();
}

void Fill(RuntimeCounters& c) {
  const int dev = static_cast<int>(Tier::kDevice), host = static_cast<int>(Tier::kHost);
  c.resident_bytes[dev][static_cast<int>(StateKind::kParam)] = 4096;
  c.resident_chunks[dev][static_cast<int>(StateKind::kParam)] = 2;
  c.resident_bytes[host][static_cast<int>(StateKind::kExpAvgSq)] = 1 << 20;
  c.resident_chunks[host][static_cast<int>(StateKind::kExpAvgSq)] = 8;
  c.non_model_bytes[dev] = 3000;
  c.non_model_bytes[host] = 500;
  c.device_capacity_bytes = int64_t{80} << 30;
  c.chunk_budget_bytes = int64_t{60} << 30;
  c.moves[static_cast<int>(Direction::kHostToDevice)] = 5;
  c.moved_bytes[static_cast<int>(Direction::kHostToDevice)] = 5 * 4096;
  c.moves[static_cast<int>(Direction::kDeviceToHost)] = 1;
  c.moved_bytes[static_cast<int>(Direction::kDeviceToHost)] = 4096;
  c.evictions[static_cast<int>(StateKind::kGrad)] = 4;
  c.prefetches = 7;
  c.prefetch_hits = 6;
}

TEST(WorkerMetrics, ServesEveryFamilyWithConstantLabels) {
  RuntimeCounters counters;  // outlives the metrics
  CollectiveCounters collectives;
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);

  // Before anything is attached or recorded: build info and zero totals only.
  test::HttpResponse first = HttpGet(metrics->port(), "/metrics");
  ASSERT_NE(first.status_line.find(" 200"), std::string::npos) << first.status_line;
  Exposition before = Parse(first.body);
  EXPECT_EQ(before.Count("patrickstar_chunk_resident_bytes"), 0);
  EXPECT_EQ(before.Count("patrickstar_collective_bytes_total"), 0);
  EXPECT_EQ(before.Count("patrickstar_loss"), 0);
  EXPECT_EQ(before.Get("patrickstar_steps_total", kConstant), 0.0);

  Fill(counters);
  metrics->AttachRuntimeCounters(&counters);
  metrics->RecordStep(0.5, 1024, 3.25, 6e-4, 1.5, 1.0, 0.42);
  metrics->RecordStep(1.5, 1024, 3.0, 5e-4, 1.25, 65536.0, 0.45);
  metrics->RecordSkippedStep();
  metrics->RecordStepWaits(0.5, 0.25, 0.125, 3, true);
  metrics->RecordStepWaits(0.5, 0.25, 0.0, 2, false);
  metrics->RecordCollectiveWait(0.375);
  metrics->RecordCollectiveWait(-1.0);  // never counts down
  metrics->AttachCollectiveCounters(&collectives);
  // Two all_reduce calls of 1 MiB (0.25 s and 0.5 s) and one barrier (0.125 s).
  collectives.calls[int(CollectiveOp::kAllReduce)] = 2;
  collectives.bytes[int(CollectiveOp::kAllReduce)] = 2 << 20;
  collectives.nanoseconds[int(CollectiveOp::kAllReduce)] = 750000000;
  collectives.calls[int(CollectiveOp::kBarrier)] = 1;
  collectives.nanoseconds[int(CollectiveOp::kBarrier)] = 125000000;

  test::HttpResponse resp = HttpGet(metrics->port(), "/metrics");
  ASSERT_NE(resp.status_line.find(" 200"), std::string::npos) << resp.status_line;
  Exposition e = Parse(resp.body);

  const std::map<std::string, std::string> families = {
      {"patrickstar_chunk_resident_bytes", "gauge"},
      {"patrickstar_chunk_resident_chunks", "gauge"},
      {"patrickstar_non_model_bytes", "gauge"},
      {"patrickstar_device_capacity_bytes", "gauge"},
      {"patrickstar_chunk_budget_bytes", "gauge"},
      {"patrickstar_chunk_moves_total", "counter"},
      {"patrickstar_chunk_moved_bytes_total", "counter"},
      {"patrickstar_chunk_evictions_total", "counter"},
      {"patrickstar_chunk_prefetches_total", "counter"},
      {"patrickstar_chunk_prefetch_hits_total", "counter"},
      {"patrickstar_step_duration_seconds", "histogram"},
      {"patrickstar_steps_total", "counter"},
      {"patrickstar_tokens_total", "counter"},
      {"patrickstar_skipped_steps_total", "counter"},
      {"patrickstar_step_compute_seconds_total", "counter"},
      {"patrickstar_optimizer_host_seconds_total", "counter"},
      {"patrickstar_optimizer_wait_seconds_total", "counter"},
      {"patrickstar_collective_wait_seconds_total", "counter"},
      {"patrickstar_optimizer_speculated_chunks_total", "counter"},
      {"patrickstar_optimizer_rolled_back_steps_total", "counter"},
      {"patrickstar_loss", "gauge"},
      {"patrickstar_learning_rate", "gauge"},
      {"patrickstar_grad_norm", "gauge"},
      {"patrickstar_loss_scale", "gauge"},
      {"patrickstar_mfu", "gauge"},
      {"patrickstar_collective_bytes_total", "counter"},
      {"patrickstar_collective_seconds_total", "counter"},
      {"patrickstar_build_info", "gauge"},
  };
  for (const auto& [name, type] : families) {
    EXPECT_EQ(e.type[name], type) << name;
    EXPECT_FALSE(e.help[name].empty()) << name << " has no HELP";
  }

  // Every one of our series carries the constant labels, and only the allowed ones.
  const std::vector<std::string> allowed = {"job", "namespace", "rank", "tier", "kind",
                                            "direction", "op", "le", "version", "cuda"};
  int ours = 0;
  for (const Sample& s : e.samples) {
    if (s.name.rfind("patrickstar_", 0) != 0) continue;
    ++ours;
    for (const auto& [k, v] : kConstant) EXPECT_EQ(s.labels.count(k) ? s.labels.at(k) : "<none>", v) << s.name;
    for (const auto& [k, v] : s.labels) {
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), k), allowed.end()) << s.name << " label " << k;
    }
  }
  EXPECT_GT(ours, 40);

  // Chunk residency: every tier x kind, zeros included (no disk tier here).
  EXPECT_EQ(e.Count("patrickstar_chunk_resident_bytes"), (kNumTiers - 1) * kNumStateKinds);
  EXPECT_EQ(e.Count("patrickstar_chunk_resident_chunks"), (kNumTiers - 1) * kNumStateKinds);
  EXPECT_EQ(e.Count("patrickstar_chunk_tier_read_bytes_total"), 0);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", With({{"tier", "device"}, {"kind", "param"}})), 4096);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_chunks", With({{"tier", "device"}, {"kind", "param"}})), 2);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", With({{"tier", "host"}, {"kind", "exp_avg_sq"}})), 1 << 20);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_chunks", With({{"tier", "host"}, {"kind", "exp_avg_sq"}})), 8);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", With({{"tier", "host"}, {"kind", "grad"}})), 0);
  EXPECT_EQ(e.Get("patrickstar_non_model_bytes", With({{"tier", "device"}})), 3000);
  EXPECT_EQ(e.Get("patrickstar_non_model_bytes", With({{"tier", "host"}})), 500);
  EXPECT_EQ(e.Get("patrickstar_device_capacity_bytes", kConstant), double(int64_t{80} << 30));
  EXPECT_EQ(e.Get("patrickstar_chunk_budget_bytes", kConstant), double(int64_t{60} << 30));
  EXPECT_EQ(e.Get("patrickstar_chunk_moves_total", With({{"direction", "h2d"}})), 5);
  EXPECT_EQ(e.Get("patrickstar_chunk_moves_total", With({{"direction", "d2h"}})), 1);
  EXPECT_EQ(e.Get("patrickstar_chunk_moved_bytes_total", With({{"direction", "h2d"}})), 5 * 4096);
  EXPECT_EQ(e.Get("patrickstar_chunk_moved_bytes_total", With({{"direction", "d2h"}})), 4096);
  EXPECT_EQ(e.Count("patrickstar_chunk_evictions_total"), kNumStateKinds);
  EXPECT_EQ(e.Get("patrickstar_chunk_evictions_total", With({{"kind", "grad"}})), 4);
  EXPECT_EQ(e.Get("patrickstar_chunk_evictions_total", With({{"kind", "param"}})), 0);
  EXPECT_EQ(e.Get("patrickstar_chunk_prefetches_total", kConstant), 7);
  EXPECT_EQ(e.Get("patrickstar_chunk_prefetch_hits_total", kConstant), 6);

  // Steps.
  EXPECT_EQ(e.Get("patrickstar_steps_total", kConstant), 2);
  EXPECT_EQ(e.Get("patrickstar_tokens_total", kConstant), 2048);
  EXPECT_EQ(e.Get("patrickstar_skipped_steps_total", kConstant), 1);
  EXPECT_EQ(e.Get("patrickstar_step_compute_seconds_total", kConstant), 1.0);
  EXPECT_EQ(e.Get("patrickstar_optimizer_host_seconds_total", kConstant), 0.5);
  EXPECT_EQ(e.Get("patrickstar_optimizer_wait_seconds_total", kConstant), 0.125);
  EXPECT_EQ(e.Get("patrickstar_collective_wait_seconds_total", kConstant), 0.375);
  EXPECT_EQ(e.Get("patrickstar_optimizer_speculated_chunks_total", kConstant), 5);
  EXPECT_EQ(e.Get("patrickstar_optimizer_rolled_back_steps_total", kConstant), 1);
  EXPECT_EQ(e.Get("patrickstar_step_duration_seconds_count", kConstant), 2);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_step_duration_seconds_sum", kConstant).value_or(-1), 2.0);
  int buckets = 0;
  for (const Sample& s : e.samples) {
    if (s.name != "patrickstar_step_duration_seconds_bucket") continue;
    ++buckets;
    const double le = s.labels.at("le") == "+Inf" ? 1e300 : std::stod(s.labels.at("le"));
    EXPECT_EQ(s.value, le < 0.5 ? 0 : le < 1.5 ? 1 : 2) << "le=" << s.labels.at("le");
  }
  EXPECT_GE(buckets, 10);
  EXPECT_EQ(e.Get("patrickstar_step_duration_seconds_bucket", With({{"le", "0.001"}})), 0);
  EXPECT_EQ(e.Get("patrickstar_step_duration_seconds_bucket", With({{"le", "+Inf"}})), 2);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_loss", kConstant).value_or(-1), 3.0);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_learning_rate", kConstant).value_or(-1), 5e-4);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_grad_norm", kConstant).value_or(-1), 1.25);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_loss_scale", kConstant).value_or(-1), 65536.0);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_mfu", kConstant).value_or(-1), 0.45);

  // Collectives: a series per op recorded, none for the others.
  EXPECT_EQ(e.Get("patrickstar_collective_bytes_total", With({{"op", "all_reduce"}})), 2 << 20);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_collective_seconds_total", With({{"op", "all_reduce"}})).value_or(-1), 0.75);
  EXPECT_EQ(e.Get("patrickstar_collective_bytes_total", With({{"op", "barrier"}})), 0);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_collective_seconds_total", With({{"op", "barrier"}})).value_or(-1), 0.125);
  EXPECT_EQ(e.Count("patrickstar_collective_bytes_total"), 2);

#ifdef PSTAR_WITH_CUDA
  const std::string cuda = "true";
#else
  const std::string cuda = "false";
#endif
  EXPECT_EQ(e.Get("patrickstar_build_info", With({{"version", kPstarVersion}, {"cuda", cuda}})), 1);
}

// The progress gauges the operator's status.progress reads, and the
// standard process series.
TEST(WorkerMetrics, ServesProgressAndProcessSeries) {
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);
  metrics->SetTarget(1000, 40, 4);  // resumed at step 40, 4 ranks
  Exposition start = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(start.Get("patrickstar_step", kConstant), 40) << "a resumed run starts where it was";
  EXPECT_EQ(start.Count("patrickstar_last_checkpoint_step"), 0) << "no checkpoint yet";
  EXPECT_EQ(start.Count("patrickstar_val_loss"), 0) << "no validation yet";
  metrics->RecordProgress(41, 1234.5);
  metrics->RecordCheckpoint(40);
  metrics->RecordValidation(40, 3.25);
  Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.Get("patrickstar_step", kConstant), 41);
  EXPECT_EQ(e.Get("patrickstar_target_steps", kConstant), 1000);
  EXPECT_EQ(e.Get("patrickstar_world_size", kConstant), 4);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_tokens_per_second", kConstant).value_or(-1), 1234.5);
  EXPECT_EQ(e.Get("patrickstar_last_checkpoint_step", kConstant), 40);
  EXPECT_DOUBLE_EQ(e.Get("patrickstar_val_loss", kConstant).value_or(-1), 3.25);
  EXPECT_EQ(e.Get("patrickstar_val_step", kConstant), 40);
  EXPECT_EQ(e.type["patrickstar_val_loss"], "gauge");
  EXPECT_EQ(e.type["process_cpu_seconds_total"], "counter");
  EXPECT_GE(e.Get("process_cpu_seconds_total", kConstant).value_or(-1), 0);
  EXPECT_GT(e.Get("process_resident_memory_bytes", kConstant).value_or(0), 1 << 20);
  EXPECT_GT(e.Get("process_virtual_memory_bytes", kConstant).value_or(0), 1 << 20);
  EXPECT_GE(e.Get("process_open_fds", kConstant).value_or(0), 3);
  EXPECT_GE(e.Get("process_threads", kConstant).value_or(0), 1);
  const double now = double(std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  const double started = e.Get("process_start_time_seconds", kConstant).value_or(0);
  EXPECT_LE(started, now + 2);
  EXPECT_GT(started, now - 24 * 3600) << "this test process started within the day";
}

// Before 0.2 the worker set job and namespace itself (scrapes then needed
// honor_labels); metrics.job_labels keeps that for setups not yet moved.
TEST(WorkerMetrics, JobAndNamespaceComeFromTheTargetUnlessAskedFor) {
  for (bool legacy : {false, true}) {
    std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback(/*job_labels=*/legacy);
    ASSERT_NE(metrics, nullptr);
    metrics->RecordStep(0.5, 1024, 3.25, 6e-4, 1.5, 1.0, 0.42);
    const Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
    int ours = 0;
    for (const Sample& s : e.samples) {
      if (s.name.rfind("patrickstar_", 0) != 0) continue;
      ++ours;
      EXPECT_EQ(s.labels.count("job"), legacy ? 1u : 0u) << s.name;
      EXPECT_EQ(s.labels.count("namespace"), legacy ? 1u : 0u) << s.name;
      if (legacy) {
        EXPECT_EQ(s.labels.at("job"), "pretrain-7") << s.name;
        EXPECT_EQ(s.labels.at("namespace"), "default") << s.name;
      }
      EXPECT_EQ(s.labels.count("rank") ? s.labels.at("rank") : "<none>", "3") << s.name;
    }
    EXPECT_GT(ours, 10) << legacy;
  }
}

// The tier label was `device` before 0.2 (it collides with DCGM's GPU
// label); metrics.device_label adds it back beside `tier` for dashboards
// not yet moved.
TEST(WorkerMetrics, TheDeprecatedDeviceLabelRidesBesideTheTier) {
  RuntimeCounters counters;
  Fill(counters);
  for (bool legacy : {false, true}) {
    std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback(/*job_labels=*/false, /*device_label=*/legacy);
    ASSERT_NE(metrics, nullptr);
    metrics->AttachRuntimeCounters(&counters);
    const Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
    Labels want = With({{"tier", "device"}, {"kind", "param"}});
    if (legacy) want["device"] = "device";
    EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", want), 4096) << legacy;
    Labels host = With({{"tier", "host"}});
    if (legacy) host["device"] = "host";
    EXPECT_EQ(e.Get("patrickstar_non_model_bytes", host), 500) << legacy;
  }
}

TEST(WorkerMetrics, ChunkSeriesAreReadAtScrapeTime) {
  RuntimeCounters counters;  // outlives the metrics
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);
  Fill(counters);
  metrics->AttachRuntimeCounters(&counters);
  const Labels device_param = With({{"tier", "device"}, {"kind", "param"}});
  const Labels h2d = With({{"direction", "h2d"}});

  Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", device_param), 4096);
  EXPECT_EQ(e.Get("patrickstar_chunk_moves_total", h2d), 5);

  // No step recorded in between: the new values come straight from the counters.
  counters.resident_bytes[static_cast<int>(Tier::kDevice)][static_cast<int>(StateKind::kParam)] = 12288;
  counters.moves[static_cast<int>(Direction::kHostToDevice)] += 3;
  e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", device_param), 12288);
  EXPECT_EQ(e.Get("patrickstar_chunk_moves_total", h2d), 8);
}

// The step-aligned series appear once a step has been published, with every
// phase x tier x kind (residency) and phase x direction x kind (moves).
TEST(WorkerMetrics, StepSeriesAppearOnceAStepIsPublished) {
  RuntimeCounters counters;  // outlives the metrics
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);
  Fill(counters);
  metrics->AttachRuntimeCounters(&counters);
  Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.Count("patrickstar_chunk_step_resident_bytes"), 0) << "no step has ended";
  EXPECT_EQ(e.Count("patrickstar_chunk_step_peak_bytes"), 0);

  const int fwd = int(StepPhase::kForward), bwd = int(StepPhase::kBackward);
  counters.step_resident_bytes[fwd][int(Tier::kDevice)][int(StateKind::kParam)] = 8192;
  counters.step_moved_bytes[bwd][int(Direction::kDeviceToHost)][int(StateKind::kGrad)] = 2048;
  counters.step_peak_bytes[int(Tier::kDevice)] = 12288;
  counters.steps_recorded = 1;
  e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.type["patrickstar_chunk_step_resident_bytes"], "gauge");
  EXPECT_EQ(e.type["patrickstar_chunk_step_moved_bytes"], "gauge");
  EXPECT_EQ(e.type["patrickstar_chunk_step_peak_bytes"], "gauge");
  EXPECT_EQ(e.Count("patrickstar_chunk_step_resident_bytes"), kNumStepPhases * (kNumTiers - 1) * kNumStateKinds);
  EXPECT_EQ(e.Count("patrickstar_chunk_step_moved_bytes"), kNumStepPhases * kNumDirections * kNumStateKinds);
  EXPECT_EQ(e.Count("patrickstar_chunk_step_peak_bytes"), kNumTiers - 1);
  EXPECT_EQ(e.Get("patrickstar_chunk_step_resident_bytes",
                  With({{"tier", "device"}, {"kind", "param"}, {"phase", "forward"}})),
            8192);
  EXPECT_EQ(e.Get("patrickstar_chunk_step_resident_bytes",
                  With({{"tier", "device"}, {"kind", "param"}, {"phase", "optimizer"}})),
            0);
  EXPECT_EQ(e.Get("patrickstar_chunk_step_moved_bytes",
                  With({{"direction", "d2h"}, {"kind", "grad"}, {"phase", "backward"}})),
            2048);
  EXPECT_EQ(e.Get("patrickstar_chunk_step_peak_bytes", With({{"tier", "device"}})), 12288);
}

TEST(WorkerMetrics, TheDiskTierJoinsTheTierSeriesOnlyWhereThereIsOne) {
  RuntimeCounters counters;  // outlives the metrics
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);
  Fill(counters);
  counters.disk_tier = 1;
  counters.resident_bytes[int(Tier::kDisk)][int(StateKind::kExpAvg)] = 3 << 20;
  counters.resident_chunks[int(Tier::kDisk)][int(StateKind::kExpAvg)] = 3;
  counters.disk_read_bytes = 6 << 20;
  counters.disk_written_bytes = 5 << 20;
  counters.disk_wait_ns = 1'500'000'000;
  counters.step_peak_bytes[int(Tier::kDisk)] = 3 << 20;
  counters.steps_recorded = 1;
  metrics->AttachRuntimeCounters(&counters);
  Exposition e = Parse(HttpGet(metrics->port(), "/metrics").body);
  EXPECT_EQ(e.Count("patrickstar_chunk_resident_bytes"), kNumTiers * kNumStateKinds);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", With({{"tier", "disk"}, {"kind", "exp_avg"}})), 3 << 20);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_chunks", With({{"tier", "disk"}, {"kind", "exp_avg"}})), 3);
  EXPECT_EQ(e.Get("patrickstar_chunk_resident_bytes", With({{"tier", "disk"}, {"kind", "param"}})), 0);
  EXPECT_EQ(e.Count("patrickstar_non_model_bytes"), kNumTiers - 1) << "no activations on disk";
  EXPECT_EQ(e.Count("patrickstar_chunk_step_resident_bytes"), kNumStepPhases * kNumTiers * kNumStateKinds);
  EXPECT_EQ(e.Get("patrickstar_chunk_step_peak_bytes", With({{"tier", "disk"}})), 3 << 20);
  EXPECT_EQ(e.type["patrickstar_chunk_tier_read_bytes_total"], "counter");
  EXPECT_EQ(e.Get("patrickstar_chunk_tier_read_bytes_total", With({{"tier", "disk"}})), 6 << 20);
  EXPECT_EQ(e.Get("patrickstar_chunk_tier_written_bytes_total", With({{"tier", "disk"}})), 5 << 20);
  EXPECT_EQ(e.Get("patrickstar_chunk_tier_wait_seconds_total", With({{"tier", "disk"}})), 1.5);
}

TEST(WorkerMetrics, ExpositionPassesPromtool) {
  ASSERT_TRUE(std::filesystem::exists(kPromtool))
      << kPromtool << " is missing: install Debian's prometheus package "
      << "(scripts/install-deps.sh installs it)";
  RuntimeCounters counters;  // outlives the metrics
  std::unique_ptr<WorkerMetrics> metrics = StartOnLoopback();
  ASSERT_NE(metrics, nullptr);
  Fill(counters);
  counters.steps_recorded = 1;  // the step-aligned series too
  metrics->AttachRuntimeCounters(&counters);
  metrics->RecordStep(0.02, 512, 4.5, 1e-3, 2.0, 1.0, 0.1);
  metrics->RecordSkippedStep();
  CollectiveCounters collectives;
  for (int op = 0; op < kNumCollectiveOps; ++op) {
    collectives.calls[size_t(op)] = 1;
    collectives.bytes[size_t(op)] = 4096;
    collectives.nanoseconds[size_t(op)] = 1000000;
  }
  metrics->AttachCollectiveCounters(&collectives);
  const std::string body = HttpGet(metrics->port(), "/metrics").body;
  ASSERT_FALSE(body.empty());

  test::TempDir dir("metrics");
  const std::string path = dir.path() + "/metrics.txt";
  test::WriteText(path, body);
  test::ProcessResult r = test::RunProcess(
      {"/bin/sh", "-c", std::string("exec ") + kPromtool + " check metrics < \"$0\"", path});
  EXPECT_EQ(r.exit_code, 0) << "promtool check metrics:\n" << r.out << r.err << "\nexposition:\n" << body;
  EXPECT_EQ(r.out + r.err, "") << "promtool warnings";
}

TEST(WorkerMetrics, BusyPortFailsNamingAddressAndPort) {
  std::unique_ptr<WorkerMetrics> first = StartOnLoopback();
  ASSERT_NE(first, nullptr);
  MetricsOptions options;
  options.bind_address = "127.0.0.1";
  options.port = first->port();
  Result<std::unique_ptr<WorkerMetrics>> second = WorkerMetrics::Start(options);
  ASSERT_FALSE(second.ok());
  const std::string& message = second.status().message();
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(first->port())), std::string::npos) << message;
  EXPECT_NE(message.find("in use"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(WorkerMetrics, RejectsPortOutOfRange) {
  MetricsOptions options;
  options.bind_address = "127.0.0.1";
  options.port = 70000;
  Result<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start(options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("70000"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace pstar
