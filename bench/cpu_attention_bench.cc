// Time of pstar's CPU attention (forward, and backward from its results) on
// random fp32 q, k, v and dout, with the process's OpenMP threads. Run by
// bench/cpu_attention_vs_pytorch.sh, which adds PyTorch's figure.
//
// The figures are medians over --iters rounds after --warmup. GFLOP/s count
// the causal products the math needs, whoever computes them: forward q·kᵀ and
// P·v, backward dP, dV, dK, dQ (4 products; the kernel's recomputed q·kᵀ is
// not counted), each B·NH·T(T+1)/2·hs multiply-adds. Prints one line:
//   pstar: batch=B seq=T embd=C heads=NH threads=N iters=K forward_ms=F backward_ms=G
//          forward_gflops=X backward_gflops=Y
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"

namespace {

struct Options {
  int64_t batch = 2, seq = 1024, embd = 384, heads = 6;
  int iters = 7, warmup = 2;
};

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: cpu_attention_bench [--batch B] [--seq T] [--embd C] [--heads NH] [--iters K] [--warmup W]\n");
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage();
    char* end = nullptr;
    const long long value = std::strtoll(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0' || value < 0) Usage();
    if (arg == "--batch") o.batch = value;
    else if (arg == "--seq") o.seq = value;
    else if (arg == "--embd") o.embd = value;
    else if (arg == "--heads") o.heads = value;
    else if (arg == "--iters") o.iters = int(value);
    else if (arg == "--warmup") o.warmup = int(value);
    else Usage();
  }
  if (o.batch < 1 || o.seq < 1 || o.heads < 1 || o.embd < o.heads || o.embd % o.heads != 0 || o.iters < 1) Usage();
  return o;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  const int64_t B = o.batch, T = o.seq, C = o.embd, NH = o.heads;
  std::vector<float> qkv(size_t(B * T * 3 * C)), out(size_t(B * T * C)), lse(size_t(B * NH * T));
  std::vector<float> dout(out.size()), dqkv(qkv.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);

  using Clock = std::chrono::steady_clock;
  std::vector<double> forward, backward;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    const auto t0 = Clock::now();
    pstar::kernels::cpu::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    const auto t1 = Clock::now();
    pstar::kernels::cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                                           NH);
    const auto t2 = Clock::now();
    if (it < o.warmup) continue;
    forward.push_back(std::chrono::duration<double>(t1 - t0).count());
    backward.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double product_flops = 2.0 * double(B) * double(NH) * double(T) * double(T + 1) / 2 * double(C / NH);
  const double f = Median(forward), b = Median(backward);
  std::printf(
      "pstar: batch=%lld seq=%lld embd=%lld heads=%lld threads=%d iters=%d forward_ms=%.3f backward_ms=%.3f "
      "forward_gflops=%.1f backward_gflops=%.1f\n",
      (long long)B, (long long)T, (long long)C, (long long)NH, omp_get_max_threads(), o.iters, 1e3 * f, 1e3 * b,
      2 * product_flops / f / 1e9, 4 * product_flops / b / 1e9);
  return 0;
}
