// A model directory's weights, one file or sharded: element ranges read
// through a small staging buffer equal the whole tensor's values in every
// dtype; every way a directory can be wrong is refused in one line naming
// the file and the tensor.
#include "worker/ckpt/hf_weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"
#include "worker/runtime/half_format.h"

namespace pstar {
namespace {

std::vector<float> Ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float(i % 97) - 3.0f;
  return v;
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A safetensors file written by hand: `header` as given, `data_bytes` zero bytes.
void WriteRaw(const std::string& path, const std::string& header, int64_t data_bytes) {
  std::string h = header;
  while (h.size() % 8) h.push_back(' ');
  const uint64_t len = h.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << h << std::string(size_t(data_bytes), '\0');
}

class HfWeightsTest : public ::testing::Test {
 protected:
  // Two shards: a (6, 5) F32 and a (7,) BF16 in the first, a (3, 4) F16 in
  // the second.
  void WriteSharded(const std::string& dir) {
    std::filesystem::create_directories(dir);
    a_ = Ramp(30, 0.25f);
    b_ = Ramp(7, 0.5f);
    c_ = Ramp(12, 0.125f);
    std::vector<uint16_t> b16(b_.size()), c16(c_.size());
    NarrowToHalf(b16.data(), b_.data(), int64_t(b_.size()), HalfFormat::kBf16);
    NarrowToHalf(c16.data(), c_.data(), int64_t(c_.size()), HalfFormat::kFp16);
    SafetensorsWriter first, second;
    first.Add("a", Dtype::kF32, {6, 5}, a_.data());
    first.Add("b", Dtype::kBF16, {7}, b16.data());
    second.Add("c", Dtype::kF16, {3, 4}, c16.data());
    ASSERT_TRUE(first.Write(dir + "/model-00001-of-00002.safetensors").ok());
    ASSERT_TRUE(second.Write(dir + "/model-00002-of-00002.safetensors").ok());
    WriteText(dir + "/model.safetensors.index.json", Index({{"a", 1}, {"b", 1}, {"c", 2}}));
  }
  static std::string Index(const std::vector<std::pair<std::string, int>>& map) {
    std::string s = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
    for (size_t i = 0; i < map.size(); ++i) {
      s += (i ? ", " : "") + std::string("\"") + map[i].first + "\": \"model-0000" + std::to_string(map[i].second) +
           "-of-00002.safetensors\"";
    }
    return s + "}}";
  }
  static void ExpectRefused(const std::string& dir, const std::string& needle) {
    auto w = HfWeights::Open(dir);
    ASSERT_FALSE(w.ok()) << needle;
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
    EXPECT_EQ(w.status().message().find('\n'), std::string::npos);
  }

