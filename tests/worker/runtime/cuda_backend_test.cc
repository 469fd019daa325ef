// The CUDA backend on a real GPU: where its blocks live, copies ordered
// across streams by events, fills, the chunk runtime moving data through it
// bit for bit, and failures reported as Status. Every test that needs a GPU
// skips, saying so, where none is present.
#include "worker/runtime/cuda_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/pointwise.h"
#include "tests/test_util.h"
#include "worker/runtime/chunk_manager.h"

namespace pstar {
namespace {

#define PSTAR_REQUIRE_CUDA_DEVICE() PSTAR_REQUIRE_GPUS_FOUND(1, CudaDeviceCount())

std::unique_ptr<DeviceBackend> Backend() {
  auto b = MakeCudaBackend(0);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? std::move(b).value() : nullptr;
}

cudaMemoryType MemoryType(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  return attr.type;
}

float* Floats(const MemoryBlock& block) { return reinterpret_cast<float*>(block.data()); }

TEST(CudaBackend, BlocksLiveOnTheDeviceAndInPinnedHostMemory) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  EXPECT_STREQ(b->name(), "cuda");
  EXPECT_FALSE(b->device_is_host_memory());

  auto dev = b->AllocateDevice(3 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().message();
  ASSERT_NE(dev->data(), nullptr);
  EXPECT_EQ(dev->bytes(), size_t(3) << 20);
  EXPECT_EQ(MemoryType(dev->data()), cudaMemoryTypeDevice);

  auto host = b->AllocateHost(1 << 20);
  ASSERT_TRUE(host.ok()) << host.status().message();
  ASSERT_NE(host->data(), nullptr);
  EXPECT_EQ(MemoryType(host->data()), cudaMemoryTypeHost);  // page-locked, known to CUDA
  std::memset(host->data(), 0x5a, host->bytes());          // and ordinary host memory

  auto none = b->AllocateDevice(0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->data(), nullptr);

  // Four distinct non-blocking streams.
  std::vector<void*> handles;
  for (StreamKind s : {StreamKind::kCompute, StreamKind::kHostToDevice, StreamKind::kDeviceToHost,
                       StreamKind::kComm}) {
    void* h = b->stream_handle(s);
    ASSERT_NE(h, nullptr);
    for (void* other : handles) EXPECT_NE(h, other);
    handles.push_back(h);
    unsigned flags = 0;
    ASSERT_EQ(cudaStreamGetFlags(static_cast<cudaStream_t>(h), &flags), cudaSuccess);
    EXPECT_EQ(flags & cudaStreamNonBlocking, unsigned(cudaStreamNonBlocking));
  }
  EXPECT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
}

TEST(CudaBackend, EventsOrderHostToDeviceComputeAndDeviceToHost) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  // Large enough that an unordered stream would overtake the one it follows.
  const int64_t n = int64_t(16) << 20;
  const size_t bytes = size_t(n) * sizeof(float);
  auto src = b->AllocateHost(bytes);
  auto dst = b->AllocateHost(bytes);
  auto dev = b->AllocateDevice(2 * bytes);
  ASSERT_TRUE(src.ok() && dst.ok() && dev.ok());
  float* in = Floats(*src);
  float* out = Floats(*dst);
  for (int64_t i = 0; i < n; ++i) in[i] = float(i % 4099) * 0.5f;
  std::memset(out, 0xff, bytes);
  float* x = Floats(*dev);
  float* y = x + n;

  auto uploaded = b->CreateEvent();
  auto computed = b->CreateEvent();
  auto downloaded = b->CreateEvent();
  b->Copy(x, in, bytes, StreamKind::kHostToDevice);
  b->Record(*uploaded, StreamKind::kHostToDevice);
  b->StreamWait(StreamKind::kCompute, *uploaded);
  kernels::cuda::ResidualForward<float>(y, x, x, n, static_cast<cudaStream_t>(b->stream_handle(StreamKind::kCompute)));
  b->Record(*computed, StreamKind::kCompute);
  b->StreamWait(StreamKind::kDeviceToHost, *computed);
  b->Copy(out, y, bytes, StreamKind::kDeviceToHost);
  b->Record(*downloaded, StreamKind::kDeviceToHost);
  b->Synchronize(*downloaded);
  ASSERT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * in[i]) << "element " << i;
}

