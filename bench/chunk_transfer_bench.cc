// Chunk transfer efficiency: how fast the CUDA DeviceBackend moves a chunk
// between its pinned host tier and GPU memory, against a plain
// cudaMemcpyAsync of the same size between cudaMallocHost memory and
// cudaMalloc memory on a stream of its own. Run by bench/chunk_transfer.sh.
//
// For each size and direction the backend side issues what the chunk runtime
// issues per chunk, Copy then Record of the chunk's event on the direction's
// stream, `--iters` times back to back, and the host waits on the last event
// (Synchronize); the plain side issues the same copies and waits with
// cudaStreamSynchronize. Both are timed by the host clock around the whole
// batch, so launch and wait costs count the same on both. "both" runs H2D and
// D2H at once on the two copy streams (the runtime's prefetch and eviction
// overlap this way) and counts the bytes of both directions. Sides alternate
// round by round and the median of `--repeats` rounds is reported, after one
// warm-up round. Every copied buffer is checked after the last round.
//
// Prints, per size and direction:
//   transfer: dir=h2d|d2h|both size_mib=S iters=K backend_gbps=X plain_gbps=Y ratio=R
// then
//   summary: min_ratio=R target=0.90 verdict=met|not_met
// Without a CUDA device it prints "skipped: no CUDA device (...)" and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/runtime/cuda_backend.h"

namespace {

using pstar::DeviceBackend;
using pstar::MemoryBlock;
using pstar::StreamKind;

constexpr double kTarget = 0.90;

struct Options {
  std::vector<int64_t> sizes_mib = {16, 32, 64, 128, 256};
  int iters = 8;
  int repeats = 5;
  int device = 0;
};

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: chunk_transfer_bench [--sizes-mib 16,32,64,128,256] [--iters K] [--repeats R] "
               "[--device D]\n");
  std::exit(2);
}

std::vector<int64_t> ParseList(const char* text) {
  std::vector<int64_t> out;
  const std::string s = text;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) Usage();
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage();
    const char* value = argv[++i];
    if (arg == "--sizes-mib") {
      o.sizes_mib = ParseList(value);
    } else if (arg == "--iters") {
      o.iters = std::atoi(value);
    } else if (arg == "--repeats") {
      o.repeats = std::atoi(value);
    } else if (arg == "--device") {
      o.device = std::atoi(value);
    } else {
      Usage();
    }
  }
  if (o.iters <= 0 || o.repeats <= 0 || o.device < 0) Usage();
  return o;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "chunk_transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) Fail(std::string(call) + ": " + cudaGetErrorString(e));
}

void Check(const pstar::Status& s) {
  if (!s.ok()) Fail(s.message());
}

// A byte pattern per buffer, so a copy that lands in the wrong place shows.
void FillPattern(std::byte* p, size_t bytes, uint8_t seed) {
  for (size_t i = 0; i < bytes; i += 4096) p[i] = std::byte(uint8_t(i / 4096) ^ seed);
}

bool SamePattern(const std::byte* p, size_t bytes, uint8_t seed) {
  for (size_t i = 0; i < bytes; i += 4096) {
    if (p[i] != std::byte(uint8_t(i / 4096) ^ seed)) return false;
  }
  return true;
}

// Plain CUDA memory freed on scope exit.
struct PinnedHost {
  explicit PinnedHost(size_t bytes) { Check(cudaMallocHost(&p, bytes), "cudaMallocHost"); }
  ~PinnedHost() { cudaFreeHost(p); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(p); }
  void* p = nullptr;
};

struct DeviceMemory {
  explicit DeviceMemory(size_t bytes) { Check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(p); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(p); }
  void* p = nullptr;
};

struct Stream {
  Stream() { Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t s = nullptr;
};

enum class Dir { kH2D, kD2H, kBoth };
const char* DirName(Dir d) { return d == Dir::kH2D ? "h2d" : d == Dir::kD2H ? "d2h" : "both"; }

// Two host and two device buffers of `bytes`: [0] for H2D, [1] for D2H.
struct BackendSide {
  BackendSide(DeviceBackend& b, size_t bytes) : backend(b), bytes(bytes) {
    auto host = b.AllocateHost(2 * bytes);
    if (!host.ok()) Check(host.status());
    auto dev = b.AllocateDevice(2 * bytes);
    if (!dev.ok()) Check(dev.status());
    host_block = std::move(host).value();
    device_block = std::move(dev).value();
    h2d_done = b.CreateEvent();
    d2h_done = b.CreateEvent();
  }
  std::byte* host(int i) const { return host_block.data() + size_t(i) * bytes; }
  std::byte* dev(int i) const { return device_block.data() + size_t(i) * bytes; }

  // The chunk runtime's pattern: a copy, then the chunk's event.
  void Run(Dir d, int iters) {
    for (int i = 0; i < iters; ++i) {
      if (d != Dir::kD2H) {
        backend.Copy(dev(0), host(0), bytes, StreamKind::kHostToDevice);
        backend.Record(*h2d_done, StreamKind::kHostToDevice);
      }
      if (d != Dir::kH2D) {
        backend.Copy(host(1), dev(1), bytes, StreamKind::kDeviceToHost);
        backend.Record(*d2h_done, StreamKind::kDeviceToHost);
      }
    }
    if (d != Dir::kD2H) backend.Synchronize(*h2d_done);
    if (d != Dir::kH2D) backend.Synchronize(*d2h_done);
    Check(backend.CheckErrors());
  }

