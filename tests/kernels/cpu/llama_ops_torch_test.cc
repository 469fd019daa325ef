// The Llama family's CPU kernels (RMSNorm, RoPE with and without Llama 3's
// scaling, SwiGLU, grouped-query attention) against PyTorch in float64,
// written from the Hugging Face models' math, on fresh random shapes every
// run (PSTAR_TEST_SEED reproduces one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"

namespace pstar::kernels::cpu {
namespace {

// max |a - b| / max |b|.
// The largest |a - b| over the largest |b|, or over `floor` where that is
// larger (an output that is a difference of terms that may cancel).
double MaxRelative(const std::vector<float>& a, const std::vector<double>& b, double floor = 0) {
  double maxb = std::max(1e-300, floor), maxd = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    maxb = std::max(maxb, std::abs(b[i]));
    maxd = std::max(maxd, std::abs(double(a[i]) - b[i]));
  }
  return maxd / maxb;
}

// One op's inputs for the reference, and what pstar computes from them.
struct Case {
  std::string what;  // the shape, for messages
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> inputs;
  std::function<std::map<std::string, std::vector<float>>()> run;  // pstar's outputs by the reference's names
  // Per output, the size of the terms it is a difference of, where they
  // can cancel to nothing (the error is measured against it then).
  std::map<std::string, double> floors;
};

class Cases {
 public:
  explicit Cases(uint64_t seed) : rng_(seed) {}
  int64_t Pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  std::vector<float> Normal(int64_t n) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }

 private:
  std::mt19937_64 rng_;
};

Case RmsNormCase(Cases& r) {
  const int64_t N = r.Pick(1, 9), C = r.Pick(1, 300);
  const float eps = r.Pick(0, 1) ? 1e-5f : 1e-6f;
  Case c;
  c.what = "rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C);
  c.metadata = {{"op", "rmsnorm"}, {"eps", std::to_string(eps)}};
  auto x = r.Normal(N * C), weight = r.Normal(C), dout = r.Normal(N * C);
  c.inputs = {{"x", {{N, C}, x}}, {"weight", {{C}, weight}}, {"dout", {{N, C}, dout}}};
  // dx = rstd * (w dy - xhat mean(w dy xhat)): at one column xhat^2 is
  // 1 - eps rstd^2 and the two terms cancel but for eps.
  double terms = 0;
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0;
    for (int64_t i = 0; i < C; ++i) sq += double(x[size_t(n * C + i)]) * x[size_t(n * C + i)];
    const double rstd = 1 / std::sqrt(sq / double(C) + eps);
    for (int64_t i = 0; i < C; ++i) terms = std::max(terms, std::abs(weight[size_t(i)] * dout[size_t(n * C + i)] * rstd));
  }
  c.floors = {{"dx", terms}};
  c.run = [=] {
    std::vector<float> out(static_cast<size_t>(N * C)), rstd(static_cast<size_t>(N)), dx(size_t(N * C), 0.0f), dw(size_t(C), 0.0f);
    RmsNormForward(out.data(), rstd.data(), x.data(), weight.data(), eps, N, C);
    RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), weight.data(), rstd.data(), N, C);
    return std::map<std::string, std::vector<float>>{{"out", out}, {"dx", dx}, {"dweight", dw}};
  };
  return c;
}

// The grouped shapes of the Llama family: query heads per kv head 1, 2, 3,
// 4, 7 or 8 (3 and 7 are Llama 3.2 3B's and Qwen2.5's).
AttentionShape GroupedShape(Cases& r, int64_t max_T, int64_t min_hs, bool even_hs) {
  static const int64_t kGroups[] = {1, 2, 3, 4, 7, 8};
  const int64_t group = kGroups[r.Pick(0, 5)], NKV = r.Pick(1, 2);
  int64_t hs = r.Pick(min_hs, 128);
  if (even_hs) hs += hs % 2;
  return {r.Pick(1, 2), r.Pick(1, max_T), group * NKV, NKV, hs};
}

std::string ShapeText(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs);
}

Case RopeCase(Cases& r) {
  const AttentionShape s = GroupedShape(r, 70, 2, true);
  const bool llama3 = r.Pick(0, 1) == 1;
  RopeScaling scaling;
  scaling.llama3 = llama3;
  scaling.original_max_position_embeddings = r.Pick(16, 8192);
  const double theta = r.Pick(0, 1) ? 500000.0 : 10000.0;
  // Positions restart where a packed row's next example begins.
  std::vector<float> positions(static_cast<size_t>(s.B * s.T));
  std::vector<int32_t> position_ids(positions.size());
  int32_t p = 0, most = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    p = r.Pick(0, 9) == 0 ? 0 : p + 1;
    position_ids[i] = p;
    positions[i] = float(p);
    most = std::max(most, p);
  }
  Case c;
  c.what = "rope " + ShapeText(s) + (llama3 ? " llama3" : "");
  c.metadata = {{"op", "rope"}, {"n_head", std::to_string(s.NH)}, {"n_kv_head", std::to_string(s.NKV)},
                {"theta", std::to_string(theta)}};
  if (llama3) {
    c.metadata["factor"] = std::to_string(scaling.factor);
    c.metadata["low_freq_factor"] = std::to_string(scaling.low_freq_factor);
    c.metadata["high_freq_factor"] = std::to_string(scaling.high_freq_factor);
    c.metadata["original_max"] = std::to_string(scaling.original_max_position_embeddings);
  }
  const int64_t row = s.RowElements();
  auto qkv = r.Normal(s.B * s.T * row), dout = r.Normal(s.B * s.T * row);
  c.inputs = {{"qkv", {{s.B, s.T, row}, qkv}}, {"positions", {{s.B, s.T}, positions}}, {"dout", {{s.B, s.T, row}, dout}}};
  c.run = [=] {
    const int64_t P = most + 1, half = s.hs / 2, N = s.B * s.T;
    std::vector<float> cos(static_cast<size_t>(P * half)), sin(static_cast<size_t>(P * half));
    RopeTables(cos.data(), sin.data(), P, s.hs, theta, scaling);
    std::vector<float> out = qkv, dqkv = dout;
    RopeForward(out.data(), row, cos.data(), sin.data(), position_ids.data(), N, s.NH, s.hs);
    RopeForward(out.data() + s.NH * s.hs, row, cos.data(), sin.data(), position_ids.data(), N, s.NKV, s.hs);
    RopeBackward(dqkv.data(), row, cos.data(), sin.data(), position_ids.data(), N, s.NH, s.hs);
    RopeBackward(dqkv.data() + s.NH * s.hs, row, cos.data(), sin.data(), position_ids.data(), N, s.NKV, s.hs);
    return std::map<std::string, std::vector<float>>{{"out", out}, {"dqkv", dqkv}};
  };
  return c;
}

