#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "worker/optim/adam.h"

namespace pstar {
namespace {

std::unique_ptr<ParamStore> MakeStore() {
  std::vector<TensorSpec> specs = {{"w", {3}, TensorRole::kWeight, 0.02f}, {"b", {2}, TensorRole::kBias, 0}};
  auto owned = std::make_unique<ParamStore>(*ParamLayout::Build(specs, 8));
  ParamStore& store = *owned;
  for (TensorId id = 0; id < 2; ++id) {
    for (int i = 0; i < store.layout().spec(id).numel(); ++i) {
      store.TensorData(StateKind::kParam, id)[i] = 1.0f;
      store.TensorData(StateKind::kGrad, id)[i] = 0.0f;
      store.TensorData(StateKind::kExpAvg, id)[i] = 0.0f;
      store.TensorData(StateKind::kExpAvgSq, id)[i] = 0.0f;
    }
  }
  return owned;
}

TEST(Adam, WeightDecayOnlyOnWeightsDecoupledOrL2) {
  {
    auto owned = MakeStore();
    ParamStore& store = *owned;
    AdamOptimizer adamw({true, 0.9f, 0.999f, 1e-8f, 0.5f});
    adamw.Step(store, 0.1f, 1.0f);  // zero gradients: only decay moves anything
    EXPECT_FLOAT_EQ(store.TensorData(StateKind::kParam, 0)[0], 1.0f - 0.1f * 0.5f);
    EXPECT_FLOAT_EQ(store.TensorData(StateKind::kParam, 1)[0], 1.0f);
  }
  {
    auto owned = MakeStore();
    ParamStore& store = *owned;
    AdamOptimizer adam({false, 0.9f, 0.999f, 1e-8f, 0.5f});
    adam.Step(store, 0.1f, 1.0f);  // L2: g = 0.5 -> Adam's first step moves by lr
    EXPECT_NEAR(store.TensorData(StateKind::kParam, 0)[0], 0.9f, 1e-6);
    EXPECT_FLOAT_EQ(store.TensorData(StateKind::kParam, 1)[0], 1.0f);
  }
}

TEST(Adam, StepSumsAndClipCoefficient) {
  auto owned = MakeStore();
  ParamStore& store = *owned;
  store.TensorData(StateKind::kGrad, 0)[0] = 3.0f;
  store.TensorData(StateKind::kGrad, 1)[1] = 4.0f;
  auto ops = MakeCpuModelKernels();
  const float losses[3] = {1.5f, 2.0f, 0.25f};
  ops->AddToLossSum(losses, 3);
  const StepSums sums = TakeStepSums(store, *ops);
  EXPECT_DOUBLE_EQ(sums.grad_squares, 25.0);
  EXPECT_DOUBLE_EQ(sums.loss_sum, 3.75);
  EXPECT_DOUBLE_EQ(TakeStepSums(store, *ops).loss_sum, 0.0) << "the loss was taken";
  EXPECT_FLOAT_EQ(ClipCoefficient(5.0, 1.0f), float(1.0 / (5.0 + 1e-6)));
  EXPECT_FLOAT_EQ(ClipCoefficient(5.0, 10.0f), 1.0f);
  EXPECT_FLOAT_EQ(ClipCoefficient(5.0, 0.0f), 1.0f);
}

}  // namespace
}  // namespace pstar
