// What the model-against-PyTorch tests share: weights far from the default
// init, the case's weights and batches as safetensors for the reference, the
// relative error, and the comparison of one forward/backward and of an AdamW
// trajectory with the reference's float64 and float32 results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "worker/ckpt/safetensors.h"
#include "worker/core/counter_rng.h"
#include "worker/data/batch_loader.h"
#include "worker/model/param_store.h"
#include "worker/train/trainer.h"

namespace pstar::test {

// Weights far from the default init (normal(0, std), norm weights about 1),
// so biases and norm weights matter too; the vocabulary padding stays zero.
inline void RandomizeWeights(ParamStore& store, uint64_t seed, float std = 0.3f) {
  const ParamLayout& layout = store.layout();
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    const TensorSpec& s = layout.spec(id);
    float* p = store.TensorData(StateKind::kParam, id);
    FillNormal(p, s.visible_numel(), std, seed, StableKey(s.tensor()), uint64_t(s.tensor_offset()));
    std::fill(p + s.visible_numel(), p + s.numel(), 0.0f);
    if (s.role == TensorRole::kNormWeight) {
      for (int64_t i = 0; i < s.numel(); ++i) p[i] += 1.0f;
    }
  }
}

// Every tensor of `kind` as checkpoints see it, in layout order: row parts
// put together, the vocabulary padding left out.
struct WholeTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
inline std::vector<WholeTensor> WholeTensors(ParamStore& store, StateKind kind) {
  const ParamLayout& layout = store.layout();
  std::vector<WholeTensor> out;
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    const TensorSpec& s = layout.spec(id);
    const float* p = store.TensorData(kind, id);
    if (out.empty() || out.back().name != s.tensor()) {
      out.push_back({s.tensor(), s.visible_shape(), {}});
    } else {
      out.back().shape[0] += s.visible_shape()[0];
    }
    out.back().values.insert(out.back().values.end(), p, p + s.visible_numel());
  }
  return out;
}

