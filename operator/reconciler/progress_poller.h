// ProgressPoller: training progress for status.progress, read from each
// running job's rank-0 metrics endpoint (the worker's patrickstar_step,
// patrickstar_target_steps, patrickstar_loss, patrickstar_tokens_per_second
// and patrickstar_last_checkpoint_step) on the poller's own thread, at most
// once per interval per job. Every read is bounded (connect, request and
// response within a timeout, at most max_bytes): a stalled, silent or
// garbage endpoint costs one bounded request and changes nothing; the last
// good reading stays.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "operator/kube/kube_time.h"
#include "worker/core/status.h"

namespace pstar::op {

struct JobProgress {
  int64_t step = 0;
  int64_t target_steps = 0;            // 0: unknown
  int64_t last_checkpoint_step = -1;   // -1: none saved yet
  std::optional<double> loss, tokens_per_second;
  double steps_per_second = 0;         // from this reading and the one before (0: unknown)
  WallTime at{};                       // when it was read
};

// The series progress needs, from Prometheus' text exposition; nullopt when
// the text has no finite patrickstar_step sample (not a pstar endpoint, or
// garbage). Other lines are ignored, malformed ones included.
std::optional<JobProgress> ParseProgress(std::string_view text);

// status.progress: step, targetSteps, loss, tokensPerSecond,
// lastCheckpointStep, estimatedCompletionTime (from the step rate), updateTime.
nlohmann::json ProgressStatus(const JobProgress& progress);

// One GET of http://host:port/path: connect, request and the whole response
// within `timeout`, the response at most `max_bytes`; the body of a 200.
Result<std::string> BoundedHttpGet(const std::string& host, int port, const std::string& path,
                                   std::chrono::milliseconds timeout, size_t max_bytes);

class ProgressPoller {
 public:
  struct Options {
    std::chrono::milliseconds interval{30000};  // per job
    std::chrono::milliseconds timeout{2000};    // per read
    size_t max_bytes = size_t(4) << 20;
  };
  // `on_change` gets a job's key when its progress moved (a new step).
  ProgressPoller(Options options, std::function<void(const std::string& key)> on_change);
  ~ProgressPoller();
  ProgressPoller(const ProgressPoller&) = delete;
  ProgressPoller& operator=(const ProgressPoller&) = delete;

  // Reads http://host:port/metrics for job `key` from now on (a new address
  // replaces the old); Untrack stops reading but keeps the last progress;
  // Forget drops both.
  void Track(const std::string& key, const std::string& host, int port);
  void Untrack(const std::string& key);
  void Forget(const std::string& key);
  std::optional<JobProgress> Latest(const std::string& key) const;

 private:
  struct Target {
    std::string host;
    int port = 0;
    bool active = false;
    std::chrono::steady_clock::time_point due{};
    std::optional<JobProgress> latest;
  };
  void Run();

  const Options options_;
  std::function<void(const std::string&)> on_change_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, Target> targets_;
  std::thread thread_;
};

}  // namespace pstar::op
