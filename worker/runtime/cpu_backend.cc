#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/runtime/device_backend.h"

namespace pstar {

namespace {

constexpr size_t kBlockAlignment = 64;

void FreeBlock(std::byte* p) { std::free(p); }

Result<MemoryBlock> AllocateAligned(size_t bytes, const char* what) {
  size_t rounded = (bytes + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment;
  if (rounded == 0) return MemoryBlock();
  void* p = std::aligned_alloc(kBlockAlignment, rounded);
  if (p == nullptr) {
    return Status::ResourceExhausted(std::string("cannot allocate ") + std::to_string(rounded) +
                                     " bytes for the " + what);
  }
  return MemoryBlock(static_cast<std::byte*>(p), rounded, FreeBlock);
}

// Work completes as it is issued, so a timing event notes the host clock at
// Record; a plain one notes nothing.
class CpuEvent final : public Event {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CpuEvent(bool timing) : timing_(timing) {}
  void Mark() {
    if (timing_) at_ = Clock::now();
  }
  Clock::time_point at() const { return at_; }

 private:
  bool timing_;
  Clock::time_point at_{};
};

class CpuBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cpu"; }
  bool device_is_host_memory() const override { return true; }
  Result<MemoryBlock> AllocateDevice(size_t bytes) override {
    return AllocateAligned(bytes, "emulated device tier");
  }
  Result<MemoryBlock> AllocateHost(size_t bytes) override {
    return AllocateAligned(bytes, "host chunk tier");
  }
  void Copy(void* dst, const void* src, size_t bytes, StreamKind) override {
    std::memcpy(dst, src, bytes);
  }
  void Zero(void* dst, size_t bytes, StreamKind) override { std::memset(dst, 0, bytes); }
  void CopyNarrowed(uint16_t* host_dst, const float* device_src, int64_t n, HalfFormat format, void*,
                    StreamKind) override {
    NarrowToHalf(host_dst, device_src, n, format);
  }
  void CopyWidened(float* device_dst, const uint16_t* host_src, int64_t n, HalfFormat format, void*,
                   StreamKind) override {
    WidenFromHalf(device_dst, host_src, n, format);
  }
  void Narrow(uint16_t* device_dst, const float* device_src, int64_t n, HalfFormat format, StreamKind) override {
    NarrowToHalf(device_dst, device_src, n, format);
  }
  std::unique_ptr<Event> CreateEvent() override { return std::make_unique<CpuEvent>(false); }
  void Record(Event& event, StreamKind) override { static_cast<CpuEvent&>(event).Mark(); }
  void StreamWait(StreamKind, const Event&) override {}
  void Synchronize(const Event&) override {}
  std::unique_ptr<Event> CreateTimingEvent() override { return std::make_unique<CpuEvent>(true); }
  double ElapsedSeconds(const Event& start, const Event& end) override {
    const auto& a = static_cast<const CpuEvent&>(start);
    const auto& b = static_cast<const CpuEvent&>(end);
    return std::chrono::duration<double>(b.at() - a.at()).count();
  }
  Status CheckErrors() override { return Status::Ok(); }
  void* stream_handle(StreamKind) override { return nullptr; }
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace pstar