TEST(CudaBackend, ZeroFillsExactlyTheRange) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  const size_t bytes = size_t(4) << 20, begin = 12345, count = (size_t(1) << 20) + 77;
  auto host = b->AllocateHost(bytes);
  auto dev = b->AllocateDevice(bytes);
  ASSERT_TRUE(host.ok() && dev.ok());
  std::memset(host->data(), 0xab, bytes);
  auto done = b->CreateEvent();
  b->Copy(dev->data(), host->data(), bytes, StreamKind::kHostToDevice);
  b->Zero(dev->data() + begin, count, StreamKind::kHostToDevice);
  b->Copy(host->data(), dev->data(), bytes, StreamKind::kHostToDevice);  // same stream: in order
  b->Record(*done, StreamKind::kHostToDevice);
  b->Synchronize(*done);
  ASSERT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
  const auto* p = reinterpret_cast<const unsigned char*>(host->data());
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char want = (i >= begin && i < begin + count) ? 0x00 : 0xab;
    ASSERT_EQ(p[i], want) << "byte " << i;
  }
}

TEST(CudaBackend, NarrowedAndWidenedCopiesGiveTheHostConversionsBits) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  auto cpu = MakeCpuBackend();
  const int64_t n = (int64_t(1) << 20) + 13;
  auto host = b->AllocateHost(size_t(n) * 4);
  auto half = b->AllocateHost(size_t(n) * 2);
  auto dev = b->AllocateDevice(size_t(n) * 4);
  auto staging = b->AllocateDevice(size_t(n) * 2);
  ASSERT_TRUE(host.ok() && half.ok() && dev.ok() && staging.ok());
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float((i * 2654435761u) % 100003) * 1e-3f - 50.0f;
  std::vector<uint16_t> want(static_cast<size_t>(n));
  std::vector<float> widened(static_cast<size_t>(n));
  auto done = b->CreateEvent();
  for (HalfFormat format : {HalfFormat::kBf16, HalfFormat::kFp16}) {
    std::memcpy(host->data(), values.data(), size_t(n) * 4);
    b->Copy(dev->data(), host->data(), size_t(n) * 4, StreamKind::kHostToDevice);
    b->Record(*done, StreamKind::kHostToDevice);
    b->StreamWait(StreamKind::kDeviceToHost, *done);
    auto* half16 = reinterpret_cast<uint16_t*>(half->data());
    b->CopyNarrowed(half16, Floats(*dev), n, format, staging->data(), StreamKind::kDeviceToHost);
    b->Record(*done, StreamKind::kDeviceToHost);
    b->Synchronize(*done);
    ASSERT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
    cpu->CopyNarrowed(want.data(), values.data(), n, format, nullptr, StreamKind::kDeviceToHost);
    ASSERT_EQ(0, std::memcmp(half16, want.data(), size_t(n) * 2)) << "narrowing, format " << int(format);
    // And back: the device widens what the host holds.
    b->Zero(dev->data(), size_t(n) * 4, StreamKind::kHostToDevice);
    b->CopyWidened(Floats(*dev), half16, n, format, staging->data(), StreamKind::kHostToDevice);
    b->Copy(host->data(), dev->data(), size_t(n) * 4, StreamKind::kHostToDevice);
    b->Record(*done, StreamKind::kHostToDevice);
    b->Synchronize(*done);
    ASSERT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
    cpu->CopyWidened(widened.data(), want.data(), n, format, nullptr, StreamKind::kHostToDevice);
    ASSERT_EQ(0, std::memcmp(host->data(), widened.data(), size_t(n) * 4)) << "widening, format " << int(format);
  }
}

