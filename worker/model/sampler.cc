#include "worker/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace pstar {

int32_t PickToken(const float* logits, int64_t vocab, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.temperature == 0) return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), more_likely);
  ids.resize(size_t(k));
  const double top = logits[ids[0]];
  std::vector<double> weights(ids.size());
  double sum = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    weights[j] = std::exp((double(logits[ids[j]]) - top) / o.temperature);
    sum += weights[j];
  }
  const double u = double(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    acc += weights[j];
    if (u < acc) return ids[j];
  }
  return ids.back();
}

Result<std::unique_ptr<Sampler>> Sampler::Create(const GptConfig& config,
                                                 const std::vector<std::vector<float>>& params) {
  const std::vector<TensorSpec> visible = GptVisibleTensorSpecs(config);
  if (params.size() != visible.size()) {
    return Status::InvalidArgument("sampler: " + std::to_string(params.size()) + " tensors given, the model has " +
                                   std::to_string(visible.size()));
  }
  PSTAR_ASSIGN_OR_RETURN(ParamLayout layout, ParamLayout::Build(GptTensorSpecs(config), 0));
  auto store = std::make_unique<ParamStore>(std::move(layout));
  for (size_t i = 0; i < visible.size(); ++i) {
    if (int64_t(params[i].size()) != visible[i].numel()) {
      return Status::InvalidArgument("sampler: " + visible[i].name + " has " + std::to_string(params[i].size()) +
                                     " values, the model " + std::to_string(visible[i].numel()));
    }
  }
  // Each layout tensor (a row part: its range) from its visible tensor.
  size_t whole = 0;
  for (TensorId id = 0; id < store->layout().num_tensors(); ++id) {
    const TensorSpec& spec = store->layout().spec(id);
    while (visible[whole].name != spec.tensor()) ++whole;
    const float* from = params[whole].data() + spec.tensor_offset();
    float* p = store->TensorData(StateKind::kParam, id);
    std::copy(from, from + spec.visible_numel(), p);
    std::fill(p + spec.visible_numel(), p + spec.numel(), 0.0f);  // vocabulary padding
  }
  return std::unique_ptr<Sampler>(new Sampler(config, std::move(store)));
}

Status Sampler::EnsureLength(int64_t length) {
  if (length <= length_) return Status::Ok();
  int64_t T = 1;
  while (T < length) T *= 2;
  T = std::min(T, config_.max_seq_len);
  model_.reset();
  arena_ = std::make_unique<Arena>("sample", size_t(Gpt::ActivationBytes(config_, 1, T, /*recompute=*/false)));
  PSTAR_ASSIGN_OR_RETURN(Gpt model, Gpt::Create(config_, *store_, *arena_, 1, T, /*recompute=*/false));
  model_ = std::make_unique<Gpt>(std::move(model));
  length_ = T;
  return Status::Ok();
}

Result<std::vector<float>> Sampler::NextLogits(const std::vector<int32_t>& context) {
  const int64_t n = int64_t(context.size());
  if (n < 1 || n > config_.max_seq_len) {
    return Status::InvalidArgument("sampler: a context of " + std::to_string(n) + " tokens (1.." +
                                   std::to_string(config_.max_seq_len) + " fit)");
  }
  for (int32_t t : context) {
    if (t < 0 || t >= config_.vocab_size) {
      return Status::InvalidArgument("sampler: token " + std::to_string(t) + " is not below vocab_size " +
                                     std::to_string(config_.vocab_size));
    }
  }
  PSTAR_RETURN_IF_ERROR(EnsureLength(n));
  // Positions past the context hold token 0; causal attention keeps them out
  // of the logits at n - 1.
  std::vector<int32_t> tokens(size_t(length_), 0), targets(size_t(length_), 0);
  std::copy(context.begin(), context.end(), tokens.begin());
  std::vector<float> logits(size_t(length_ * config_.vocab_size));
  model_->Forward({tokens.data(), targets.data()}, logits.data());
  (void)model_->TakeLoss();
  const auto row = logits.begin() + std::ptrdiff_t((n - 1) * config_.vocab_size);
  return std::vector<float>(row, row + std::ptrdiff_t(config_.vocab_size));
}

Result<std::vector<int32_t>> Sampler::Generate(const std::vector<int32_t>& prompt, const SampleOptions& o) {
  if (prompt.empty()) return Status::InvalidArgument("sampler: the prompt has no tokens");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return Status::InvalidArgument("sampler: the temperature must be a number >= 0");
  }
  if (o.top_k < 0 || o.tokens < 0) return Status::InvalidArgument("sampler: top-k and tokens must be >= 0");
  const int64_t vocab = o.vocab_limit > 0 ? std::min(o.vocab_limit, config_.vocab_size) : config_.vocab_size;
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> context = prompt, out;
  for (int64_t i = 0; i < o.tokens; ++i) {
    if (int64_t(context.size()) > config_.max_seq_len) {
      context.erase(context.begin(), context.end() - std::ptrdiff_t(config_.max_seq_len));
    }
    PSTAR_ASSIGN_OR_RETURN(std::vector<float> logits, NextLogits(context));
    const int32_t next = PickToken(logits.data(), vocab, o, rng);
    if (next == o.stop_token) break;
    out.push_back(next);
    context.push_back(next);
  }
  return out;
}

}  // namespace pstar
