// pstar's causal attention alone on one GPU, forward and backward, for
// bench/gpu_attention.sh: each kernel family (the WMMA tiles, kernel=tc; the
// mma.sync kernels with the two-pass backward, kernel=mma, and with the
// five-product one-pass backward, kernel=mma-onepass, and in a tuning build
// at head size 64 its 3-blocks-per-SM variant, kernel=mma-onepass-3blocks,
// and the two passes' one, kernel=mma-3blocks:
// AttentionForwardKernel and AttentionBackwardKernel; and cuDNN's fused
// graphs through pstar's backend-API route, kernel=cudnn, where the build
// and the host have cuDNN: kernels/cuda/cudnn_attention.h, given the whole
// workspace it asks for) at one shape, in bf16
// or fp16 with 16-bit gradients. Times are medians of CUDA-event
// timings after a warm-up; TFLOP/s count the causal half once: the forward's
// two products are 4 B NH T^2 hs / 2 FLOP, the backward's five 10 B NH T^2
// hs / 2 (the count PyTorch's and FlashAttention's benchmarks use). Each
// family's output is checked against the first's and a second run's bits
// against the first's (forward output, then the backward's dqkv).
//
// Prints per forward kernel:
//   attention: side=pstar kernel=tc|mma|mma-onepass[-3blocks]|cudnn B=.. NH=.. T=.. hs=.. dtype=bf16 fwd_ms=..
//              fwd_tflops=.. bwd_ms=.. bwd_tflops=.. same_bits=yes|no matches=yes|no
// and for the cuDNN route "attention: side=pstar kernel=cudnn version=.. fwd_workspace=.. bwd_workspace=.." and
// "attention: side=pstar kernel=cudnn device_json=<cuDNN's description of the GPU>" first, or
// "attention: side=pstar kernel=cudnn unavailable=<why>" (not a failure).
// Without a CUDA device: "skipped: no CUDA device (...)" and exit 0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cudnn_attention.h"

namespace {

namespace kc = pstar::kernels::cuda;

struct Options {
  int64_t B = 8, NH = 12, T = 1024, hs = 64;
  std::string dtype = "bf16";
  int reps = 20;
};

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: cuda_attention_bench [--batch B] [--heads NH] [--seq T] [--head-size HS] "
               "[--dtype bf16|fp16] [--reps N]\n");
  std::exit(2);
}

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda_attention_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

int64_t Positive(const char* flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v <= 0 || v > (1LL << 20)) {
    std::fprintf(stderr, "cuda_attention_bench: %s: a positive whole number, got '%s'\n", flag, text);
    std::exit(2);
  }
  return v;
}

