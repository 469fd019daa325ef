#include "worker/model/param_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "worker/model/gpt.h"

namespace pstar {
namespace {

std::vector<TensorSpec> Specs(std::vector<int64_t> sizes) {
  std::vector<TensorSpec> s;
  for (size_t i = 0; i < sizes.size(); ++i) s.push_back({"t" + std::to_string(i), {sizes[i]}, TensorRole::kWeight, 0.02f});
  return s;
}

TEST(ParamLayout, PacksInOrderWithoutStraddling) {
  auto layout = ParamLayout::Build(Specs({600, 500, 300, 900, 100}), 1000);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_chunks(), 3);
  EXPECT_EQ(layout->placement(0).chunk, 0);
  EXPECT_EQ(layout->placement(1).chunk, 1);  // 600 + 500 > 1000
  EXPECT_EQ(layout->placement(2).chunk, 1);
  EXPECT_EQ(layout->placement(2).offset, 500);
  EXPECT_EQ(layout->placement(3).chunk, 2);
  EXPECT_EQ(layout->placement(4).chunk, 2);
  EXPECT_EQ(layout->placement(4).offset, 900);
  for (TensorId id = 0; id < layout->num_tensors(); ++id) {
    EXPECT_LE(layout->placement(id).offset + layout->spec(id).numel(), layout->chunk_elems());
  }
  EXPECT_EQ(layout->num_elements(), 2400);
}

TEST(ParamLayout, RejectsChunkSmallerThanLargestTensor) {
  auto layout = ParamLayout::Build(Specs({100, 5000}), 1000);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("t1 (5000 elements)"), std::string::npos) << layout.status().message();
}

TEST(ParamLayout, AutomaticChunkSizeLeastPadding) {
  auto specs = Specs({3000, 1024, 1024, 1024, 3000, 1000});
  int64_t chosen = ParamLayout::ChooseChunkElems(specs);
  EXPECT_GE(chosen, 3000);
  auto best = ParamLayout::Build(specs, chosen);
  ASSERT_TRUE(best.ok());
  int64_t best_waste = best->padded_elements() - best->num_elements();
  for (int64_t s = 3072; s <= 6144; s += 1024) {
    auto other = ParamLayout::Build(specs, s);
    EXPECT_LE(best_waste, other->padded_elements() - other->num_elements()) << "chunk " << s;
  }
}

TEST(ParamLayout, GptTensorsInFirstUseOrder) {
  GptConfig g{2, 2, 8, 30, 16};
  auto specs = GptTensorSpecs(g);
  ASSERT_EQ(specs.front().name, "transformer.wte.weight");
  ASSERT_EQ(specs[2].name, "transformer.h.0.ln_1.weight");
  ASSERT_EQ(specs.back().name, "transformer.ln_f.bias");
  // The parameters users count are the visible ones; wte's 30 rows are
  // padded to 64 in the layout, with zero padding rows.
  int64_t total = 0, visible = 0;
  for (const auto& s : specs) {
    total += s.numel();
    visible += s.visible_numel();
  }
  EXPECT_EQ(visible, g.NumParameters());
  EXPECT_EQ(total, g.NumParameters() + (64 - 30) * 8);
  EXPECT_EQ(specs.front().shape, (std::vector<int64_t>{64, 8}));
  EXPECT_EQ(specs.front().visible_shape(), (std::vector<int64_t>{30, 8}));
  g.vocab_multiple = 1;
  EXPECT_EQ(GptTensorSpecs(g).front().shape, (std::vector<int64_t>{30, 8}));
  EXPECT_FALSE(specs[3].decayed());  // ln_1.bias
  EXPECT_TRUE(specs[4].decayed());   // c_attn.weight
}

// Every chunk size the planner weighs, judged by the layout Build packs: the
// one chosen wastes the least, and the smallest of those that tie.
TEST(ParamLayout, AutomaticChunkSizeIsTheLeastPaddingOfEveryCandidateForRandomModels) {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int64_t> sizes(size_t(1 + rng() % (trial < 20 ? 30 : 3000)));
    const int64_t spread = int64_t(1 + rng() % 100000);
    for (int64_t& n : sizes) n = int64_t(1 + rng() % uint64_t(spread));
    if (trial % 3 == 0) sizes[rng() % sizes.size()] = spread * 3;  // one large tensor, like an embedding
    const auto specs = Specs(sizes);
    const int64_t chosen = ParamLayout::ChooseChunkElems(specs);
    auto waste = [&](int64_t s) {
      auto layout = ParamLayout::Build(specs, s);
      EXPECT_TRUE(layout.ok()) << layout.status().message();
      return layout->padded_elements() - layout->num_elements();
    };
    int64_t largest = 0, total = 0;
    for (int64_t n : sizes) largest = std::max(largest, n), total += n;
    const int64_t lo = (largest + 1023) / 1024 * 1024;
    const int64_t hi = std::max(lo, (std::min(total, 2 * lo) + 1023) / 1024 * 1024);
    const int64_t step = std::max<int64_t>(1024, ((hi - lo) / 2000 + 1 + 1023) / 1024 * 1024);
    int64_t best = lo, best_waste = waste(lo);
    for (int64_t s = lo + step; s <= hi; s += step) {
      if (const int64_t w = waste(s); w < best_waste) best = s, best_waste = w;
    }
    EXPECT_EQ(chosen, best) << "trial " << trial << ", " << sizes.size() << " tensors";
  }
}

}  // namespace
}  // namespace pstar
