#include "kernels/cuda/tuning.h"

#include <algorithm>

namespace pstar::kernels::cuda {

const std::vector<TuningKnob>& TuningKnobs() {
  static const std::vector<TuningKnob> knobs = {
      {"cross_entropy_threads", {256, 512, 1024}, &KernelTuning::cross_entropy_threads},
      {"bias_grad_group_rows", {32, 64, 128, 256}, &KernelTuning::bias_grad_group_rows},
      {"attention_forward", {0, 1}, &KernelTuning::attention_forward},
      {"attention_backward", {0, 1, 2, 3}, &KernelTuning::attention_backward},
      {"gelu_backward_epilogue", {0, 1}, &KernelTuning::gelu_backward_epilogue},
      {"bias_grad_epilogue", {0, 1}, &KernelTuning::bias_grad_epilogue},
  };
  return knobs;
}

const std::vector<TuningRow>& TuningTable() {
  static const std::vector<TuningRow> rows = {
#include "kernels/cuda/tuning_table.inc"
  };
  return rows;
}

namespace {

const TuningKnob* FindKnob(const std::string& name) {
  for (const TuningKnob& k : TuningKnobs()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

}  // namespace

KernelTuning TuningFor(const std::string& gpu_name) {
  KernelTuning t;
  for (const TuningRow& row : TuningTable()) {
    if (gpu_name != row.gpu) continue;
    const TuningKnob* knob = FindKnob(row.knob);
    if (knob == nullptr) continue;
    if (std::find(knob->candidates.begin(), knob->candidates.end(), row.value) == knob->candidates.end()) continue;
    t.*(knob->field) = row.value;
  }
  return t;
}

std::string CheckTuningTable() {
  for (const TuningRow& row : TuningTable()) {
    const std::string where = std::string("tuning table row {\"") + row.gpu + "\", \"" + row.knob + "\", " +
                              std::to_string(row.value) + "}: ";
    const TuningKnob* knob = FindKnob(row.knob);
    if (knob == nullptr) return where + "no knob of that name";
    if (std::find(knob->candidates.begin(), knob->candidates.end(), row.value) == knob->candidates.end()) {
      return where + "not one of the knob's candidates";
    }
  }
  return "";
}

}  // namespace pstar::kernels::cuda
