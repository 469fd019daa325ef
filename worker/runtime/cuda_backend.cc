#include "worker/runtime/cuda_backend.h"

#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <string>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/pointwise.h"
#include "worker/core/bytes.h"

namespace pstar {

namespace {

constexpr int kNumStreams = 4;

const char* StreamName(StreamKind stream) {
  switch (stream) {
    case StreamKind::kCompute: return "compute";
    case StreamKind::kHostToDevice: return "host-to-device";
    case StreamKind::kDeviceToHost: return "device-to-host";
    case StreamKind::kComm: return "comm";
  }
  return "unknown";
}

std::string BytesText(size_t bytes) {
  return std::to_string(bytes) + " bytes (" + FormatBytes(int64_t(bytes)) + ")";
}

// cudaGetDeviceCount, leaving no error behind for the next caller of
// cudaGetLastError (the kernels' launch check).
cudaError_t DeviceCount(int* count) {
  *count = 0;
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *count = 0;
  }
  return e;
}

void FreeDevice(std::byte* p) { cudaFree(p); }
void FreePinned(std::byte* p) { cudaFreeHost(p); }

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

cudaEvent_t Native(const Event& event) { return static_cast<const CudaEvent&>(event).get(); }

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(int device, std::string device_name) : device_(device), device_name_(std::move(device_name)) {}

  ~CudaBackend() override {
    cudaSetDevice(device_);
    for (cudaStream_t s : streams_) {
      if (s == nullptr) continue;
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Status CreateStreams() {
    for (cudaStream_t& s : streams_) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
        cudaGetLastError();
        s = nullptr;
        return Status::Internal("cannot create a stream on " + Where() + ": " + cudaGetErrorString(e));
      }
    }
    return Status::Ok();
  }

  const char* name() const override { return "cuda"; }
  bool device_is_host_memory() const override { return false; }

