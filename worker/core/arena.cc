#include "worker/core/arena.h"

#include <cstdlib>
#include <new>

namespace pstar {

void Arena::FreeDeleter::operator()(void* p) const { std::free(p); }

Arena::Arena(std::string name, size_t capacity_bytes)
    : name_(std::move(name)), capacity_(Rounded(capacity_bytes)) {
  if (capacity_ > 0) {
    void* p = std::aligned_alloc(kAlignment, capacity_);
    if (p == nullptr) throw std::bad_alloc();
    owned_.reset(static_cast<std::byte*>(p));
    base_ = owned_.get();
  }
}

Arena::Arena(std::string name, std::byte* memory, size_t capacity_bytes)
    : name_(std::move(name)), capacity_(capacity_bytes / kAlignment * kAlignment), base_(memory) {}

Result<void*> Arena::Allocate(size_t bytes) {
  size_t need = Rounded(bytes);
  if (used_ + need > capacity_) {
    return Status::ResourceExhausted("arena '" + name_ + "': allocation of " + std::to_string(need) +
                                     " bytes exceeds capacity " + std::to_string(capacity_) +
                                     " (in use " + std::to_string(used_) + ")");
  }
  void* p = base_ + used_;
  used_ += need;
  if (used_ > peak_) peak_ = used_;
  return p;
}

Result<float*> Arena::AllocateFloats(size_t count) {
  PSTAR_ASSIGN_OR_RETURN(void* p, Allocate(count * sizeof(float)));
  return static_cast<float*>(p);
}

Result<int32_t*> Arena::AllocateInts(size_t count) {
  PSTAR_ASSIGN_OR_RETURN(void* p, Allocate(count * sizeof(int32_t)));
  return static_cast<int32_t*>(p);
}

}  // namespace pstar
