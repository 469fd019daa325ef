// pstar train: runs a training job from a config file or the built-in default.
#include <omp.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "worker/cli/commands.h"
#include "worker/config/config.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

namespace pstar::cli {

namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void OnStopSignal(int) { g_stop_requested.store(true); }

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

}  // namespace

int TrainCommand(const std::vector<std::string>& args) {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "--config" || a == "--set") && i + 1 >= args.size()) {
      return UsageError(a + " needs a value");
    }
    if (a == "--config") config_path = args[++i];
    else if (a == "--set") overrides.push_back(args[++i]);
    else if (a == "--print-config") print_config = true;
    else return UsageError("train: unknown option '" + a + "'");
  }

  Result<Config> config = config_path.empty()
                              ? ParseConfig(DefaultConfigYaml(), "default config", overrides)
                              : LoadConfigFile(config_path, overrides);
  if (!config.ok()) return ReportError(config.status());
  if (print_config) {
    std::fputs(ConfigToYaml(*config).c_str(), stdout);
    return kExitOk;
  }
  const Config& c = *config;
  if (c.train.threads > 0) omp_set_num_threads(int(c.train.threads));

  auto data = OpenDataSource(c);
  if (!data.ok()) return ReportError(data.status());
  auto trainer = Trainer::Create(c, **data);
  if (!trainer.ok()) return ReportError(trainer.status());
  Trainer& t = **trainer;

  const GptConfig& g = c.model.gpt;
  std::printf("pstar train: %s\n", config_path.empty() ? "built-in default job" : config_path.c_str());
  std::printf("model: %lld layers, %lld heads, %lld wide, vocab %lld | %.2fM parameters in %d chunks of %lld elements\n",
              (long long)g.n_layer, (long long)g.n_head, (long long)g.n_embd, (long long)g.vocab_size,
              double(g.NumParameters()) / 1e6, t.store().layout().num_chunks(),
              (long long)t.store().layout().chunk_elems());
  std::printf("memory: model data %s, activations %s%s | %d threads\n",
              HumanBytes(double(t.store().model_bytes())).c_str(),
              HumanBytes(double(t.activations().capacity_bytes())).c_str(),
              c.train.activation_checkpointing ? " (checkpointed)" : "", omp_get_max_threads());
  std::printf("data: %lld tokens | batch %lld x %lld x %lld accum = %lld tokens per step\n",
              (long long)(*data)->size(), (long long)c.train.batch_size, (long long)c.train.seq_len,
              (long long)c.train.grad_accum_steps,
              (long long)(c.train.batch_size * c.train.seq_len * c.train.grad_accum_steps));
  std::fflush(stdout);

  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  ProgressReporter progress(stdout, c.train.steps, c.train.log_every);
  for (int64_t s = 0; s < c.train.steps; ++s) {
    auto start = std::chrono::steady_clock::now();
    auto stats = t.Step();
    if (!stats.ok()) return ReportError(stats.status());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.OnStep(*stats, seconds);
    if (g_stop_requested.load()) {
      std::fprintf(stderr, "pstar: stopping after step %lld on request\n", (long long)(s + 1));
      progress.PrintSummary();
      return kExitInterrupted;
    }
  }
  progress.PrintSummary();
  return kExitOk;
}

}  // namespace pstar::cli
