// Progress lines while training and the closing summary line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "worker/train/trainer.h"

namespace pstar {

// Formats seconds as "1h02m03s", "2m03s" or "4.5s".
std::string FormatDuration(double seconds);

// How progress lines are written: for people, or one JSON object per line
// for tools (`pstar train --log-format json`).
enum class LogFormat { kText, kJson };

class ProgressReporter {
 public:
  ProgressReporter(std::FILE* out, int64_t total_steps, int64_t log_every, LogFormat format = LogFormat::kText)
      : out_(out), total_(total_steps), every_(log_every), format_(format) {}

  // Records a finished step that took `seconds`; prints every log_every steps,
  // on the first and on the last. `h2d_bytes` and `d2h_bytes` are the chunk
  // bytes moved so far (JSON lines carry them).
  void OnStep(const StepStats& s, double seconds, int64_t h2d_bytes = 0, int64_t d2h_bytes = 0);
  // Text sampled after `step` (1-based): one line, the text's newlines and
  // other control characters escaped (text format) or a JSON string.
  void OnSample(int64_t step, const std::string& text);
  // A validation loss measured after `step` (1-based) in `seconds`: one line.
  void OnValidation(int64_t step, double loss, double seconds);
  // "summary: steps=... tokens=... seconds=... tokens_per_s=... final_loss=... min_loss=..."
  // and " skipped_steps=N" when fp16 steps overflowed, " val_loss=X" after a validation.
  // tokens_per_s leaves out the first step (start-up effects).
  void PrintSummary() const;

  double tokens_per_second_steady() const;

 private:
  std::FILE* out_;
  int64_t total_, every_;
  LogFormat format_;
  int64_t window_steps_ = 0;
  int64_t steps_ = 0, tokens_ = 0, steady_tokens_ = 0;
  double seconds_ = 0, steady_seconds_ = 0;
  int64_t window_tokens_ = 0;
  double window_seconds_ = 0;
  float last_loss_ = 0, min_loss_ = 0;
  int64_t skipped_ = 0;  // fp16 steps whose gradients overflowed
  bool validated_ = false;
  double val_loss_ = 0;
};

}  // namespace pstar
