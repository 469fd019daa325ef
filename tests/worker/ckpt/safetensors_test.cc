#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"

namespace pstar {
namespace {

TEST(Safetensors, RoundTripAndTruncationDetected) {
  test::TempDir dir("st");
  const std::string path = dir.path() + "/t.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int32_t> b = {4, 5};
  SafetensorsWriter w;
  w.Add("a", Dtype::kF32, {2, 3}, a.data());
  w.Add("b", Dtype::kI32, {2}, b.data());
  w.SetMetadata("step", "12");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors().at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*f->ToDoubles("a"), (std::vector<double>{1.5, -2.0, 3.25, 0.0, 7.0, 8.0}));
  EXPECT_EQ(*f->ToDoubles("b"), (std::vector<double>{4, 5}));
  EXPECT_EQ(f->metadata().at("step"), "12");
  EXPECT_FALSE(f->ToDoubles("c").ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  auto cut = SafetensorsFile::Read(path);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pstar
