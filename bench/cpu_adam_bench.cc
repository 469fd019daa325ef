// Throughput of pstar's CPU Adam kernel and, in the same process and with
// the same OpenMP threads, the memory-bandwidth bound it is measured against.
// Run by bench/cpu_adam_vs_pytorch.sh, which adds the PyTorch figure.
//
// Adam streams 28 bytes per parameter (reads p, g, m, v; writes p, m, v), so
// its bound is a bandwidth / 28. Two bandwidths are measured:
//  - copy: a parallel memcpy of --copy-mib MiB per side, counted as read +
//    write bytes; the conventional figure.
//  - traffic: Adam's four streams in place with trivial arithmetic
//    (p += g, m += g, v += g) and the kernel's software prefetch: what the
//    machine moves in Adam's own access pattern. Where a core's bandwidth is
//    limited by the misses it keeps in flight, four read streams beat
//    memcpy's one, and Adam can exceed the copy bound.
//
// Each round times every measurement once, in turn, so a change in machine
// load hits all of them alike; the figures are medians over --iters rounds
// after --warmup. Prints one line each:
//   isa: selected=<path> supported=<paths>
//   pstar: isa=<path> n=N threads=T iters=K median_s=S params_per_s=X
//   path: isa=<path> ...      (each other supported path, for reference)
//   copy: bytes=B threads=T iters=K median_s=S bytes_per_s=X bound_params_per_s=Y
//   traffic: n=N threads=T iters=K median_s=S bytes_per_s=X bound_params_per_s=Y
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/adam.h"

namespace {

using pstar::kernels::cpu::AdamParams;
using pstar::kernels::cpu::AdamPath;

struct Options {
  int64_t n = int64_t{64} << 20;
  int iters = 7;
  int warmup = 2;
  int64_t copy_mib = 512;
};

void Usage() {
  std::fprintf(stderr, "usage: cpu_adam_bench [--n N] [--iters K] [--warmup W] [--copy-mib M]\n");
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage();
    const char* value = argv[++i];
    if (arg == "--n") {
      o.n = std::strtoll(value, nullptr, 10);
    } else if (arg == "--iters") {
      o.iters = std::atoi(value);
    } else if (arg == "--warmup") {
      o.warmup = std::atoi(value);
    } else if (arg == "--copy-mib") {
      o.copy_mib = std::strtoll(value, nullptr, 10);
    } else {
      Usage();
    }
  }
  if (o.n <= 0 || o.iters <= 0 || o.warmup < 0 || o.copy_mib <= 0) Usage();
  return o;
}

