// The kernel tuner: times every candidate of every KernelTuning knob
// (kernels/cuda/tuning.h) on the GPU at hand, at GPT-2 124M's training shapes
// (batch 32 x 1024 tokens, bf16), checks each candidate computes the default's
// values, and prints the winners as rows for kernels/cuda/tuning_table.inc.
// Built with -DPSTAR_CUDA_TUNING=ON; run by `scripts/gpu-session.sh OUT
// --tune`. Without a GPU it says so and exits 0 (the session's dry run).
//
// Prints per knob and candidate:
//   tune: knob=K value=V ms=T (median of R runs) check=ok|FAILED
// then per knob
//   tune: knob=K winner=V default=D speedup=X
// and the table rows of the winners that are not the default:
//   row: {"<cudaDeviceProp::name>", "K", V, "<date>, gpu-session --tune"},
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/classifier.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/pointwise.h"
#include "kernels/cuda/tuning.h"

namespace {

namespace kc = pstar::kernels::cuda;

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda_tuning_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// GPT-2 124M's linear layers (qkv, attn_proj, fc, fc_proj) at batch 32 x
// 1024: the weight- and bias-gradient knobs' shapes.
constexpr int64_t kGpt2Rows = 32 * 1024, kGpt2Width = 768;
struct LinearLayer {
  int64_t in, out;
};
constexpr LinearLayer kGpt2Layers[] = {
    {kGpt2Width, 3 * kGpt2Width}, {kGpt2Width, kGpt2Width}, {kGpt2Width, 4 * kGpt2Width}, {4 * kGpt2Width, kGpt2Width}};

template <typename T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) { Check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc"); }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  std::vector<T> Download(size_t count) const {
    std::vector<T> h(count);
    Check(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

// The median of `reps` timings of run() (CUDA events around it), after
// prepare(), which is not timed, before each.
double MedianMs(int reps, const std::function<void()>& prepare, const std::function<void()>& run) {
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "event");
  Check(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    prepare();
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

// A knob's candidates, the default first: the values the others are checked against.
std::vector<int> DefaultFirst(const kc::TuningKnob& knob, const kc::KernelTuning& defaults) {
  std::vector<int> order = {defaults.*(knob.field)};
  for (int v : knob.candidates) {
    if (v != order[0]) order.push_back(v);
  }
  return order;
}

bool Close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(double(got[i]) - want[i]) <= tol * (1.0 + std::fabs(double(want[i]))))) return false;
  }
  return true;
}