  Result<MemoryBlock> AllocateDevice(size_t bytes) override {
    if (bytes == 0) return MemoryBlock();
    cudaSetDevice(device_);
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it
      size_t free_bytes = 0, total_bytes = 0;
      std::string room;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        room = " (" + FormatBytes(int64_t(free_bytes)) + " free of " + FormatBytes(int64_t(total_bytes)) + ")";
      } else {
        cudaGetLastError();
      }
      return Status::ResourceExhausted("cannot allocate " + BytesText(bytes) + " of device memory on " + Where() +
                                       room + ": " + cudaGetErrorString(e));
    }
    return MemoryBlock(static_cast<std::byte*>(p), bytes, FreeDevice);
  }

  Result<MemoryBlock> AllocateHost(size_t bytes) override {
    if (bytes == 0) return MemoryBlock();
    cudaSetDevice(device_);
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); e != cudaSuccess) {
      cudaGetLastError();
      return Status::ResourceExhausted("cannot allocate " + BytesText(bytes) + " of pinned host memory for " +
                                       Where() + ": " + cudaGetErrorString(e));
    }
    return MemoryBlock(static_cast<std::byte*>(p), bytes, FreePinned);
  }

  void Copy(void* dst, const void* src, size_t bytes, StreamKind stream) override {
    if (bytes == 0) return;
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Stream(stream)), "cudaMemcpyAsync", stream);
    kernels::cuda::SyncCheck("cudaMemcpyAsync");
  }

  void Zero(void* dst, size_t bytes, StreamKind stream) override {
    if (bytes == 0) return;
    Note(cudaMemsetAsync(dst, 0, bytes, Stream(stream)), "cudaMemsetAsync", stream);
    kernels::cuda::SyncCheck("cudaMemsetAsync");
  }

  void CopyNarrowed(uint16_t* host_dst, const float* device_src, int64_t n, HalfFormat format, void* staging,
                    StreamKind stream) override {
    if (n <= 0) return;
    cudaSetDevice(device_);
    if (format == HalfFormat::kBf16) {
      kernels::cuda::Convert(static_cast<kernels::cuda::bf16*>(staging), device_src, n, Stream(stream));
    } else {
      kernels::cuda::Convert(static_cast<kernels::cuda::fp16*>(staging), device_src, n, Stream(stream));
    }
    Copy(host_dst, staging, size_t(n) * sizeof(uint16_t), stream);
  }

  void CopyWidened(float* device_dst, const uint16_t* host_src, int64_t n, HalfFormat format, void* staging,
                   StreamKind stream) override {
    if (n <= 0) return;
    cudaSetDevice(device_);
    Copy(staging, host_src, size_t(n) * sizeof(uint16_t), stream);
    if (format == HalfFormat::kBf16) {
      kernels::cuda::Convert(device_dst, static_cast<const kernels::cuda::bf16*>(staging), n, Stream(stream));
    } else {
      kernels::cuda::Convert(device_dst, static_cast<const kernels::cuda::fp16*>(staging), n, Stream(stream));
    }
  }

  void Narrow(uint16_t* device_dst, const float* device_src, int64_t n, HalfFormat format,
              StreamKind stream) override {
    if (n <= 0) return;
    cudaSetDevice(device_);
    if (format == HalfFormat::kBf16) {
      kernels::cuda::Convert(reinterpret_cast<kernels::cuda::bf16*>(device_dst), device_src, n, Stream(stream));
    } else {
      kernels::cuda::Convert(reinterpret_cast<kernels::cuda::fp16*>(device_dst), device_src, n, Stream(stream));
    }
  }

  std::unique_ptr<Event> CreateEvent() override {
    cudaSetDevice(device_);
    cudaEvent_t e = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
      // Kept for CheckErrors; the null event makes Record and the waits no-ops.
      Note(err, "cudaEventCreateWithFlags", StreamKind::kCompute);
      e = nullptr;
    }
    return std::make_unique<CudaEvent>(e);
  }

  std::unique_ptr<Event> CreateTimingEvent() override {
    cudaSetDevice(device_);
    cudaEvent_t e = nullptr;
    if (cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
      Note(err, "cudaEventCreate", StreamKind::kCompute);
      e = nullptr;
    }
    return std::make_unique<CudaEvent>(e);
  }

  double ElapsedSeconds(const Event& start, const Event& end) override {
    if (Native(start) == nullptr || Native(end) == nullptr) return 0.0;
    if (cudaError_t e = cudaEventSynchronize(Native(end)); e != cudaSuccess) {
      Note(e, "cudaEventSynchronize", StreamKind::kCompute);
      return 0.0;
    }
    float ms = 0.0f;
    if (cudaError_t e = cudaEventElapsedTime(&ms, Native(start), Native(end)); e != cudaSuccess) {
      Note(e, "cudaEventElapsedTime", StreamKind::kCompute);
      return 0.0;
    }
    return double(ms) * 1e-3;
  }

  void Record(Event& event, StreamKind stream) override {
    if (Native(event) == nullptr) return;
    Note(cudaEventRecord(Native(event), Stream(stream)), "cudaEventRecord", stream);
  }

  void StreamWait(StreamKind stream, const Event& event) override {
    if (Native(event) == nullptr) return;
    Note(cudaStreamWaitEvent(Stream(stream), Native(event), 0), "cudaStreamWaitEvent", stream);
  }

  void BindThread() override { Note(cudaSetDevice(device_), "cudaSetDevice", StreamKind::kCompute); }

  void Synchronize(const Event& event) override {
    if (Native(event) == nullptr) return;
    Note(cudaEventSynchronize(Native(event)), "cudaEventSynchronize", StreamKind::kCompute);
  }

  Status CheckErrors() override {
    // A fault of earlier work shows in any later call on the context; querying
    // each stream finds it without waiting.
    for (int s = 0; s < kNumStreams; ++s) {
      const cudaError_t e = cudaStreamQuery(streams_[size_t(s)]);
      if (e != cudaSuccess && e != cudaErrorNotReady) Note(e, "cudaStreamQuery", StreamKind(s));
    }
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

  void* stream_handle(StreamKind stream) override { return static_cast<void*>(Stream(stream)); }

 private:
  cudaStream_t Stream(StreamKind stream) const { return streams_[size_t(stream)]; }

  std::string Where() const {
    return "CUDA device " + std::to_string(device_) + (device_name_.empty() ? "" : " (" + device_name_ + ")");
  }

  // Keeps the first failure; clears the thread's last error so that the
  // kernels' launch check does not report it as theirs.
  void Note(cudaError_t e, const char* call, StreamKind stream) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_.ok()) return;
    first_error_ = Status::Internal(Where() + ": " + call + " on the " + StreamName(stream) +
                                    " stream failed: " + cudaGetErrorString(e));
  }

  const int device_;
  const std::string device_name_;
  std::array<cudaStream_t, kNumStreams> streams_{};
  std::mutex mu_;
  Status first_error_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  DeviceCount(&count);
  return count;
}

int64_t CudaDeviceMemoryBytes(int device_ordinal) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_ordinal) != cudaSuccess) {
    cudaGetLastError();  // not sticky: keep it from being blamed on a later launch
    return 0;
  }
  return int64_t(prop.totalGlobalMem);
}

std::string CudaDeviceName(int device_ordinal) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_ordinal) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

int CudaComputeCapability(int device_ordinal) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_ordinal) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return prop.major * 10 + prop.minor;
}

Result<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int device_ordinal) {
  int count = 0;
  if (cudaError_t e = DeviceCount(&count); e != cudaSuccess || count == 0) {
    return Status::FailedPrecondition("no CUDA device: " +
                                      std::string(e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device_ordinal) + " does not exist (" +
                                   std::to_string(count) + " visible)");
  }
  if (cudaError_t e = cudaSetDevice(device_ordinal); e != cudaSuccess) {
    cudaGetLastError();
    return Status::FailedPrecondition("cannot use CUDA device " + std::to_string(device_ordinal) + ": " +
                                      cudaGetErrorString(e));
  }
  cudaDeviceProp prop{};
  std::string device_name;
  if (cudaGetDeviceProperties(&prop, device_ordinal) == cudaSuccess) {
    device_name = prop.name;
  } else {
    cudaGetLastError();
  }
  auto backend = std::make_unique<CudaBackend>(device_ordinal, std::move(device_name));
  PSTAR_RETURN_IF_ERROR(backend->CreateStreams());
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

}  // namespace pstar