// A 64-byte aligned array.
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : data_(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {
    if (data_ == nullptr) {
      std::fprintf(stderr, "cpu_adam_bench: out of memory (%zu bytes)\n", bytes);
      std::exit(1);
    }
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() { return reinterpret_cast<float*>(data_); }
  char* c() { return data_; }

 private:
  char* data_;
};

// A deterministic value in [0, 1) per index.
float Unit(uint64_t i) {
  i = (i + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  i ^= i >> 31;
  return float(i >> 40) * (1.0f / float(1 << 24));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Thread t's block of [0, n) in whole cache lines of floats, as the kernel
// splits an aligned span.
void Block(int64_t n, int64_t* begin, int64_t* end) {
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), lines = n / 16;
  *begin = lines * t / nt * 16;
  *end = t == nt - 1 ? n : lines * (t + 1) / nt * 16;
}

AdamParams StepParams(int step) {
  AdamParams a{};
  a.lr = 1e-3f;
  a.beta1 = 0.9f;
  a.beta2 = 0.999f;
  a.eps = 1e-8f;
  a.grad_scale = 1.0f;
  a.bias_correction1 = float(1.0 - std::pow(0.9, step));
  a.bias_correction2 = float(1.0 - std::pow(0.999, step));
  return a;
}

// Adam state, first touched by the threads that will update it. Gradients
// are kept away from zero so no subnormals (slow on x86) appear in m, v or
// g^2.
struct AdamState {
  explicit AdamState(int64_t n) : n(n), p(n * 4), g(n * 4), m(n * 4), v(n * 4) {
    float *pp = p.f(), *gp = g.f(), *mp = m.f(), *vp = v.f();
#pragma omp parallel
    {
      int64_t begin, end;
      Block(n, &begin, &end);
      for (int64_t i = begin; i < end; ++i) {
        pp[i] = 0.02f * (Unit(i) - 0.5f);
        const float u = Unit(i + n);
        gp[i] = (u < 0.5f ? -1e-2f : 1e-2f) * (0.5f + u);
        mp[i] = 0.0f;
        vp[i] = 0.0f;
      }
    }
  }
  int64_t n;
  Buffer p, g, m, v;
};

// Adam's memory traffic without its arithmetic.
void Traffic(AdamState& s) {
  float *pp = s.p.f(), *gp = s.g.f(), *mp = s.m.f(), *vp = s.v.f();
#pragma omp parallel
  {
    int64_t begin, end;
    Block(s.n, &begin, &end);
    constexpr int64_t kAhead = 512;  // as the kernel prefetches
    int64_t i = begin;
    for (; i + kAhead + 16 <= end; i += 16) {
      __builtin_prefetch(pp + i + kAhead);
      __builtin_prefetch(gp + i + kAhead);
      __builtin_prefetch(mp + i + kAhead);
      __builtin_prefetch(vp + i + kAhead);
#pragma omp simd
      for (int64_t j = i; j < i + 16; ++j) {
        pp[j] += gp[j];
        mp[j] += gp[j];
        vp[j] += gp[j];
      }
    }
    for (; i < end; ++i) {
      pp[i] += gp[i];
      mp[i] += gp[i];
      vp[i] += gp[i];
    }
  }
}

// One parallel memcpy, each thread copying one contiguous block.
void Copy(char* dst, const char* src, int64_t bytes) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), lines = bytes / 64;
    const int64_t begin = lines * t / nt * 64;
    const int64_t end = t == nt - 1 ? bytes : lines * (t + 1) / nt * 64;
    std::memcpy(dst + begin, src + begin, size_t(end - begin));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  const int threads = omp_get_max_threads();
  namespace k = pstar::kernels::cpu;

  std::vector<AdamPath> paths = {k::AdamSelectedPath()};
  std::string supported;
  for (AdamPath path : {AdamPath::kAvx512, AdamPath::kAvx2, AdamPath::kScalar}) {
    if (!k::AdamPathSupported(path)) continue;
    supported += std::string(supported.empty() ? "" : ",") + k::AdamPathName(path);
    if (path != paths[0]) paths.push_back(path);
  }
  std::printf("isa: selected=%s supported=%s\n", k::AdamIsa(), supported.c_str());

  AdamState adam(o.n), traffic(o.n);
  const int64_t copy_bytes = o.copy_mib << 20;
  Buffer src(copy_bytes), dst(copy_bytes);
  char *s = src.c(), *d = dst.c();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < copy_bytes; i += 4096) {
    std::memset(s + i, int(i / 4096), size_t(std::min<int64_t>(4096, copy_bytes - i)));
    std::memset(d + i, 0, size_t(std::min<int64_t>(4096, copy_bytes - i)));
  }

  // One timed entry per path, then copy, then traffic.
  std::vector<std::function<void(int)>> runs;
  for (AdamPath path : paths) {
    runs.push_back([&adam, path](int step) {
      k::AdamUpdateOnPath(path, adam.p.f(), adam.g.f(), adam.m.f(), adam.v.f(), adam.n,
                          StepParams(step));
    });
  }
  runs.push_back([&](int) { Copy(d, s, copy_bytes); });
  runs.push_back([&](int) { Traffic(traffic); });
  std::vector<std::vector<double>> times(runs.size());
  int step = 0;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    for (size_t r = 0; r < runs.size(); ++r) {
      if (r < paths.size()) ++step;
      const double t0 = Now();
      runs[r](step);
      const double t1 = Now();
      if (it >= o.warmup) times[r].push_back(t1 - t0);
    }
  }
  if (std::memcmp(s, d, size_t(copy_bytes)) != 0) std::abort();

  for (size_t r = 0; r < paths.size(); ++r) {
    const double sec = Median(times[r]);
    std::printf("%s: isa=%s n=%lld threads=%d iters=%d median_s=%.6f params_per_s=%.4e\n",
                r == 0 ? "pstar" : "path", k::AdamPathName(paths[r]), static_cast<long long>(o.n),
                threads, o.iters, sec, double(o.n) / sec);
  }
  const double copy_s = Median(times[paths.size()]);
  const double copy_bw = 2.0 * double(copy_bytes) / copy_s;  // read + write
  std::printf("copy: bytes=%lld threads=%d iters=%d median_s=%.6f bytes_per_s=%.4e "
              "bound_params_per_s=%.4e\n",
              static_cast<long long>(copy_bytes), threads, o.iters, copy_s, copy_bw, copy_bw / 28.0);
  const double traffic_s = Median(times[paths.size() + 1]);
  const double traffic_bw = 28.0 * double(o.n) / traffic_s;
  std::printf("traffic: n=%lld threads=%d iters=%d median_s=%.6f bytes_per_s=%.4e "
              "bound_params_per_s=%.4e\n",
              static_cast<long long>(o.n), threads, o.iters, traffic_s, traffic_bw,
              traffic_bw / 28.0);
  return 0;
}