TEST(CudaBackend, NarrowOnTheDeviceGivesTheHostConversionsBits) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  auto cpu = MakeCpuBackend();
  const int64_t n = (int64_t(1) << 20) + 29;
  auto host = b->AllocateHost(size_t(n) * 4);
  auto dev = b->AllocateDevice(size_t(n) * 4);
  auto dev16 = b->AllocateDevice(size_t(n) * 2);
  ASSERT_TRUE(host.ok() && dev.ok() && dev16.ok());
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float((i * 2246822519u) % 1000003) * 3e-4f - 150.0f;
  values[0] = 65504.0f * 2;  // past fp16's range: infinity, as on the host
  std::vector<uint16_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  auto done = b->CreateEvent();
  for (HalfFormat format : {HalfFormat::kBf16, HalfFormat::kFp16}) {
    std::memcpy(host->data(), values.data(), size_t(n) * 4);
    b->Copy(dev->data(), host->data(), size_t(n) * 4, StreamKind::kHostToDevice);
    b->Narrow(reinterpret_cast<uint16_t*>(dev16->data()), Floats(*dev), n, format, StreamKind::kHostToDevice);
    b->Copy(host->data(), dev16->data(), size_t(n) * 2, StreamKind::kHostToDevice);
    b->Record(*done, StreamKind::kHostToDevice);
    b->Synchronize(*done);
    ASSERT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
    std::memcpy(got.data(), host->data(), size_t(n) * 2);
    cpu->Narrow(want.data(), values.data(), n, format, StreamKind::kHostToDevice);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * 2)) << "format " << int(format);
  }
}

// Values that stay exact in float through the sums below (multiples of 1/4
// well under 2^20), so device and host results must agree bit for bit.
float Initial(int32_t chunk, int64_t i) { return float((chunk * 7919 + i) % 1021) * 0.25f; }

TEST(CudaBackend, ChunkManagerMovesChunksBitExactThroughEvictionsAndPrefetches) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  constexpr int32_t kChunks = 6;
  constexpr int64_t kChunkBytes = int64_t(1) << 20;
  constexpr int64_t kFloats = kChunkBytes / int64_t(sizeof(float));
  ChunkRuntimeOptions o;
  o.non_model_bytes = 4096;
  o.min_chunks_per_moment = 2;
  o.device_capacity_bytes = 4096 + 4 * kChunkBytes;  // 4 slots for 12 param and grad chunks
  o.eviction = EvictionPolicy::kOpt;
  o.prefetch_depth = 2;
  o.hybrid_adam = false;
  auto made = ChunkManager::Create(kChunks, kChunkBytes, std::move(b), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  ChunkManager& m = **made;
  ASSERT_EQ(m.device_slots(), 4);
  EXPECT_EQ(MemoryType(m.non_model_memory()), cudaMemoryTypeDevice);
  const cudaStream_t compute = static_cast<cudaStream_t>(m.backend().stream_handle(StreamKind::kCompute));

  std::vector<std::vector<float>> param(kChunks, std::vector<float>(size_t(kFloats)));
  std::vector<std::vector<float>> grad(kChunks, std::vector<float>(size_t(kFloats), 0.0f));
  for (int32_t c = 0; c < kChunks; ++c) {
    float* p = m.HostWrite({StateKind::kParam, c});
    EXPECT_EQ(MemoryType(p), cudaMemoryTypeHost);
    for (int64_t i = 0; i < kFloats; ++i) p[i] = param[size_t(c)][size_t(i)] = Initial(c, i);
  }
  m.ZeroFill(StateKind::kGrad);

  for (int step = 0; step < 4; ++step) {
    const bool writes_params = step % 2 == 1;
    m.BeginStep();
    for (int32_t c = 0; c < kChunks; ++c) {
      ChunkAccess a[2] = {{{StateKind::kParam, c}, writes_params}, {{StateKind::kGrad, c}, true}};
      m.Access(a);
      float* p = m.DeviceData({StateKind::kParam, c});
      float* g = m.DeviceData({StateKind::kGrad, c});
      // The op: grad += param, then (odd steps) param += param, on the compute stream.
      kernels::cuda::ResidualForward<float>(g, g, p, kFloats, compute);
      if (writes_params) kernels::cuda::ResidualForward<float>(p, p, p, kFloats, compute);
      m.Release(a);
      for (int64_t i = 0; i < kFloats; ++i) {
        grad[size_t(c)][size_t(i)] += param[size_t(c)][size_t(i)];
        if (writes_params) param[size_t(c)][size_t(i)] += param[size_t(c)][size_t(i)];
      }
    }
    m.EndStep();
    // A host update between steps, as the optimizer makes: it must see every
    // write-home, including those of evictions still in flight.
    for (int32_t c = 0; c < kChunks; ++c) {
      float* p = m.HostWrite({StateKind::kParam, c});
      for (int64_t i = 0; i < kFloats; ++i) {
        ASSERT_EQ(p[i], param[size_t(c)][size_t(i)]) << "step " << step << " chunk " << c << " element " << i;
        p[i] += 1.0f;
        param[size_t(c)][size_t(i)] += 1.0f;
      }
    }
  }
  ASSERT_TRUE(m.backend().CheckErrors().ok()) << m.backend().CheckErrors().message();
  for (int32_t c = 0; c < kChunks; ++c) {
    const float* g = m.HostRead({StateKind::kGrad, c});
    ASSERT_EQ(std::memcmp(g, grad[size_t(c)].data(), size_t(kChunkBytes)), 0) << "grad chunk " << c;
    const float* p = m.HostRead({StateKind::kParam, c});
    ASSERT_EQ(std::memcmp(p, param[size_t(c)].data(), size_t(kChunkBytes)), 0) << "param chunk " << c;
  }
  const RuntimeCounters& n = m.counters();
  EXPECT_GT(n.evictions[int(StateKind::kParam)] + n.evictions[int(StateKind::kGrad)], 0);
  EXPECT_GT(n.prefetches, 0);
  EXPECT_GT(n.prefetch_hits, 0);
  EXPECT_GT(n.moved_bytes[int(Direction::kDeviceToHost)], 0);
  EXPECT_LE(m.peak_device_bytes(), m.device_capacity_bytes());
}

