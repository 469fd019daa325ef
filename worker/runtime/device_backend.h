// DeviceBackend: the compute device as the chunk runtime sees it: two fixed
// memory blocks carved once at start-up (device and host), copies and fills
// issued on named streams, and events to order them. The runtime is written
// once against this interface; on the CPU backend the device tier is a block
// of host RAM with its own capacity and every operation completes at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "worker/core/status.h"
#include "worker/runtime/half_format.h"

namespace pstar {

enum class StreamKind : int { kCompute = 0, kHostToDevice = 1, kDeviceToHost = 2, kComm = 3 };


// A point in a stream's work; backends subclass it.
class Event {
 public:
  virtual ~Event() = default;
};

// An owned block of memory from a backend, freed by the backend's deleter.
class MemoryBlock {
 public:
  using Deleter = void (*)(std::byte*);
  MemoryBlock() = default;
  MemoryBlock(std::byte* data, size_t bytes, Deleter deleter) : data_(data, deleter), bytes_(bytes) {}
  std::byte* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<std::byte, Deleter> data_{nullptr, nullptr};
  size_t bytes_ = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const char* name() const = 0;
  // True when the device tier is host RAM (it then counts against the host budget).
  virtual bool device_is_host_memory() const = 0;

  // Blocks carved once; not zero-filled. The host block is pinned where that matters.
  virtual Result<MemoryBlock> AllocateDevice(size_t bytes) = 0;
  virtual Result<MemoryBlock> AllocateHost(size_t bytes) = 0;

  // Copies or zero-fills `bytes` in stream order.
  virtual void Copy(void* dst, const void* src, size_t bytes, StreamKind stream) = 0;
  virtual void Zero(void* dst, size_t bytes, StreamKind stream) = 0;
  // Copies n floats of device memory to the host as 16-bit values of
  // `format` (rounded to nearest even with the bits of kernels/half.h: exact
  // for values the format holds), or n such host values to the device as
  // floats. The conversion runs on the device, so half the bytes cross the
  // bus; `staging` is 2n bytes of device memory that nothing else uses until
  // the copy is done (unused where the device is host memory). Stream order.
  virtual void CopyNarrowed(uint16_t* host_dst, const float* device_src, int64_t n, HalfFormat format,
                            void* staging, StreamKind stream) = 0;
  virtual void CopyWidened(float* device_dst, const uint16_t* host_src, int64_t n, HalfFormat format,
                           void* staging, StreamKind stream) = 0;
  // n floats of device memory narrowed into 16-bit values of `format` in
  // device memory (the same bits as NarrowToHalf), in stream order.
  virtual void Narrow(uint16_t* device_dst, const float* device_src, int64_t n, HalfFormat format,
                      StreamKind stream) = 0;

  virtual std::unique_ptr<Event> CreateEvent() = 0;
  // Marks the current end of `stream`'s work.
  virtual void Record(Event& event, StreamKind stream) = 0;
  // Later work on `stream` waits for `event` (no host wait).
  virtual void StreamWait(StreamKind stream, const Event& event) = 0;
  // The host waits for `event`.
  virtual void Synchronize(const Event& event) = 0;
  // Makes the calling thread's device calls (Synchronize, on another thread
  // than the one that made the backend) reach this backend's device.
  virtual void BindThread() {}

  // An event that also notes when its stream reached it, for the profiler
  // (CreateEvent's note no time, which is cheaper on a GPU). Record and
  // Synchronize take it like any event.
  virtual std::unique_ptr<Event> CreateTimingEvent() = 0;
  // Seconds between two recorded timing events of one stream: device time
  // (on the CPU backend the host clock, as work completes when issued).
  // Waits for `end`; 0 when either could not be recorded.
  virtual double ElapsedSeconds(const Event& start, const Event& end) = 0;

  // Copies, fills and events return before their work is done, so their
  // failures cannot be returned by the calls themselves: the first one (or a
  // fault the device reported since) is kept and returned here, without
  // waiting, every time after. Always OK on the CPU backend.
  virtual Status CheckErrors() = 0;
  // The native handle of `stream` (a cudaStream_t on the CUDA backend), for
  // compute code that queues its own kernels; nullptr on the CPU backend.
  virtual void* stream_handle(StreamKind stream) = 0;
};

// The CPU backend: the device tier emulated in host RAM; streams are synchronous.
std::unique_ptr<DeviceBackend> MakeCpuBackend();

}  // namespace pstar