  std::vector<float> a_, b_, c_;
};

TEST_F(HfWeightsTest, RangesThroughASmallBufferEqualTheWholeTensorInEveryDtype) {
  test::TempDir dir("hf_weights");
  WriteSharded(dir.path());
  auto w = HfWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->tensors().size(), 3u);
  EXPECT_EQ(w->num_files(), 2);
  EXPECT_EQ(w->Find("c")->shape, (std::vector<int64_t>{3, 4}));
  std::vector<uint16_t> staging(3);  // smaller than every 16-bit range read
  for (const auto& [name, want] : {std::pair<std::string, const std::vector<float>*>{"a", &a_}, {"b", &b_}, {"c", &c_}}) {
    SCOPED_TRACE(name);
    std::vector<float> exact = *want;
    if (name != "a") {  // what the 16-bit file holds
      std::vector<uint16_t> h(exact.size());
      const HalfFormat f = name == "b" ? HalfFormat::kBf16 : HalfFormat::kFp16;
      NarrowToHalf(h.data(), exact.data(), int64_t(h.size()), f);
      WidenFromHalf(exact.data(), h.data(), int64_t(h.size()), f);
    }
    const int64_t n = int64_t(exact.size());
    for (int64_t first = 0; first < n; first += 2) {
      for (int64_t count : {int64_t(1), n - first}) {
        std::vector<float> got(size_t(count), -1.0f);
        ASSERT_TRUE(w->ReadFloats(name, first, count, got.data(), staging).ok());
        EXPECT_EQ(got, std::vector<float>(exact.begin() + first, exact.begin() + first + count)) << first;
      }
    }
    std::vector<float> one(1);
    auto past = w->ReadFloats(name, n, 1, one.data(), staging);
    ASSERT_FALSE(past.ok());
    EXPECT_NE(past.message().find("outside"), std::string::npos) << past.message();
  }
  EXPECT_LE(staging.size(), 3u) << "the buffer stays as given";
  // One file without an index is the same.
  test::TempDir single("hf_weights_single");
  SafetensorsWriter one;
  one.Add("a", Dtype::kF32, {6, 5}, a_.data());
  ASSERT_TRUE(one.Write(single.path() + "/model.safetensors").ok());
  auto s = HfWeights::Open(single.path());
  ASSERT_TRUE(s.ok()) << s.status().message();
  std::vector<float> got(30);
  ASSERT_TRUE(s->ReadFloats("a", 0, 30, got.data(), staging).ok());
  EXPECT_EQ(got, a_);
}

TEST_F(HfWeightsTest, EveryBadDirectoryIsRefusedInOneLine) {
  test::TempDir root("hf_weights_bad");
  int n = 0;
  auto fresh = [&] {
    const std::string d = root.path() + "/" + std::to_string(n++);
    WriteSharded(d);
    return d;
  };
  ExpectRefused(root.path() + "/nothing", "no model.safetensors and no model.safetensors.index.json");
  std::string d = fresh();
  std::filesystem::remove(d + "/model-00002-of-00002.safetensors");
  ExpectRefused(d, "model.safetensors.index.json: names model-00002-of-00002.safetensors, which is not in");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", Index({{"a", 1}, {"b", 2}, {"c", 2}}));
  ExpectRefused(d, "holds tensor b, which model.safetensors.index.json places in model-00002-of-00002.safetensors");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", Index({{"a", 1}, {"c", 2}}));
  ExpectRefused(d, "model-00001-of-00002.safetensors: holds tensor b, which model.safetensors.index.json does not list");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", Index({{"a", 1}, {"b", 1}, {"c", 2}, {"d", 2}}));
  ExpectRefused(d, "places tensor d in model-00002-of-00002.safetensors, which does not hold it");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}");
  ExpectRefused(d, "not a file in the model's directory");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", "{\"weight_map\": [1]}");
  ExpectRefused(d, "no weight_map object");
  d = fresh();
  WriteText(d + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
  ExpectRefused(d, "weight_map[a] is not a file name");
  // The same tensor in two shards.
  d = fresh();
  {
    std::vector<uint16_t> c16(12, 0);
    SafetensorsWriter second;
    second.Add("c", Dtype::kF16, {3, 4}, c16.data());
    second.Add("a", Dtype::kF32, {6, 5}, a_.data());
    ASSERT_TRUE(second.Write(d + "/model-00002-of-00002.safetensors").ok());
  }
  ExpectRefused(d, "model-00002-of-00002.safetensors: tensor a is also in");
  // Headers that name a tensor twice, overlap, overrun the file, or hold a
  // dtype pstar does not import.
  d = fresh();
  WriteRaw(d + "/model-00002-of-00002.safetensors",
           R"({"c": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]},)"
           R"( "c": {"dtype": "F16", "shape": [3, 4], "data_offsets": [24, 48]}})",
           48);
  ExpectRefused(d, "tensor c is named twice in the header");
  d = fresh();
  WriteRaw(d + "/model-00002-of-00002.safetensors",
           R"({"c": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]},)"
           R"( "e": {"dtype": "F16", "shape": [3, 4], "data_offsets": [16, 40]}})",
           48);
  WriteText(d + "/model.safetensors.index.json", Index({{"a", 1}, {"b", 1}, {"c", 2}, {"e", 2}}));
  ExpectRefused(d, "tensors c and e overlap in the file");
  d = fresh();
  WriteRaw(d + "/model-00002-of-00002.safetensors", R"({"c": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]}})",
           20);
  ExpectRefused(d, "tensor c lies outside the file");
  d = fresh();
  WriteRaw(d + "/model-00002-of-00002.safetensors", R"({"c": {"dtype": "F64", "shape": [3], "data_offsets": [0, 24]}})",
           24);
  ExpectRefused(d, "model-00002-of-00002.safetensors: tensor c is F64; pstar imports BF16, F16 and F32");
  d = fresh();
  WriteRaw(d + "/model-00002-of-00002.safetensors", R"({"c": {"dtype": "F8_E4M3", "shape": [3], "data_offsets": [0, 3]}})",
           3);
  ExpectRefused(d, "tensor c has unsupported dtype F8_E4M3");
  // A file truncated after it was opened reads as DataLoss naming it.
  d = fresh();
  auto w = HfWeights::Open(d);
  ASSERT_TRUE(w.ok());
  std::filesystem::resize_file(d + "/model-00002-of-00002.safetensors", 20);
  std::vector<uint16_t> staging(4);
  std::vector<float> got(12);
  const Status cut = w->ReadFloats("c", 0, 12, got.data(), staging);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.message().find("model-00002-of-00002.safetensors: ends before byte"), std::string::npos)
      << cut.message();
}

}  // namespace
}  // namespace pstar