template <typename T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) { Check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc"); }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  std::vector<T> Download() const {
    std::vector<T> h(n);
    Check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

double MedianMs(int reps, const std::function<void()>& run) {
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "event");
  Check(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    Check(cudaEventRecord(a), "record");
    run();
    Check(cudaEventRecord(b), "record");
    Check(cudaEventSynchronize(b), "sync");
    float t = 0;
    Check(cudaEventElapsedTime(&t, a, b), "elapsed");
    if (r > 0) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

float Widen(__nv_bfloat16 x) { return __bfloat162float(x); }
float Widen(__half x) { return __half2float(x); }
template <typename T>
T Narrow(float x);
template <>
__nv_bfloat16 Narrow<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__half Narrow<__half>(float x) {
  return __float2half(x);
}

template <typename T>
int Run(const Options& o) {
  const int64_t C = o.NH * o.hs;
  const pstar::kernels::AttentionShape shape = {o.B, o.T, o.NH, o.NH, o.hs};
  const size_t n_qkv = size_t(o.B * o.T * 3 * C), n_out = size_t(o.B * o.T * C), n_lse = size_t(o.B * o.NH * o.T);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<T> host(n_qkv);
  for (T& x : host) x = Narrow<T>(normal(rng));
  Device<T> qkv(n_qkv), out(n_out), dout(n_out), dqkv(n_qkv);
  Device<float> lse(n_lse),
      scratch(size_t(kc::AttentionScratchElements(shape, kc::AttentionBackwardKernel::kMmaOnePass)));
  Check(cudaMemcpy(qkv.p, host.data(), n_qkv * sizeof(T), cudaMemcpyHostToDevice), "upload");
  host.resize(n_out);
  for (T& x : host) x = Narrow<T>(normal(rng));
  Check(cudaMemcpy(dout.p, host.data(), n_out * sizeof(T), cudaMemcpyHostToDevice), "upload");

  const double flop = double(o.B) * double(o.NH) * double(o.T) * double(o.T) * double(o.hs) / 2.0;
  std::vector<float> first_out, first_grad;
  int rc = 0;
  struct Family {
    const char* name;
    kc::AttentionForwardKernel forward;
    kc::AttentionBackwardKernel backward;
    bool cudnn = false;
  };
  std::vector<Family> families = {
      {"tc", kc::AttentionForwardKernel::kTensorCore, kc::AttentionBackwardKernel::kTensorCore},
      {"mma", kc::AttentionForwardKernel::kMma, kc::AttentionBackwardKernel::kMma},
      {"mma-onepass", kc::AttentionForwardKernel::kMma, kc::AttentionBackwardKernel::kMmaOnePass},
      {"mma-wide", kc::AttentionForwardKernel::kMmaWide, kc::AttentionBackwardKernel::kMmaWide}};
  // The forward with its q tile in a k/v buffer, at the head size where it
  // differs.
  if (o.hs == 128) {
    families.push_back({"mma-sharedq", kc::AttentionForwardKernel::kMmaSharedQ, kc::AttentionBackwardKernel::kMma});
  }
  // The one-pass backward's occupancy variant, where this build has it (a
  // PSTAR_CUDA_TUNING build) and the head size is the one it is built for.
  if (kc::AttentionOccupancyVariantsBuilt() && o.hs == 64) {
    families.push_back(
        {"mma-onepass-3blocks", kc::AttentionForwardKernel::kMma, kc::AttentionBackwardKernel::kMmaOnePassOccupancy});
    families.push_back({"mma-3blocks", kc::AttentionForwardKernel::kMma, kc::AttentionBackwardKernel::kMmaOccupancy});
  }
  // cuDNN's graphs, given all the workspace they ask for (one call each).
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  std::string why_not;
  std::unique_ptr<kc::CudnnAttention> cudnn = kc::CudnnAttention::Open(&why_not);
  int64_t fwd_ws = -1, bwd_ws = -1;
  if (cudnn != nullptr) {
    fwd_ws = cudnn->WorkspaceBytes(false, bf16, shape);
    if (fwd_ws >= 0) bwd_ws = cudnn->WorkspaceBytes(true, bf16, shape);
    if (fwd_ws < 0 || bwd_ws < 0) why_not = cudnn->last_error();
  }
  std::unique_ptr<Device<char>> workspace;
  if (fwd_ws >= 0 && bwd_ws >= 0) {
    workspace = std::make_unique<Device<char>>(size_t(std::max<int64_t>({fwd_ws, bwd_ws, 16})));
    std::printf(
        "attention: side=pstar kernel=cudnn version=%lld build_version=%lld fwd_workspace=%lld "
        "bwd_workspace=%lld\n",
        (long long)cudnn->version(), (long long)kc::CudnnAttention::BuildVersion(), (long long)fwd_ws,
        (long long)bwd_ws);
    families.push_back({"cudnn", kc::AttentionForwardKernel::kCudnn, kc::AttentionBackwardKernel::kCudnn, true});
    // The GPU as cuDNN describes it: what tests/kernels/cuda/cudnn_plan_test.cc
    // plans for without a GPU.
    std::string json = cudnn->DeviceJson();
    for (char& c : json) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    std::printf("attention: side=pstar kernel=cudnn device_json=%s\n",
                json.empty() ? ("unavailable: " + cudnn->last_error()).c_str() : json.c_str());
  } else {
    std::printf("attention: side=pstar kernel=cudnn unavailable=\"%s\"\n", why_not.c_str());
  }
  for (const Family& family : families) {
    const char* name = family.name;
    auto forward = [&] {
      if (family.cudnn) {
        if (!cudnn->Forward(bf16, out.p, lse.p, qkv.p, shape, nullptr, workspace->p, workspace->n)) {
          std::fprintf(stderr, "cuda_attention_bench: %s\n", cudnn->last_error().c_str());
          std::exit(1);
        }
        return;
      }
      kc::AttentionForward(out.p, lse.p, qkv.p, shape, nullptr, family.forward);
    };
    auto backward = [&] {
      if (family.cudnn) {
        if (!cudnn->Backward(bf16, dqkv.p, dout.p, qkv.p, out.p, lse.p, shape, nullptr, workspace->p, workspace->n)) {
          std::fprintf(stderr, "cuda_attention_bench: %s\n", cudnn->last_error().c_str());
          std::exit(1);
        }
        return;
      }
      kc::AttentionBackward<T, T>(dqkv.p, scratch.p, dout.p, qkv.p, out.p, lse.p, shape, nullptr, family.backward);
    };
    const double fwd_ms = MedianMs(o.reps, forward);
    const std::vector<T> a = out.Download();
    forward();
    const std::vector<T> b = out.Download();
    bool same_bits = std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
    std::vector<float> got(a.size());
    for (size_t i = 0; i < a.size(); ++i) got[i] = Widen(a[i]);
    bool matches = true;
    if (first_out.empty()) {
      first_out = got;
    } else {
      for (size_t i = 0; i < got.size() && matches; ++i) {
        matches = std::fabs(got[i] - first_out[i]) <= 2e-2f * (1.0f + std::fabs(first_out[i]));
      }
    }
    const double bwd_ms = MedianMs(o.reps, backward);
    const std::vector<T> da = dqkv.Download();
    backward();
    const std::vector<T> db = dqkv.Download();
    const bool same_grad_bits = std::memcmp(da.data(), db.data(), da.size() * sizeof(T)) == 0;
    std::vector<float> grad(da.size());
    for (size_t i = 0; i < da.size(); ++i) grad[i] = Widen(da[i]);
    if (first_grad.empty()) {
      first_grad = grad;
    } else {
      double scale = 0, worst = 0;  // against the largest gradient: dq and dk hold near-zero cancellations
      for (size_t i = 0; i < grad.size(); ++i) {
        scale = std::max(scale, double(std::fabs(first_grad[i])));
        worst = std::max(worst, double(std::fabs(grad[i] - first_grad[i])));
      }
      matches = matches && worst <= 3e-2 * scale;
    }
    same_bits = same_bits && same_grad_bits;
    Check(cudaDeviceSynchronize(), "attention");
    std::printf(
        "attention: side=pstar kernel=%s B=%lld NH=%lld T=%lld hs=%lld dtype=%s fwd_ms=%.4f fwd_tflops=%.1f "
        "bwd_ms=%.4f bwd_tflops=%.1f same_bits=%s matches=%s\n",
        name, (long long)o.B, (long long)o.NH, (long long)o.T, (long long)o.hs, o.dtype.c_str(), fwd_ms,
        4.0 * flop / (fwd_ms * 1e9), bwd_ms, 10.0 * flop / (bwd_ms * 1e9), same_bits ? "yes" : "no",
        matches ? "yes" : "no");
    if (!same_bits || !matches) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--batch")
      o.B = Positive("--batch", v);
    else if (a == "--heads")
      o.NH = Positive("--heads", v);
    else if (a == "--seq")
      o.T = Positive("--seq", v);
    else if (a == "--head-size")
      o.hs = Positive("--head-size", v);
    else if (a == "--reps")
      o.reps = int(Positive("--reps", v));
    else if (a == "--dtype")
      o.dtype = v;
    else
      Usage();
  }
  if (o.dtype != "bf16" && o.dtype != "fp16") {
    std::fprintf(stderr, "cuda_attention_bench: --dtype: bf16 or fp16, got '%s'\n", o.dtype.c_str());
    return 2;
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 0;
  }
  return o.dtype == "bf16" ? Run<__nv_bfloat16>(o) : Run<__half>(o);
}