Case SwiGluCase(Cases& r) {
  const int64_t N = r.Pick(1, 9), F = r.Pick(1, 300);
  Case c;
  c.what = "swiglu N=" + std::to_string(N) + " F=" + std::to_string(F);
  c.metadata = {{"op", "swiglu"}};
  auto gu = r.Normal(N * 2 * F), dout = r.Normal(N * F);
  for (float& x : gu) x *= 3.0f;  // well into both tails of the sigmoid
  c.inputs = {{"gu", {{N, 2 * F}, gu}}, {"dout", {{N, F}, dout}}};
  c.run = [=] {
    std::vector<float> out(static_cast<size_t>(N * F)), dgu(static_cast<size_t>(N * 2 * F));
    SwiGluForward(out.data(), gu.data(), N, F);
    SwiGluBackward(dgu.data(), gu.data(), dout.data(), N, F);
    return std::map<std::string, std::vector<float>>{{"out", out}, {"dgu", dgu}};
  };
  return c;
}

Case AttentionCase(Cases& r) {
  const AttentionShape s = GroupedShape(r, 150, 1, false);
  Case c;
  c.what = "attention " + ShapeText(s);
  c.metadata = {{"op", "attention"}, {"n_head", std::to_string(s.NH)}, {"n_kv_head", std::to_string(s.NKV)}};
  const int64_t row = s.RowElements(), out_row = s.NH * s.hs;
  auto qkv = r.Normal(s.B * s.T * row), dout = r.Normal(s.B * s.T * out_row);
  c.inputs = {{"qkv", {{s.B, s.T, row}, qkv}}, {"dout", {{s.B, s.T, out_row}, dout}}};
  c.run = [=] {
    std::vector<float> out(static_cast<size_t>(s.B * s.T * out_row)), lse(static_cast<size_t>(s.B * s.NH * s.T)), dqkv(qkv.size());
    AttentionForward(out.data(), lse.data(), qkv.data(), s);
    AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s);
    return std::map<std::string, std::vector<float>>{{"out", out}, {"lse", lse}, {"dqkv", dqkv}};
  };
  return c;
}

TEST(LlamaOpsTorch, EachKernelMatchesFloat64) {
  const uint64_t seed = test::RunSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  Cases r(seed);
  std::vector<Case> cases;
  for (int i = 0; i < 3; ++i) {
    cases.push_back(RmsNormCase(r));
    cases.push_back(RopeCase(r));
    cases.push_back(SwiGluCase(r));
    cases.push_back(AttentionCase(r));
  }
  // Every case's inputs, then one PyTorch run for all of them.
  test::TempDir dir("llama_ops_torch");
  std::vector<std::string> argv = {"/usr/bin/python3",
                                   test::SourceDir() + "/tests/fixtures/torch_llama_ops_reference.py"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string case_dir = dir.path() + "/case-" + std::to_string(i);
    std::filesystem::create_directories(case_dir);
    SafetensorsWriter inputs;
    for (const auto& [key, value] : cases[i].metadata) inputs.SetMetadata(key, value);
    for (const auto& [name, tensor] : cases[i].inputs) inputs.Add(name, Dtype::kF32, tensor.first, tensor.second.data());
    ASSERT_TRUE(inputs.Write(case_dir + "/inputs.safetensors").ok());
    argv.push_back(case_dir);
  }
  test::ProcessResult py = test::RunProcess(argv);
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    auto ref = SafetensorsFile::Read(dir.path() + "/case-" + std::to_string(i) + "/ref.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    std::string line = cases[i].what + ":";
    for (const auto& [name, got] : cases[i].run()) {
      auto want = ref->ToDoubles(name);
      ASSERT_TRUE(want.ok()) << name << ": " << want.status().message();
      ASSERT_EQ(want->size(), got.size()) << name;
      const auto floor = cases[i].floors.find(name);
      const double error = MaxRelative(got, *want, floor == cases[i].floors.end() ? 0.0 : floor->second);
      EXPECT_LE(error, 1e-5) << name;
      char text[64];
      std::snprintf(text, sizeof text, " %s %.2g", name.c_str(), error);
      line += text;
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace
}  // namespace pstar::kernels::cpu