// ||a - b|| / ||b||
inline double RelativeError(const float* a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Writes dir/weights.safetensors (every tensor, visible shapes) and
// dir/batches.safetensors (`steps` batches of `source`); returns the
// batches' tokens and targets, steps * batch * seq each.
inline void WriteTorchCase(ParamStore& store, const TokenSource& source, int64_t steps, int64_t batch, int64_t seq,
                           const std::string& dir, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  const std::vector<WholeTensor> whole = WholeTensors(store, StateKind::kParam);
  SafetensorsWriter weights;
  for (const WholeTensor& t : whole) weights.Add(t.name, Dtype::kF32, t.shape, t.values.data());
  ASSERT_TRUE(weights.Write(dir + "/weights.safetensors").ok());
  auto loader = BatchLoader::Create(source, batch, seq);
  ASSERT_TRUE(loader.ok());
  const size_t n = size_t(batch * seq);
  tokens->assign(size_t(steps) * n, 0);
  targets->assign(size_t(steps) * n, 0);
  for (int64_t s = 0; s < steps; ++s) loader->Next(&(*tokens)[size_t(s) * n], &(*targets)[size_t(s) * n]);
  SafetensorsWriter batches;
  batches.Add("tokens", Dtype::kI32, {steps, batch, seq}, tokens->data());
  batches.Add("targets", Dtype::kI32, {steps, batch, seq}, targets->data());
  ASSERT_TRUE(batches.Write(dir + "/batches.safetensors").ok());
}

// The losses of `steps` training steps of `config` from `from`'s weights (a
// fresh trainer, so the optimizer starts as the reference's does).
inline std::vector<float> TrainFromWeights(const Config& config, const TokenSource& source, ParamStore& from,
                                           int64_t steps) {
  std::vector<float> losses;
  auto fresh = Trainer::Create(config, source);
  EXPECT_TRUE(fresh.ok()) << fresh.status().message();
  if (!fresh.ok()) return losses;
  const ParamLayout& layout = from.layout();
  for (TensorId id = 0; id < layout.num_tensors(); ++id) {
    std::copy_n(from.TensorData(StateKind::kParam, id), layout.spec(id).numel(),
                (*fresh)->store().TensorData(StateKind::kParam, id));
  }
  for (int64_t s = 0; s < steps; ++s) {
    auto st = (*fresh)->Step();
    EXPECT_TRUE(st.ok()) << st.status().message();
    if (!st.ok()) break;
    losses.push_back(st->loss);
  }
  return losses;
}

// The reference's float64 and float32 results of one case directory.
struct TorchReference {
  SafetensorsFile f64, f32;
  // Tolerance per tensor: 1e-5 relative, or more for an ill-conditioned
  // tensor (cancellation in a sum, a near-constant norm row), measured by how
  // far PyTorch's own float32 result lies from its float64 one.
  double Tolerance(const std::string& tensor, double floor = 1e-5) const {
    const std::vector<double> exact = *f64.ToDoubles(tensor);
    const std::vector<double> single = *f32.ToDoubles(tensor);
    const std::vector<float> rounded(single.begin(), single.end());
    return std::max(floor, 4 * RelativeError(rounded.data(), exact));
  }
};

inline std::optional<TorchReference> ReadTorchReference(const std::string& dir) {
  auto f64 = SafetensorsFile::Read(dir + "/ref_float64.safetensors");
  auto f32 = SafetensorsFile::Read(dir + "/ref_float32.safetensors");
  EXPECT_TRUE(f64.ok()) << f64.status().message();
  EXPECT_TRUE(f32.ok()) << f32.status().message();
  if (!f64.ok() || !f32.ok()) return std::nullopt;
  return TorchReference{std::move(*f64), std::move(*f32)};
}

// Logits, loss and every gradient of `store` against the reference; returns
// the worst relative error against float64. `floor(name)`: the least
// tolerance of a gradient (1e-5 unless it says more).
inline double ExpectMatchesTorch(const TorchReference& ref, ParamStore& store, const std::vector<float>& logits,
                                 float loss, const std::function<double(const std::string&)>& floor = nullptr) {
  const std::vector<WholeTensor> grads = WholeTensors(store, StateKind::kGrad);
  double worst64 = 0;
  for (const SafetensorsFile* r : {&ref.f64, &ref.f32}) {
    SCOPED_TRACE(r == &ref.f64 ? "float64" : "float32");
    double worst = RelativeError(logits.data(), *r->ToDoubles("logits"));
    EXPECT_LE(worst, ref.Tolerance("logits")) << "logits";
    const double ref_loss = (*r->ToDoubles("loss"))[0];
    EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-5) << "loss " << loss << " vs " << ref_loss;
    for (const WholeTensor& g : grads) {
      const std::string& name = g.name;
      const double err = RelativeError(g.values.data(), *r->ToDoubles("grad." + name));
      EXPECT_LE(err, ref.Tolerance("grad." + name, floor ? floor(name) : 1e-5)) << "gradient of " << name;
      worst = std::max(worst, err);
    }
    if (r == &ref.f64) worst64 = worst;
  }
  return worst64;
}

// Each step's loss against the reference's AdamW trajectory (1e-4
// relative); returns the worst relative error against float64. With
// `as_float32_is`, against float64 alone, each step within 1e-4 or 4 times
// PyTorch's own float32 distance from float64 at that step, whichever is
// more: ten steps of Adam from weights far from the init can amplify fp32
// rounding (the float32 reference then strays from float64 as far as pstar).
inline double ExpectTrajectoryMatchesTorch(const TorchReference& ref, const std::vector<float>& losses,
                                           bool as_float32_is = false) {
  double worst64 = 0;
  const std::vector<double> exact = *ref.f64.ToDoubles("losses");
  const std::vector<double> single = *ref.f32.ToDoubles("losses");
  for (const SafetensorsFile* r : {&ref.f64, &ref.f32}) {
    if (as_float32_is && r == &ref.f32) continue;
    SCOPED_TRACE(r == &ref.f64 ? "float64" : "float32");
    const std::vector<double> ref_losses = *r->ToDoubles("losses");
    EXPECT_EQ(ref_losses.size(), losses.size());
    double worst = 0;
    for (size_t s = 0; s < losses.size() && s < ref_losses.size(); ++s) {
      const double rel = std::abs(losses[s] - ref_losses[s]) / std::abs(ref_losses[s]);
      const double torch32 = std::abs(single[s] - exact[s]) / std::abs(exact[s]);
      const double tolerance = as_float32_is ? std::max(1e-4, 4 * torch32) : 1e-4;
      EXPECT_LE(rel, tolerance) << "loss at step " << s + 1 << ": " << losses[s] << " vs " << ref_losses[s]
                                << " (PyTorch float32 " << single[s] << ")";
      worst = std::max(worst, rel);
    }
    if (r == &ref.f64) worst64 = worst;
  }
  return worst64;
}

}  // namespace pstar::test
