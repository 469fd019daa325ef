// Arena: one fixed block carved at start-up, handed out by a bump pointer, with
// every byte counted. Activations and workspaces live here so the memory tracer
// can read non-model bytes exactly instead of sampling an allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/core/status.h"

namespace pstar {

class Arena {
 public:
  static constexpr size_t kAlignment = 64;

  // Reserves `capacity_bytes` once (64-byte aligned, not zero-filled).
  Arena(std::string name, size_t capacity_bytes);
  // Hands out `capacity_bytes` of `memory` (64-byte aligned), owned by someone
  // else: the device tier's non-model region.
  Arena(std::string name, std::byte* memory, size_t capacity_bytes);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Returns `count` floats, or ResourceExhausted naming the shortfall.
  Result<float*> AllocateFloats(size_t count);
  // Returns `count` int32s; same accounting.
  Result<int32_t*> AllocateInts(size_t count);

  // Forgets every allocation; the block itself stays reserved.
  void Reset() { used_ = 0; }

  // Rounds `bytes` up to the arena's alignment: what an allocation really costs.
  static size_t Rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  const std::string& name() const { return name_; }
  size_t capacity_bytes() const { return capacity_; }
  size_t used_bytes() const { return used_; }
  size_t peak_bytes() const { return peak_; }

 private:
  Result<void*> Allocate(size_t bytes);

  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::string name_;
  size_t capacity_;
  size_t used_ = 0;
  size_t peak_ = 0;
  std::unique_ptr<std::byte, FreeDeleter> owned_;
  std::byte* base_ = nullptr;
};

}  // namespace pstar
