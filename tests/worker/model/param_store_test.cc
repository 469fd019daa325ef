#include <gtest/gtest.h>

#include "worker/model/param_store.h"

namespace pstar {
namespace {

ParamStore MakeStore() {
  std::vector<TensorSpec> specs = {{"a", {4}, TensorRole::kWeight, 0.02f}, {"b", {6}, TensorRole::kBias, 0}};
  return ParamStore(*ParamLayout::Build(specs, 8));
}

TEST(ParamStore, UseMarksComputeAndRecordsMoments) {
  ParamStore store = MakeStore();
  store.TensorData(StateKind::kParam, 0)[2] = 7.0f;
  store.SetRecording(true);
  EXPECT_EQ(store.state(0), TensorState::kHold);
  {
    auto u = store.Acquire({0}, Pass::kForward);
    EXPECT_TRUE(store.InCompute(0));
    EXPECT_EQ(store.state(0), TensorState::kCompute);
    EXPECT_FALSE(store.InCompute(1));
    EXPECT_EQ(u.param(0)[2], 7.0f);
    EXPECT_TRUE(store.chunks().OnDevice({StateKind::kParam, 0}));
  }
  EXPECT_FALSE(store.InCompute(0));
  EXPECT_EQ(store.state(0), TensorState::kHoldAfterForward);
  { auto u = store.Acquire({1, 0}, Pass::kBackward); }
  EXPECT_EQ(store.state(1), TensorState::kHoldAfterBackward);
  ASSERT_EQ(store.trace().size(), 3u);
  EXPECT_EQ(store.trace()[0].moment, 0);
  EXPECT_EQ(store.trace()[1].moment, 1);
  EXPECT_EQ(store.trace()[1].tensor, 1);
  EXPECT_EQ(store.trace()[2].pass, Pass::kBackward);
  EXPECT_EQ(store.moments(), 2);
}

// A use of gradients alone writes them without making the params resident,
// records its moment as such, and refuses a param.
TEST(ParamStore, AGradientsOnlyUseLeavesTheParamChunkWhereItIs) {
  ParamStore store = MakeStore();
  store.ZeroGrads();
  store.TensorData(StateKind::kParam, 1);  // its device copy dropped
  EXPECT_FALSE(store.chunks().OnDevice({StateKind::kParam, 1}));
  store.SetRecording(true);
  {
    auto u = store.AcquireGrads({1});
    EXPECT_TRUE(store.InCompute(1));
    u.grad(1)[2] = 4.5f;
    EXPECT_TRUE(store.chunks().OnDevice({StateKind::kGrad, 1}));
    EXPECT_FALSE(store.chunks().OnDevice({StateKind::kParam, 1})) << "the param chunk was made resident";
    EXPECT_DEATH(u.param(1), "param requested in a use of gradients alone");
  }
  EXPECT_EQ(store.state(1), TensorState::kHoldAfterBackward);
  EXPECT_EQ(store.TensorData(StateKind::kGrad, 1)[2], 4.5f);
  ASSERT_EQ(store.trace().size(), 1u);
  EXPECT_EQ(store.trace()[0].pass, Pass::kBackward);
  EXPECT_FALSE(store.trace()[0].params);
  // The planner counts its gradient chunk alone.
  EXPECT_EQ(MostChunksPerMoment(store.layout(), {{{1}, Pass::kBackward, false}}).total, 1);
  EXPECT_EQ(MostChunksPerMoment(store.layout(), {{{1}, Pass::kBackward}}).total, 2);
}

// A backward use of values alone reads the params without making the
// gradient resident (the classifier's input gradient), records its moment
// as such, and refuses a gradient.
TEST(ParamStore, AValuesOnlyBackwardUseLeavesTheGradientChunkWhereItIs) {
  ParamStore store = MakeStore();
  store.ZeroGrads();
  store.TensorData(StateKind::kParam, 1)[3] = 2.5f;
  store.TensorData(StateKind::kGrad, 1);  // its device copy dropped
  EXPECT_FALSE(store.chunks().OnDevice({StateKind::kGrad, 1}));
  store.SetRecording(true);
  {
    auto u = store.AcquireParams({1});
    EXPECT_TRUE(store.InCompute(1));
    EXPECT_EQ(u.param(1)[3], 2.5f);
    EXPECT_TRUE(store.chunks().OnDevice({StateKind::kParam, 1}));
    EXPECT_FALSE(store.chunks().OnDevice({StateKind::kGrad, 1})) << "the gradient chunk was made resident";
    EXPECT_DEATH(u.grad(1), "gradient requested in a use of values alone");
  }
  EXPECT_EQ(store.state(1), TensorState::kHoldAfterBackward);
  ASSERT_EQ(store.trace().size(), 1u);
  EXPECT_EQ(store.trace()[0].pass, Pass::kBackward);
  EXPECT_TRUE(store.trace()[0].params);
  EXPECT_FALSE(store.trace()[0].grads);
  // The planner counts its param chunk alone.
  EXPECT_EQ(MostChunksPerMoment(store.layout(), {{{1}, Pass::kBackward, true, false}}).total, 1);
}

TEST(ParamStore, KindsShareOneLayoutInSeparateMemory) {
  ParamStore store = MakeStore();
  EXPECT_EQ(store.layout().num_chunks(), 2);
  EXPECT_NE(store.TensorData(StateKind::kParam, 1), store.TensorData(StateKind::kGrad, 1));
  store.TensorData(StateKind::kGrad, 0)[3] = 5.0f;
  EXPECT_EQ(store.Peek(StateKind::kGrad, 0)[3], 5.0f);
  store.ZeroGrads();
  EXPECT_EQ(store.Peek(StateKind::kGrad, 0)[3], 0.0f);
  EXPECT_EQ(store.model_bytes(), 4 * 2 * 64);  // 8 floats per chunk, in 64-byte slots
}

TEST(ParamStore, BackwardWritesReachTheHostCopy) {
  ParamStore store = MakeStore();
  store.ZeroGrads();
  {
    auto u = store.Acquire({1}, Pass::kBackward);
    u.grad(1)[5] = 3.5f;
  }
  EXPECT_EQ(store.Peek(StateKind::kGrad, 1)[5], 3.5f);  // the device copy, not moved
  EXPECT_EQ(store.TensorData(StateKind::kGrad, 1)[5], 3.5f);  // written home
  EXPECT_FALSE(store.chunks().OnDevice({StateKind::kGrad, 1}));
}

TEST(ParamStore, MaxChunksPerMomentCountsGradsInBackward) {
  std::vector<TensorSpec> specs = {{"a", {8}, TensorRole::kWeight, 0.02f}, {"b", {8}, TensorRole::kBias, 0}};
  auto layout = *ParamLayout::Build(specs, 8);
  EXPECT_EQ(MaxChunksPerMoment(layout, {{{0, 1}, Pass::kForward}}), 2);
  EXPECT_EQ(MaxChunksPerMoment(layout, {{{0}, Pass::kForward}, {{0, 1}, Pass::kBackward}}), 4);
}

TEST(ParamStoreDeathTest, TensorOutsideItsBracketAborts) {
  ParamStore store = MakeStore();
  EXPECT_DEATH(
      {
        auto u = store.Acquire({0}, Pass::kForward);
        (void)u.param(1);
      },
      "used outside its bracket");
  EXPECT_DEATH(
      {
        auto u = store.Acquire({0}, Pass::kForward);
        (void)u.grad(0);
      },
      "forward pass");
  EXPECT_DEATH(
      {
        auto u = store.Acquire({0}, Pass::kForward);
        (void)store.TensorData(StateKind::kParam, 0);
      },
      "in use");
}

}  // namespace
}  // namespace pstar