std::vector<float> Widen(const std::vector<__nv_bfloat16>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// Fills n device values with a random pattern of 4M values repeated (timing
// needs realistic values, not 1.6 billion fresh draws on the host).
void FillRandom(__nv_bfloat16* d, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<__nv_bfloat16> pattern(size_t(1) << 22);
  for (auto& x : pattern) x = __float2bfloat16(normal(rng));
  for (size_t at = 0; at < n; at += pattern.size()) {
    const size_t count = std::min(pattern.size(), n - at);
    Check(cudaMemcpy(d + at, pattern.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "upload");
  }
}

// One candidate's timing and whether it computed the default's values.
struct Result {
  int value;
  double ms;
  bool ok;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      const std::string v = argv[++i];
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 1000) {
        std::fprintf(stderr, "cuda_tuning_bench: --reps %s: not a whole number from 1 to 1000\n", v.c_str());
        return 2;
      }
      reps = int(n);
    } else {
      std::fprintf(stderr, "usage: cuda_tuning_bench [--reps N]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("tune: no CUDA device: nothing to time\n");
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "properties");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::printf("tune: device=\"%s\" sm_%d%d reps=%d\n", prop.name, prop.major, prop.minor, reps);
  const std::string table_problem = kc::CheckTuningTable();
  if (!table_problem.empty()) std::printf("tune: the committed table is wrong: %s\n", table_problem.c_str());
  const kc::KernelTuning defaults;
  const kc::KernelTuning current = kc::TuningFor(prop.name, prop.major * 10 + prop.minor);
  std::mt19937 rng(7);
  std::vector<std::string> rows;
  bool all_ok = true;

  auto report = [&](const kc::TuningKnob& knob, const std::vector<Result>& results) {
    const int def = defaults.*(knob.field);
    double def_ms = 0;
    const Result* best = nullptr;
    for (const Result& r : results) {
      std::printf("tune: knob=%s value=%d ms=%.4f check=%s\n", knob.name, r.value, r.ms, r.ok ? "ok" : "FAILED");
      all_ok = all_ok && r.ok;
      if (r.value == def) def_ms = r.ms;
      if (r.ok && (best == nullptr || r.ms < best->ms)) best = &r;
    }
    if (best == nullptr) return;
    std::printf("tune: knob=%s winner=%d default=%d in_table=%d speedup=%.3f\n", knob.name, best->value, def,
                current.*(knob.field), def_ms / best->ms);
    // A candidate replaces the default only when it wins by more than the
    // timing's spread (2%): a closer win is noise, not a reason for a row.
    if (best->value != def && best->ms < 0.98 * def_ms) {
      rows.push_back(std::string("  {\"") + prop.name + "\", \"" + knob.name + "\", " + std::to_string(best->value) +
                     ", \"" + date + ", gpu-session --tune, " + prop.name + "\"},");
    }
  };

  for (const kc::TuningKnob& knob : kc::TuningKnobs()) {
    std::vector<Result> results;
    if (std::string(knob.name) == "cross_entropy_threads" || std::string(knob.name) == "cross_entropy_kernel") {
      // The classifier's loss and dlogits over GPT-2's padded vocabulary:
      // its threads per block, or its loads (the other knob as the table has
      // it).
      const bool threads_knob = std::string(knob.name) == "cross_entropy_threads";
      const int64_t N = 32 * 1024, V = 50257, Vp = 50304;
      const size_t elems = size_t(N * Vp);
      std::vector<int32_t> targets(static_cast<size_t>(N));
      for (auto& t : targets) t = int32_t(rng() % uint32_t(V));
      Device<__nv_bfloat16> pristine(elems), work(elems);
      Device<int32_t> d_targets(targets.size());
      Device<float> losses(static_cast<size_t>(N));
      FillRandom(pristine.p, elems, rng);
      Check(cudaMemcpy(d_targets.p, targets.data(), targets.size() * 4, cudaMemcpyHostToDevice), "upload");
      std::vector<float> want_losses, want_rows;
      const size_t check = size_t(64 * Vp);  // the first 64 rows of dlogits
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        const double ms = MedianMs(
            reps, [&] { Check(cudaMemcpy(work.p, pristine.p, elems * 2, cudaMemcpyDeviceToDevice), "copy"); },
            [&] {
              kc::CrossEntropy(losses.p, work.p, d_targets.p, 1.0f / float(N), true, N, V, Vp, nullptr,
                               threads_knob ? v : current.cross_entropy_threads,
                               kc::CrossEntropyKernel(threads_knob ? current.cross_entropy_kernel : v));
            });
        Check(cudaDeviceSynchronize(), "cross-entropy");
        const std::vector<float> got_losses = losses.Download(size_t(N));
        const std::vector<float> got_rows = Widen(work.Download(check));
        if (want_losses.empty()) want_losses = got_losses, want_rows = got_rows;
        results.push_back({v, ms, Close(got_losses, want_losses, 1e-5) && Close(got_rows, want_rows, 1e-2)});
      }
    } else if (std::string(knob.name) == "bias_grad_group_rows") {
      // The bias gradients of GPT-2's qkv, attn_proj/fc_proj and fc layers.
      const int64_t N = 32 * 1024;
      const int64_t widths[] = {2304, 768, 3072};
      Device<__nv_bfloat16> dout(size_t(N * 3072));
      FillRandom(dout.p, dout.n, rng);
      Device<float> scratch(size_t(kc::BiasGradientScratchElements(N, 3072))), dbias(3072);
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        const double ms = MedianMs(
            reps, [&] { Check(cudaMemset(dbias.p, 0, 3072 * sizeof(float)), "memset"); },
            [&] {
              for (int64_t oc : widths) {
                kc::AddBiasGradient<float, __nv_bfloat16>(dbias.p, scratch.p, dout.p, N, oc, nullptr, v);
              }
            });
        Check(cudaDeviceSynchronize(), "bias gradient");
        const std::vector<float> got = dbias.Download(3072);
        if (want.empty()) want = got;
        results.push_back({v, ms, Close(got, want, 1e-4)});
      }
    } else if (std::string(knob.name) == "attention_forward" || std::string(knob.name) == "attention_backward") {
      // GPT-2 124M's attention (batch 32, 12 heads of 64, T 1024), a head
      // size of 128 (batch 4, 32 heads, T 2048) and Llama 3.2 1B's grouped
      // heads (batch 4, 32 query heads of 64 on 8 key/value heads, T 2048),
      // summed; forward, or backward with 16-bit gradients.
      struct Case {
        int64_t B, T, NH, NKV, hs;
        pstar::kernels::AttentionShape shape() const { return {B, T, NH, NKV, hs}; }
      };
      const Case cases[] = {{32, 1024, 12, 12, 64}, {4, 2048, 32, 32, 128}, {4, 2048, 32, 8, 64}};
      const bool forward = std::string(knob.name) == "attention_forward";
      std::vector<std::unique_ptr<Device<__nv_bfloat16>>> qkv, out, dout, dqkv;
      std::vector<std::unique_ptr<Device<float>>> lse, scratch;
      for (const Case& c : cases) {
        const size_t n = size_t(c.B * c.T * c.NH * c.hs), rows = size_t(c.B * c.T * c.shape().RowElements());
        qkv.push_back(std::make_unique<Device<__nv_bfloat16>>(rows));
        FillRandom(qkv.back()->p, qkv.back()->n, rng);
        out.push_back(std::make_unique<Device<__nv_bfloat16>>(n));
        lse.push_back(std::make_unique<Device<float>>(size_t(c.B * c.NH * c.T)));
        if (!forward) {
          dout.push_back(std::make_unique<Device<__nv_bfloat16>>(n));
          FillRandom(dout.back()->p, n, rng);
          dqkv.push_back(std::make_unique<Device<__nv_bfloat16>>(rows));
          scratch.push_back(std::make_unique<Device<float>>(
              size_t(kc::AttentionScratchElements(c.shape(), kc::AttentionBackwardKernel::kMmaOnePass))));
          kc::AttentionForward(out.back()->p, lse.back()->p, qkv.back()->p, c.shape(), nullptr);
        }
      }
      // cuDNN's graph (attention_forward 4, attention_backward 6) with the
      // workspace a training step gives it: the planned attention scratch
      // (KernelScratchBytes' attention term), so it runs in the same batch
      // slices as there.
      const int cudnn_value =
          forward ? int(kc::AttentionForwardKernel::kCudnn) : int(kc::AttentionBackwardKernel::kCudnn);
      std::string cudnn_why;
      std::unique_ptr<kc::CudnnAttention> cudnn = kc::CudnnAttention::Open(&cudnn_why);
      std::vector<std::unique_ptr<Device<char>>> workspace;
      for (const Case& c : cases) {
        workspace.push_back(std::make_unique<Device<char>>(
            size_t(pstar::kernels::GpuAttentionScratchElements(c.B, c.T, c.NH * c.hs, c.NH, true) * 4)));
      }
      auto run_cudnn = [&](size_t k) {
        const Case& c = cases[k];
        return forward ? cudnn->Forward(true, out[k]->p, lse[k]->p, qkv[k]->p, c.shape(), nullptr, workspace[k]->p,
                                        workspace[k]->n)
                       : cudnn->Backward(true, dqkv[k]->p, dout[k]->p, qkv[k]->p, out[k]->p, lse[k]->p, c.shape(),
                                         nullptr, workspace[k]->p, workspace[k]->n);
      };
      if (cudnn != nullptr) {
        for (size_t k = 0; k < std::size(cases) && cudnn != nullptr; ++k) {
          if (!run_cudnn(k)) {  // builds the plans before the timing
            cudnn_why = cudnn->last_error();
            cudnn.reset();
          }
        }
        Check(cudaDeviceSynchronize(), "cuDNN attention");
      }
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        if (v == cudnn_value && cudnn == nullptr) {
          std::printf("tune: knob=%s value=%d skipped: %s\n", knob.name, v, cudnn_why.c_str());
          continue;
        }
        const double ms = MedianMs(
            reps, [] {},
            [&] {
              for (size_t k = 0; k < std::size(cases); ++k) {
                const Case& c = cases[k];
                if (v == cudnn_value) {
                  if (!run_cudnn(k)) {
                    std::fprintf(stderr, "tune: %s\n", cudnn->last_error().c_str());
                    std::exit(1);
                  }
                } else if (forward) {
                  kc::AttentionForward(out[k]->p, lse[k]->p, qkv[k]->p, c.shape(), nullptr,
                                       kc::AttentionForwardKernel(v));
                } else {
                  kc::AttentionBackward<__nv_bfloat16, __nv_bfloat16>(
                      dqkv[k]->p, scratch[k]->p, dout[k]->p, qkv[k]->p, out[k]->p, lse[k]->p, c.shape(), nullptr,
                      kc::AttentionBackwardKernel(v));
                }
              }
            });
        Check(cudaDeviceSynchronize(), forward ? "attention forward" : "attention backward");
        std::vector<float> got;
        for (size_t k = 0; k < std::size(cases); ++k) {
          const std::vector<float> o = Widen((forward ? out[k] : dqkv[k])->Download(size_t(64 * 1024)));
          got.insert(got.end(), o.begin(), o.end());
        }
        if (want.empty()) want = got;
        results.push_back({v, ms, Close(got, want, 2e-2)});
      }
    } else if (std::string(knob.name) == "weight_grad_gemm_algo") {
      // GPT-2 124M's four weight gradients per layer at batch 32 x 1024 in
      // bf16 (qkv, attn_proj, fc, fc_proj), with the bias gradient as the
      // table has it (in the epilogue or not): cuBLASLt's heuristic's
      // candidate of each rank.
      const int64_t N = kGpt2Rows, C = kGpt2Width;
      Device<__nv_bfloat16> x(size_t(N * 4 * C)), dy(size_t(N * 4 * C));
      FillRandom(x.p, x.n, rng);
      FillRandom(dy.p, dy.n, rng);
      Device<float> dw(size_t(4 * C * C)), sum(size_t(4 * C));
      kc::BlasContext blas;
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        const double ms = MedianMs(
            reps, [&] { Check(cudaMemset(dw.p, 0, dw.n * sizeof(float)), "memset"); },
            [&] {
              for (const LinearLayer& l : kGpt2Layers) {
                if (current.bias_grad_epilogue == 1 &&
                    kc::MatmulBackwardWeightBiasGrad(blas, dw.p, sum.p, dy.p, x.p, N, l.in, l.out, nullptr, v)) {
                  continue;
                }
                kc::MatmulBackwardWeight<__nv_bfloat16, float>(blas, dw.p, dy.p, x.p, N, l.in, l.out, nullptr, v);
              }
            });
        Check(cudaDeviceSynchronize(), "weight gradient algorithms");
        const std::vector<float> got = dw.Download(size_t(64 * C));
        if (want.empty()) want = got;
        results.push_back({v, ms, Close(got, want, 1e-3)});
      }
    } else if (std::string(knob.name) == "layernorm_backward_kernel") {
      // GPT-2 124M's LayerNorm backward at batch 32 x 1024 in bf16: fp32
      // dinp accumulated, 16-bit dout and input, dinp's 16-bit copy; and the
      // RMSNorm backward the knob also picks the row kernel of, at Llama 3.2
      // 1B's width (2048) over as many elements.
      const int64_t N = 32 * 1024, C = 768;
      Device<__nv_bfloat16> x(size_t(N * C)), dy(size_t(N * C)), copy(size_t(N * C)), h(size_t(N + C));
      FillRandom(x.p, x.n, rng);
      FillRandom(dy.p, dy.n, rng);
      FillRandom(h.p, h.n, rng);
      // fp32 statistics and weight, from 16-bit random values: |mean| < 1,
      // rstd in [1, 2), weight in [0.5, 1.5).
      std::vector<float> host = Widen(h.Download(h.n)), mean_rstd(size_t(2 * N)), weight(static_cast<size_t>(C));
      for (int64_t i = 0; i < N; ++i)
        mean_rstd[size_t(i)] = host[size_t(i)], mean_rstd[size_t(N + i)] = 1.5f + 0.5f * host[size_t(i)];
      for (int64_t c = 0; c < C; ++c) weight[size_t(c)] = 1.0f + 0.5f * host[size_t(N + c)];
      Device<float> stats(size_t(2 * N)), w(static_cast<size_t>(C)), dinp(size_t(N * C)), dw(static_cast<size_t>(C)),
          db(static_cast<size_t>(C)),
          scratch(size_t(std::max(kc::LayerNormBackwardScratchElements(N, C),
                                  kc::RmsNormBackwardScratchElements(32 * 1024 * 768 / 2048, 2048))));
      Check(cudaMemcpy(stats.p, mean_rstd.data(), mean_rstd.size() * 4, cudaMemcpyHostToDevice), "upload");
      Check(cudaMemcpy(w.p, weight.data(), weight.size() * 4, cudaMemcpyHostToDevice), "upload");
      // RMSNorm's rows over the same elements (its rstd the first kRmsRows of
      // LayerNorm's), and its weight a repeat of LayerNorm's.
      constexpr int64_t kRmsWidth = 2048, kRmsRows = 32 * 1024 * 768 / kRmsWidth;
      std::vector<float> rms_weight(static_cast<size_t>(kRmsWidth));
      for (int64_t c = 0; c < kRmsWidth; ++c) rms_weight[size_t(c)] = weight[size_t(c % C)];
      Device<float> rms_w(static_cast<size_t>(kRmsWidth)), rms_dinp(static_cast<size_t>(kRmsRows * kRmsWidth)),
          rms_dw(static_cast<size_t>(kRmsWidth));
      Check(cudaMemcpy(rms_w.p, rms_weight.data(), rms_weight.size() * 4, cudaMemcpyHostToDevice), "upload");
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        const double ms = MedianMs(
            reps,
            [&] {
              Check(cudaMemset(dinp.p, 0, dinp.n * sizeof(float)), "memset");
              Check(cudaMemset(dw.p, 0, dw.n * sizeof(float)), "memset");
              Check(cudaMemset(db.p, 0, db.n * sizeof(float)), "memset");
              Check(cudaMemset(rms_dinp.p, 0, rms_dinp.n * sizeof(float)), "memset");
              Check(cudaMemset(rms_dw.p, 0, rms_dw.n * sizeof(float)), "memset");
            },
            [&] {
              kc::LayerNormBackward<float, __nv_bfloat16, __nv_bfloat16>(dinp.p, dw.p, db.p, scratch.p, dy.p, x.p, w.p,
                                                                         stats.p, stats.p + N, N, C, nullptr, copy.p,
                                                                         kc::LayerNormKernel(v));
              kc::RmsNormBackward<__nv_bfloat16, __nv_bfloat16>(rms_dinp.p, rms_dw.p, scratch.p, dy.p, x.p, rms_w.p,
                                                                stats.p + N, kRmsRows, kRmsWidth, nullptr, copy.p,
                                                                kc::LayerNormKernel(v));
            });
        Check(cudaDeviceSynchronize(), "layernorm backward");
        std::vector<float> got = dinp.Download(size_t(64 * C));
        const std::vector<float> g = dw.Download(dw.n);
        got.insert(got.end(), g.begin(), g.end());
        const std::vector<float> r = rms_dw.Download(rms_dw.n);
        got.insert(got.end(), r.begin(), r.end());
        if (want.empty()) want = got;
        results.push_back({v, ms, Close(got, want, 1e-3)});
      }
    } else if (std::string(knob.name) == "gelu_backward_epilogue") {
      // GPT-2 124M's fc_proj input gradient at batch 32 x 1024 in bf16 with
      // GELU's backward: its own kernel after the GEMM (0) or in cuBLASLt's
      // DGELU epilogue (1).
      const int64_t N = 32 * 1024, C = 768, H = 4 * C;
      Device<__nv_bfloat16> w_proj(size_t(C * H)), dy(size_t(N * C)), pre(size_t(N * H)), dpre(size_t(N * H));
      for (auto* d : {&w_proj, &dy, &pre}) FillRandom(d->p, d->n, rng);
      kc::BlasContext blas;
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        bool taken = true;
        const double ms = MedianMs(
            reps, [] {},
            [&] {
              if (v == 1 && kc::MatmulBackwardInputGelu(blas, dpre.p, dy.p, w_proj.p, pre.p, N, H, C, nullptr)) return;
              taken = v == 0;
              kc::MatmulBackwardInput<__nv_bfloat16, __nv_bfloat16>(blas, dpre.p, dy.p, w_proj.p, N, H, C, nullptr);
              kc::GeluBackward(dpre.p, pre.p, dpre.p, N * H, nullptr);
            });
        Check(cudaDeviceSynchronize(), "gelu backward epilogue");
        if (!taken) std::printf("tune: knob=%s value=%d: cuBLASLt does not take the epilogue here\n", knob.name, v);
        const std::vector<float> got = Widen(dpre.Download(size_t(64 * H)));
        if (want.empty()) want = got;
        results.push_back({v, ms, taken && Close(got, want, 2e-2)});
      }
    } else if (std::string(knob.name) == "bias_grad_epilogue") {
      // GPT-2 124M's weight and bias gradients at batch 32 x 1024 in bf16
      // (qkv, attn_proj/fc_proj, fc): the bias gradient in its own two
      // passes (0) or in the weight GEMM's BGRADB epilogue plus an add (1).
      const int64_t N = kGpt2Rows, C = kGpt2Width;
      Device<__nv_bfloat16> x(size_t(N * 4 * C)), dy(size_t(N * 4 * C));
      FillRandom(x.p, x.n, rng);
      FillRandom(dy.p, dy.n, rng);
      Device<float> dw(size_t(4 * C * C)), dbias(size_t(4 * C)), sum(size_t(4 * C));
      Device<float> scratch(size_t(kc::BiasGradientScratchElements(N, 4 * C)));
      kc::BlasContext blas;
      std::vector<float> want;
      const std::vector<int> order = DefaultFirst(knob, defaults);
      for (int v : order) {
        bool taken = true;
        const double ms = MedianMs(
            reps,
            [&] {
              Check(cudaMemset(dw.p, 0, dw.n * sizeof(float)), "memset");
              Check(cudaMemset(dbias.p, 0, dbias.n * sizeof(float)), "memset");
            },
            [&] {
              for (const LinearLayer& l : kGpt2Layers) {
                if (v == 1 &&
                    kc::MatmulBackwardWeightBiasGrad(blas, dw.p, sum.p, dy.p, x.p, N, l.in, l.out, nullptr)) {
                  kc::ResidualForward<float, float>(dbias.p, dbias.p, sum.p, l.out, nullptr);
                  continue;
                }
                taken = taken && v == 0;
                kc::MatmulBackwardWeight<__nv_bfloat16, float>(blas, dw.p, dy.p, x.p, N, l.in, l.out, nullptr);
                kc::AddBiasGradient<float, __nv_bfloat16>(dbias.p, scratch.p, dy.p, N, l.out, nullptr,
                                                          current.bias_grad_group_rows);
              }
            });
        Check(cudaDeviceSynchronize(), "bias gradient epilogue");
        if (!taken) std::printf("tune: knob=%s value=%d: cuBLASLt does not take the epilogue here\n", knob.name, v);
        std::vector<float> got = dbias.Download(dbias.n);
        const std::vector<float> w = dw.Download(size_t(64 * C));
        got.insert(got.end(), w.begin(), w.end());
        if (want.empty()) want = got;
        results.push_back({v, ms, taken && Close(got, want, 1e-3)});
      }
    } else {
      std::printf("tune: knob=%s has no timing here\n", knob.name);
      all_ok = false;
      continue;
    }
    report(knob, results);
  }
  if (rows.empty()) std::printf("tune: every default won on this GPU: no rows to add\n");
  for (const std::string& r : rows) std::printf("row: %s\n", r.c_str());
  std::printf("tune: %s\n", all_ok ? "every candidate computed the default's values" : "a check FAILED");
  return all_ok ? 0 : 1;
}
