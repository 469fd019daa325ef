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
#include "tests/test_util.h"

namespace pstar::test {

// Usable CUDA devices; 0 when the runtime or the driver cannot be reached.
inline int VisibleGpus() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return devices;
}

// Skips (or, under PSTAR_EXPECT_GPU, fails) a test on a host without a GPU.
#define PSTAR_REQUIRE_GPU() PSTAR_REQUIRE_GPUS_FOUND(1, ::pstar::test::VisibleGpus())

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
