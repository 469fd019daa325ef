#include "worker/train/progress.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pstar {

namespace {

// A float as the double with its shortest decimal form (1.5e-4, not
// 0.000150000007), so JSON shows the value the float holds, briefly.
double ShortDouble(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string FormatDuration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm%02ds", int(s) / 3600, int(s) / 60 % 60, int(s) % 60);
  }
  return buf;
}

void ProgressReporter::OnStep(const StepStats& s, double seconds, int64_t h2d_bytes, int64_t d2h_bytes) {
  ++steps_;
  tokens_ += s.tokens;
  seconds_ += seconds;
  if (steps_ > 1) {
    steady_tokens_ += s.tokens;
    steady_seconds_ += seconds;
  }
  window_tokens_ += s.tokens;
  window_seconds_ += seconds;
  ++window_steps_;
  last_loss_ = s.loss;
  if (s.skipped) ++skipped_;
  min_loss_ = steps_ == 1 ? s.loss : std::min(min_loss_, s.loss);
  const int64_t step = s.step + 1;
  if (step == 1 || step % every_ == 0 || step == total_) {
    double per_step = steps_ > 1 ? steady_seconds_ / double(steps_ - 1) : seconds_;
    double eta = per_step * double(total_ - step);
    const double tokens_per_s = double(window_tokens_) / std::max(window_seconds_, 1e-9);
    const double ms_per_step = 1000.0 * window_seconds_ / double(std::max<int64_t>(window_steps_, 1));
    const bool profiled = s.kernel_seconds >= 0.0;
    if (format_ == LogFormat::kJson) {
      // Non-finite numbers (an overflowed fp16 norm) become null.
      nlohmann::json line = {{"step", step},           {"steps", total_},
                             {"loss", ShortDouble(s.loss)}, {"lr", ShortDouble(s.lr)},
                             {"grad_norm", s.grad_norm}, {"loss_scale", ShortDouble(s.loss_scale)},
                             {"skipped", s.skipped},   {"tokens_per_s", tokens_per_s},
                             {"ms_per_step", ms_per_step}, {"elapsed_s", seconds_},
                             {"eta_s", eta},           {"h2d_bytes", h2d_bytes},
                             {"d2h_bytes", d2h_bytes}, {"compute_s", s.compute_seconds},
                             {"host_adam_s", s.host_adam_seconds}, {"update_wait_s", s.update_wait_seconds},
                             {"speculated_chunks", s.speculated_chunks}, {"rolled_back", s.rolled_back},
                             {"collective_s", s.collective_seconds}, {"collective_wait_s", s.collective_wait_seconds}};
      if (profiled) {
        line["kernel_s"] = s.kernel_seconds;
        line["compute_idle_s"] = s.compute_idle_seconds;
        line["h2d_s"] = s.h2d_seconds;
        line["d2h_s"] = s.d2h_seconds;
        line["compute_busy"] = seconds > 0.0 ? s.kernel_seconds / seconds : 0.0;
      }
      std::fprintf(out_, "%s\n", line.dump().c_str());
    } else {
      // fp16: the loss scale the step ran with, and whether it overflowed.
      char scale[64] = "";
      if (s.loss_scale != 1.0f || s.skipped) {
        std::snprintf(scale, sizeof scale, " | scale %g%s", double(s.loss_scale), s.skipped ? " (overflow, skipped)" : "");
      }
      // This step's waits: its forward and backward on the compute stream,
      // the host's Adam work and the waits for it; with --profile the
      // stream's kernel time (and busy share) and the chunk copies.
      char waits[192];
      std::snprintf(waits, sizeof waits, " | fwd+bwd %.0f ms | adam %.0f ms | waited %.0f ms", 1e3 * s.compute_seconds,
                    1e3 * s.host_adam_seconds, 1e3 * s.update_wait_seconds);
      // With N ranks: the step's collectives, and the part it waited for.
      char comm[96] = "";
      if (s.collective_seconds > 0.0) {
        std::snprintf(comm, sizeof comm, " | comm %.0f ms (waited %.0f)", 1e3 * s.collective_seconds,
                      1e3 * s.collective_wait_seconds);
      }
      char profile[192] = "";
      if (profiled) {
        std::snprintf(profile, sizeof profile, " | kernels %.0f ms (%.0f%% busy) | h2d %.0f ms | d2h %.0f ms",
                      1e3 * s.kernel_seconds, seconds > 0.0 ? 100.0 * s.kernel_seconds / seconds : 0.0,
                      1e3 * s.h2d_seconds, 1e3 * s.d2h_seconds);
      }
      std::fprintf(out_, "step %*lld/%lld | loss %.4f | lr %.2e | norm %.3f%s | %.0f tok/s | %.0f ms/step | elapsed %s | ETA %s%s%s%s\n",
                   int(std::to_string(total_).size()), (long long)step, (long long)total_, s.loss, double(s.lr),
                   s.grad_norm, scale, tokens_per_s, ms_per_step, FormatDuration(seconds_).c_str(),
                   FormatDuration(eta).c_str(), waits, comm, profile);
    }
    std::fflush(out_);
    window_tokens_ = 0;
    window_seconds_ = 0;
    window_steps_ = 0;
  }
}

void ProgressReporter::OnSample(int64_t step, const std::string& text) {
  if (format_ == LogFormat::kJson) {
    // Invalid UTF-8 (a token boundary inside a character) becomes U+FFFD.
    const nlohmann::json line = {{"step", step}, {"sample", text}};
    std::fprintf(out_, "%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::string shown;
    for (unsigned char ch : text) {
      if (ch == '\n') shown += "\\n";
      else if (ch < 0x20 || ch == 0x7F) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", ch);
        shown += buf;
      } else {
        shown.push_back(char(ch));
      }
    }
    std::fprintf(out_, "step %*lld/%lld | sample: %s\n", int(std::to_string(total_).size()), (long long)step,
                 (long long)total_, shown.c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::OnValidation(int64_t step, double loss, double seconds) {
  validated_ = true;
  val_loss_ = loss;
  if (format_ == LogFormat::kJson) {
    const nlohmann::json line = {{"step", step}, {"val_loss", loss}, {"eval_s", seconds}};
    std::fprintf(out_, "%s\n", line.dump().c_str());
  } else {
    std::fprintf(out_, "step %*lld/%lld | val loss %.4f | %.0f ms\n", int(std::to_string(total_).size()),
                 (long long)step, (long long)total_, loss, 1000.0 * seconds);
  }
  std::fflush(out_);
}

double ProgressReporter::tokens_per_second_steady() const {
  if (steps_ <= 1) return double(tokens_) / std::max(seconds_, 1e-9);
  return double(steady_tokens_) / std::max(steady_seconds_, 1e-9);
}

void ProgressReporter::PrintSummary() const {
  std::fprintf(out_,
               "summary: steps=%lld tokens=%lld seconds=%.2f tokens_per_s=%.1f final_loss=%.4f "
               "min_loss=%.4f",
               (long long)steps_, (long long)tokens_, seconds_, tokens_per_second_steady(),
               double(last_loss_), double(min_loss_));
  if (skipped_ > 0) std::fprintf(out_, " skipped_steps=%lld", (long long)skipped_);
  if (validated_) std::fprintf(out_, " val_loss=%.4f", val_loss_);
  std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace pstar
