// Helpers for the CUDA kernel tests: skip without a GPU, move vectors to and
// from the device, random inputs and tolerance checks against the CPU kernels.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"

namespace pstar::test {

// Non-empty when no usable CUDA device is present: the reason to skip.
inline std::string NoGpuReason() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (devices == 0) return "no CUDA device";
  return "";
}

#define PSTAR_REQUIRE_GPU()                                          \
  do {                                                               \
    const std::string reason = ::pstar::test::NoGpuReason();         \
    if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;  \
  } while (0)

// Device memory owned for the length of a test.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    void* p = nullptr;
    if (n > 0 && cudaMalloc(&p, size_t(n) * sizeof(T)) != cudaSuccess) p = nullptr;
    data_.reset(static_cast<T*>(p));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(int64_t(host.size())) { Upload(host); }
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(data_.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> out(static_cast<size_t>(n_));
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), data_.get(), out.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  T* get() const { return data_.get(); }
  int64_t size() const { return n_; }

 private:
  struct Free {
    void operator()(T* p) const { cudaFree(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t n_;
};

// Waits for the device and fails the test on an asynchronous error.
inline void SyncOrFail() {
  const cudaError_t e = cudaDeviceSynchronize();
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

}  // namespace pstar::test
