#include "worker/optim/adam.h"

#include <cmath>
#include <optional>
#include <vector>

#include "kernels/adam.h"
#include "kernels/reduce.h"
#include "worker/runtime/nvtx_range.h"
#ifdef PSTAR_WITH_CUDA
#include "kernels/cuda/adam.h"
#endif

namespace pstar {

void AdamOptimizer::Step(ParamStore& store, float lr, float grad_scale) {
  ++step_;
  kernels::cpu::AdamParams p{};
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.grad_scale = grad_scale;
  p.bias_correction1 = float(1.0 - std::pow(double(config_.beta1), double(step_)));
  p.bias_correction2 = float(1.0 - std::pow(double(config_.beta2), double(step_)));
  const ParamLayout& layout = store.layout();
  DeviceBackend& backend = store.chunks().backend();
  const std::optional<HalfFormat> grad_home = store.chunks().options().grad_home;
  const kernels::cpu::HalfType half_type =
      grad_home == HalfFormat::kFp16 ? kernels::cpu::HalfType::kFloat16 : kernels::cpu::HalfType::kBFloat16;
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    ParamStore::ChunkUpdate u = store.AcquireForUpdate(c);
    // The hybrid placement: chunks whose moments live on a GPU update there,
    // on the compute stream; the rest on the host, here.
    const bool on_gpu = u.tier() == Tier::kDevice && !backend.device_is_host_memory();
    // This rank's slices of the chunk's tensors lie back to back in its shard,
    // so each run with the same weight decay is one contiguous span and one
    // kernel call.
    const std::vector<TensorId>& tensors = layout.chunk_tensors(c);
    size_t first = 0;
    while (first < tensors.size()) {
      const ParamStore::Slice s = store.OwnedSlice(tensors[first]);
      if (s.begin == s.end) {
        ++first;
        continue;
      }
      const bool decayed = layout.spec(tensors[first]).decayed();
      const int64_t begin = s.shard_offset;
      int64_t end = begin + (s.end - s.begin);
      size_t last = first + 1;
      while (last < tensors.size() && layout.spec(tensors[last]).decayed() == decayed) {
        const ParamStore::Slice next = store.OwnedSlice(tensors[last]);
        if (next.begin == next.end || next.shard_offset != end) break;
        end += next.end - next.begin;
        ++last;
      }
      const float wd = decayed ? config_.weight_decay : 0.0f;
      p.decoupled_weight_decay = config_.decoupled_weight_decay ? wd : 0.0f;
      p.l2_weight_decay = config_.decoupled_weight_decay ? 0.0f : wd;
      if (on_gpu) {
#ifdef PSTAR_WITH_CUDA
        kernels::cuda::AdamUpdate<float>(u.param() + begin, nullptr, u.grad() + begin, u.exp_avg() + begin,
                                         u.exp_avg_sq() + begin, end - begin, p,
                                         static_cast<cudaStream_t>(backend.stream_handle(StreamKind::kCompute)));
#endif
      } else if (u.grad_half() != nullptr) {
        // 16-bit gradient homes, widened exactly as the kernel reads them.
        kernels::cpu::AdamUpdate(u.param() + begin, u.grad_half() + begin, half_type, u.exp_avg() + begin,
                                 u.exp_avg_sq() + begin, end - begin, p);
      } else {
        kernels::cpu::AdamUpdate(u.param() + begin, u.grad() + begin, u.exp_avg() + begin,
                                 u.exp_avg_sq() + begin, end - begin, p);
      }
      first = last;
    }
  }
}

Result<double> GradientNorm(ParamStore& store, ModelKernels& ops) {
  const ParamLayout& layout = store.layout();
  const bool host_reads_device = store.chunks().backend().device_is_host_memory();
  // One sum per owned tensor slice, taken where the gradient lies (both
  // kernels add in the same order), then added up in layout order.
  std::vector<double> sums;
  std::vector<ModelKernels::Span> on_device;
  std::vector<size_t> on_device_index;
  for (int32_t c = 0; c < layout.num_chunks(); ++c) {
    const ChunkManager::CurrentCopy shard = store.CurrentShard(StateKind::kGrad, c);
    for (TensorId id : layout.chunk_tensors(c)) {
      const ParamStore::Slice s = store.OwnedSlice(id);
      const ModelKernels::Span span{shard.data + s.shard_offset, s.end - s.begin};
      if (shard.on_device && !host_reads_device) {
        on_device.push_back(span);
        on_device_index.push_back(sums.size());
        sums.push_back(0.0);
      } else {
        sums.push_back(kernels::cpu::SumOfSquares(span.data, span.n));
      }
    }
  }
  if (!on_device.empty()) {
    std::vector<double> device_sums(on_device.size());
    ops.SumsOfSquares(on_device, device_sums.data());
    for (size_t i = 0; i < on_device.size(); ++i) sums[on_device_index[i]] = device_sums[i];
  }
  double sum = 0.0;
  for (double s : sums) sum += s;
  if (store.world_size() > 1) {
    NvtxRange range("all_reduce");
    PSTAR_RETURN_IF_ERROR(store.comm()->AllReduceSum(&sum, 1));
  }
  return std::sqrt(sum);
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace pstar
