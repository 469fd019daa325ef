#include "kernels/cuda/tuning.h"

#include <algorithm>
#include <cstdlib>

namespace pstar::kernels::cuda {

const std::vector<TuningKnob>& TuningKnobs() {
  static const std::vector<TuningKnob> knobs = {
      {"cross_entropy_threads", {256, 512, 1024}, &KernelTuning::cross_entropy_threads},
      {"cross_entropy_kernel", {0, 1}, &KernelTuning::cross_entropy_kernel},
      {"bias_grad_group_rows", {32, 64, 128, 256}, &KernelTuning::bias_grad_group_rows},
      {"attention_forward", {0, 1, 2, 3, 4}, &KernelTuning::attention_forward},
      {"attention_backward", {0, 1, 2, 3, 4, 5, 6}, &KernelTuning::attention_backward},
      {"layernorm_backward_kernel", {0, 1}, &KernelTuning::layernorm_backward_kernel},
      {"gelu_backward_epilogue", {0, 1}, &KernelTuning::gelu_backward_epilogue},
      {"bias_grad_epilogue", {0, 1}, &KernelTuning::bias_grad_epilogue},
      {"weight_grad_gemm_algo", {0, 1, 2, 3}, &KernelTuning::weight_grad_gemm_algo},
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

KernelTuning TuningFor(const std::string& gpu_name, int compute_capability) {
  KernelTuning t;
  const std::string arch = compute_capability > 0 ? "sm_" + std::to_string(compute_capability) : "";
  // The architecture's rows first, so the kind's own rows override them.
  for (const std::string& key : {arch, gpu_name}) {
    if (key.empty()) continue;
    for (const TuningRow& row : TuningTable()) {
      if (key != row.gpu) continue;
      const TuningKnob* knob = FindKnob(row.knob);
      if (knob == nullptr) continue;
      if (std::find(knob->candidates.begin(), knob->candidates.end(), row.value) == knob->candidates.end()) continue;
      t.*(knob->field) = row.value;
    }
  }
  return t;
}

std::string ApplyTuningOverrides(const std::string& spec, KernelTuning* tuning) {
  KernelTuning t = *tuning;
  std::vector<std::string> pairs(1);
  for (char c : spec) {
    if (c == ',') {
      pairs.emplace_back();
    } else {
      pairs.back() += c;
    }
  }
  for (const std::string& pair : pairs) {
    if (pair.empty()) continue;  // "a=1,,b=2" or a trailing comma
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) return "\"" + pair + "\" is not knob=value";
    const std::string name = pair.substr(0, eq), text = pair.substr(eq + 1);
    const TuningKnob* knob = FindKnob(name);
    if (knob == nullptr) return "no kernel tuning knob \"" + name + "\"";
    char* parsed_to = nullptr;
    const long value = std::strtol(text.c_str(), &parsed_to, 10);
    const bool is_number = !text.empty() && parsed_to == text.c_str() + text.size();
    if (!is_number || std::find(knob->candidates.begin(), knob->candidates.end(), value) == knob->candidates.end()) {
      std::string candidates;
      for (int c : knob->candidates) candidates += (candidates.empty() ? "" : ", ") + std::to_string(c);
      return name + "=" + text + ": not one of its candidates (" + candidates + ")";
    }
    t.*(knob->field) = int(value);
  }
  *tuning = t;
  return "";
}

std::string CheckTuningTable() { return CheckTuningRows(TuningTable()); }

std::string CheckTuningRows(const std::vector<TuningRow>& rows) {
  for (const TuningRow& row : rows) {
    const std::string where = std::string("tuning table row {\"") + row.gpu + "\", \"" + row.knob + "\", " +
                              std::to_string(row.value) + "}: ";
    const std::string gpu = row.gpu;
    if (gpu.empty()) return where + "no GPU kind";
    if (gpu.rfind("sm_", 0) == 0 &&
        (gpu.size() < 5 || gpu.find_first_not_of("0123456789", 3) != std::string::npos || gpu[3] == '0')) {
      return where + "an architecture is sm_ and its compute capability's digits, as sm_90";
    }
    const TuningKnob* knob = FindKnob(row.knob);
    if (knob == nullptr) return where + "no knob of that name";
    if (std::find(knob->candidates.begin(), knob->candidates.end(), row.value) == knob->candidates.end()) {
      return where + "not one of the knob's candidates";
    }
  }
  return "";
}

}  // namespace pstar::kernels::cuda