TEST(CudaBackend, AnAbsurdAllocationIsResourceExhaustedNamingBytesAndDevice) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  auto b = Backend();
  ASSERT_NE(b, nullptr);
  const size_t absurd = size_t(1) << 52;  // 4 PiB
  auto dev = b->AllocateDevice(absurd);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(dev.status().message().find(std::to_string(absurd) + " bytes"), std::string::npos)
      << dev.status().message();
  EXPECT_NE(dev.status().message().find("CUDA device 0"), std::string::npos) << dev.status().message();
  auto host = b->AllocateHost(absurd);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(host.status().message().find(std::to_string(absurd) + " bytes"), std::string::npos)
      << host.status().message();
  // A failed allocation is not sticky: the backend goes on working.
  EXPECT_TRUE(b->CheckErrors().ok()) << b->CheckErrors().message();
  auto small = b->AllocateDevice(4096);
  EXPECT_TRUE(small.ok()) << small.status().message();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing left for a kernel launch check to find
}

TEST(CudaBackend, AMissingDeviceIsAnErrorNotACrash) {
  // Runs without a GPU too: no driver or no device must give a Status.
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  if (count == 0) {
    auto b = MakeCudaBackend(0);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(b.status().message().find("no CUDA device"), std::string::npos) << b.status().message();
    return;
  }
  auto b = MakeCudaBackend(count);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("CUDA device " + std::to_string(count)), std::string::npos)
      << b.status().message();
  EXPECT_FALSE(MakeCudaBackend(-1).ok());
}

// A failed fill is reported by CheckErrors. It may poison the CUDA context,
// so it runs in a child process of its own.
void FillNullAndExitWithCheckErrors() {
  auto made = MakeCudaBackend(0);
  if (!made.ok()) std::exit(2);
  DeviceBackend& b = **made;
  auto done = b.CreateEvent();
  b.Zero(nullptr, 4096, StreamKind::kHostToDevice);
  b.Record(*done, StreamKind::kHostToDevice);
  b.Synchronize(*done);
  const Status first = b.CheckErrors();
  const Status again = b.CheckErrors();
  std::fprintf(stderr, "%s\n", first.message().c_str());
  std::exit(!first.ok() && first.message() == again.message() ? 3 : 4);
}

TEST(CudaBackendDeathTest, AFailedAsyncCallSurfacesAtCheckErrors) {
  PSTAR_REQUIRE_CUDA_DEVICE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, not a fork of one using CUDA
  EXPECT_EXIT(FillNullAndExitWithCheckErrors(), testing::ExitedWithCode(3), "CUDA device 0.*failed");
}

}  // namespace
}  // namespace pstar