  DeviceBackend& backend;
  size_t bytes;
  MemoryBlock host_block, device_block;
  std::unique_ptr<pstar::Event> h2d_done, d2h_done;
};

struct PlainSide {
  explicit PlainSide(size_t bytes) : bytes(bytes), host_mem(2 * bytes), device_mem(2 * bytes) {}
  std::byte* host(int i) const { return host_mem.data() + size_t(i) * bytes; }
  std::byte* dev(int i) const { return device_mem.data() + size_t(i) * bytes; }

  void Run(Dir d, int iters) {
    for (int i = 0; i < iters; ++i) {
      if (d != Dir::kD2H) Check(cudaMemcpyAsync(dev(0), host(0), bytes, cudaMemcpyHostToDevice, up.s), "cudaMemcpyAsync");
      if (d != Dir::kH2D) Check(cudaMemcpyAsync(host(1), dev(1), bytes, cudaMemcpyDeviceToHost, down.s), "cudaMemcpyAsync");
    }
    if (d != Dir::kD2H) Check(cudaStreamSynchronize(up.s), "cudaStreamSynchronize");
    if (d != Dir::kH2D) Check(cudaStreamSynchronize(down.s), "cudaStreamSynchronize");
  }

  size_t bytes;
  PinnedHost host_mem;
  DeviceMemory device_mem;
  Stream up, down;
};

// Seeds: the H2D source and the D2H source (written to the device first).
constexpr uint8_t kUpSeed = 0x5a, kDownSeed = 0xa5;

void Prepare(std::byte* host_up, std::byte* host_down, std::byte* dev_down, size_t bytes) {
  FillPattern(host_up, bytes, kUpSeed);
  std::memset(host_down, 0, bytes);
  std::vector<std::byte> staging(bytes);
  FillPattern(staging.data(), bytes, kDownSeed);
  Check(cudaMemcpy(dev_down, staging.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// The H2D destination, read back, and the D2H destination hold their sources.
bool Verify(const std::byte* dev_up, const std::byte* host_down, size_t bytes) {
  std::vector<std::byte> back(bytes);
  Check(cudaMemcpy(back.data(), dev_up, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return SamePattern(back.data(), bytes, kUpSeed) && SamePattern(host_down, bytes, kDownSeed);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  if (pstar::CudaDeviceCount() == 0) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    std::printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 0;
  }
  auto made = pstar::MakeCudaBackend(o.device);
  if (!made.ok()) {
    if (made.status().code() == pstar::StatusCode::kFailedPrecondition) {
      std::printf("skipped: no CUDA device (%s)\n", made.status().message().c_str());
      return 0;
    }
    Fail(made.status().message());
  }
  DeviceBackend& backend = **made;
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
  std::printf("device: %d %s, %.1f GiB, PCI %04x:%02x:%02x\n", o.device, prop.name,
              double(prop.totalGlobalMem) / double(1ull << 30), prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  std::printf("method: %d copies per round, median of %d rounds after 1 warm-up, host clock; "
              "backend = DeviceBackend Copy+Record+Synchronize, plain = cudaMemcpyAsync+cudaStreamSynchronize\n",
              o.iters, o.repeats);

  double min_ratio = 1e9;
  for (int64_t mib : o.sizes_mib) {
    const size_t bytes = size_t(mib) << 20;
    BackendSide b(backend, bytes);
    PlainSide p(bytes);
    Prepare(b.host(0), b.host(1), b.dev(1), bytes);
    Prepare(p.host(0), p.host(1), p.dev(1), bytes);
    for (Dir d : {Dir::kH2D, Dir::kD2H, Dir::kBoth}) {
      std::vector<double> tb, tp;
      for (int r = 0; r < o.repeats + 1; ++r) {
        // Alternate which side goes first, so drift hits both alike.
        std::function<void()> run_b = [&] {
          const double t0 = Now();
          b.Run(d, o.iters);
          if (r > 0) tb.push_back(Now() - t0);
        };
        std::function<void()> run_p = [&] {
          const double t0 = Now();
          p.Run(d, o.iters);
          if (r > 0) tp.push_back(Now() - t0);
        };
        if (r % 2 == 0) {
          run_b();
          run_p();
        } else {
          run_p();
          run_b();
        }
      }
      const double moved = double(bytes) * o.iters * (d == Dir::kBoth ? 2 : 1);
      const double gb = moved / Median(tb) / 1e9, gp = moved / Median(tp) / 1e9;
      const double ratio = gb / gp;
      min_ratio = std::min(min_ratio, ratio);
      std::printf("transfer: dir=%s size_mib=%lld iters=%d backend_gbps=%.2f plain_gbps=%.2f ratio=%.3f\n",
                  DirName(d), static_cast<long long>(mib), o.iters, gb, gp, ratio);
      std::fflush(stdout);
    }
    if (!Verify(b.dev(0), b.host(1), bytes) || !Verify(p.dev(0), p.host(1), bytes)) {
      Fail("copied data differs from its source at " + std::to_string(mib) + " MiB");
    }
  }
  std::printf("summary: min_ratio=%.3f target=%.2f verdict=%s\n", min_ratio, kTarget,
              min_ratio >= kTarget ? "met" : "not_met");
  return 0;
}
