// A host emulation of what the tensor-core kernels use of CUDA, so that their
// code runs (slowly) on a machine without a GPU: one fiber per CUDA thread of
// a block, all on the calling thread and switched cooperatively at
// __syncthreads and __syncwarp (a barrier that cannot complete, one not every
// thread reaches, aborts naming it), warp reductions through a per-warp
// exchange, and WMMA fragments as whole 16x16
// matrices that lane 0 of a warp loads, multiplies and stores (between two
// warp barriers) for the warp: the kernels only ever hand fragments to WMMA
// calls, so the other lanes' copies are never read. For the mma.sync
// kernels (kernels/cuda/mma_primitives.cuh) it goes further: mma.sync,
// ldmatrix and shuffles exchange every lane's registers and give each lane
// what the PTX ISA's fragment layouts give it, ldmatrix and cp.async check
// their 16-byte alignment and that they address shared memory, and cp.async
// copies land only at the wait that covers their group (so a read before
// its wait sees garbage). Blocks that order their additions by counters
// (WaitForCount) must wait only on blocks that started before them, in any
// start order (RunBlocks can shuffle it): here a wait that is not already
// satisfied aborts. It checks indexing, masking, the
// fragment layouts as documented and the barriers' placement, not the
// hardware or its speed; the GPU tests do that.
//
// CUDA's built-in names (threadIdx, blockIdx, blockDim) must be plain names
// here, so they are thread_local variables that the switch to a fiber sets. Include this before the kernels, inside no
// namespace. Elements are float or Bf16 (below).
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/half.h"

namespace pstar::test::emulation {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

constexpr int kWarpSize = 32;

#if defined(__SANITIZE_ADDRESS__)
#define PSTAR_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PSTAR_EMULATION_ASAN 1
#endif
#endif
#ifdef PSTAR_EMULATION_ASAN
}  // namespace pstar::test::emulation
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
namespace pstar::test::emulation {
#endif

// cp.async: each thread's copies wait in groups and land at the wait that
// covers them.
struct AsyncCopy {
  void* dst;
  const void* src;  // null: zeros
};

struct FiberBarrier;

// One emulated CUDA thread: its context and stack, what it waits at, and its
// cp.async groups.
struct Fiber {
  ucontext_t context;
  unsigned char* stack = nullptr;  // the usable stack, above a guard page
  size_t stack_bytes = 0;
  unsigned tid = 0;
  bool done = false;
  const FiberBarrier* waiting = nullptr;  // the barrier it waits at, if any
  uint64_t generation = 0;                // that barrier's generation when it arrived
  void* fake_stack = nullptr;             // AddressSanitizer's, across switches
  std::vector<AsyncCopy> uncommitted_copies;
  std::vector<std::vector<AsyncCopy>> committed_copies;
};

// The fibers of one RunBlocks and the switches between them: a fiber runs
// until it waits at a barrier, then the first fiber that can go on runs, in
// thread order or (every other block) its reverse. So one warp runs as far as
// its barriers let it before the next starts: a missing __syncthreads shows
// as a read of what another warp has not written yet, or has overwritten
// already, in one of the two orders. cp.async copies land at the wait that
// covers them (a read before it sees garbage) or, in the second and third
// block of every four, at once (a copy issued into a tile other warps still
// read shows): the first blocks of a grid already see all four pairings.
struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  size_t current = 0;
  int64_t blocks_done = 0;
  bool ascending = true;
  bool eager_copies = false;
  ucontext_t main;
  const void* main_stack = nullptr;  // the calling thread's stack, for AddressSanitizer
  size_t main_stack_bytes = 0;
  void* main_fake_stack = nullptr;

  bool CanRun(const Fiber& f) const;
  // From fiber `from` (null: the caller) to fiber `to` (null: back to the
  // caller, every fiber done). A finished `from` never runs again.
  void SwitchTo(Fiber* from, Fiber* to);
  // The current fiber cannot go on: the next one that can runs.
  void Yield();
};
inline thread_local Scheduler* current_scheduler = nullptr;

// __syncthreads and __syncwarp: the last of `expected` arrivals releases the
// others, which run again when the scheduler comes to them.
struct FiberBarrier {
  FiberBarrier(unsigned n, const char* what) : expected(n), name(what) {}
  void arrive_and_wait() {
    if (++arrived == expected) {
      arrived = 0;
      ++generation;
      return;
    }
    Scheduler& s = *current_scheduler;
    Fiber& me = *s.fibers[s.current];
    me.waiting = this;
    me.generation = generation;
    s.Yield();
    me.waiting = nullptr;
  }
  unsigned expected, arrived = 0;
  uint64_t generation = 0;
  const char* name;
};

inline bool Scheduler::CanRun(const Fiber& f) const {
  return !f.done && (f.waiting == nullptr || f.waiting->generation != f.generation);
}

// One block's shared state: its barriers, the warps' exchange slots and the
// dynamic shared memory.
struct Block {
  explicit Block(unsigned threads, size_t shared_bytes)
      : all(threads, "__syncthreads"),
        exchange(threads),
        words(size_t(threads) * kWords),
        shared(shared_bytes + 128, 0xCD) {  // uninitialized, as on a GPU
    for (unsigned w = 0; w < (threads + kWarpSize - 1) / kWarpSize; ++w) {
      warps.push_back(
          std::make_unique<FiberBarrier>(std::min<unsigned>(kWarpSize, threads - w * kWarpSize), "__syncwarp"));
    }
  }
  FiberBarrier all;
  std::vector<std::unique_ptr<FiberBarrier>> warps;
  std::vector<float> exchange;
  static constexpr size_t kWords = 8;
  std::vector<uint64_t> words;  // kWords per thread: the registers a warp-wide instruction exchanges
  std::vector<unsigned char> shared;
};

inline thread_local Block* current_block = nullptr;

inline Fiber& CurrentFiber() { return *current_scheduler->fibers[current_scheduler->current]; }

}  // namespace pstar::test::emulation

inline thread_local pstar::test::emulation::Dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(bytes)

namespace pstar::test::emulation {

inline void Scheduler::SwitchTo(Fiber* from, Fiber* to) {
  ucontext_t* save = from != nullptr ? &from->context : &main;
  if (to != nullptr) {
    current = size_t(to->tid);
    threadIdx = {to->tid, 0, 0};
  }
#ifdef PSTAR_EMULATION_ASAN
  // A finished fiber's fake stack goes with it (null save).
  void** fake = from == nullptr ? &main_fake_stack : from->done ? nullptr : &from->fake_stack;
  if (to != nullptr) {
    __sanitizer_start_switch_fiber(fake, to->stack, to->stack_bytes);
  } else {
    __sanitizer_start_switch_fiber(fake, main_stack, main_stack_bytes);
  }
#endif
  if (swapcontext(save, to != nullptr ? &to->context : &main) != 0) std::abort();
    // Back here: someone switched to `from` (or the last fiber to the caller).
#ifdef PSTAR_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(from == nullptr ? main_fake_stack : from->fake_stack, nullptr, nullptr);
#endif
}

inline void Scheduler::Yield() {
  Fiber* from = fibers[current].get();
  const size_t n = fibers.size();
  for (size_t k = 0; k < n; ++k) {
    Fiber* next = fibers[ascending ? k : n - 1 - k].get();
    if (!CanRun(*next)) continue;
    if (next == from) return;  // its barrier completed meanwhile: it goes on
    SwitchTo(from, next);
    return;
  }
  bool all_done = true;
  for (const auto& f : fibers) all_done = all_done && f->done;
  if (all_done) {
    SwitchTo(from, nullptr);
    return;
  }
  // Every fiber not done waits at a barrier that cannot complete: name each
  // such barrier, how many threads reached it and the first of them.
  std::string report;
  std::vector<const FiberBarrier*> named;
  for (const auto& f : fibers) {
    if (f->done || f->waiting == nullptr || std::find(named.begin(), named.end(), f->waiting) != named.end()) {
      continue;
    }
    named.push_back(f->waiting);
    report += std::string(report.empty() ? "" : ", ") + "at " + f->waiting->name + " " +
              std::to_string(f->waiting->arrived) + " of " + std::to_string(f->waiting->expected) +
              " threads (thread " + std::to_string(f->tid) + " first)";
  }
  std::fprintf(stderr, "warp emulation: block %u,%u cannot go on: %s; a barrier not every thread reaches\n", blockIdx.x,
               blockIdx.y, report.c_str());
  std::abort();
}

}  // namespace pstar::test::emulation

inline void __syncthreads() { pstar::test::emulation::current_block->all.arrive_and_wait(); }
inline void __syncwarp() {
  pstar::test::emulation::current_block->warps[threadIdx.x / pstar::test::emulation::kWarpSize]->arrive_and_wait();
}

namespace pstar::test::emulation {

// Every lane gets the same result, as from CUDA's butterfly reductions.
template <typename Combine>
float WarpReduce(float v, float init, Combine combine) {
  Block& b = *current_block;
  const unsigned warp = threadIdx.x / kWarpSize;
  __syncwarp();
  b.exchange[threadIdx.x] = v;
  __syncwarp();
  float r = init;
  const unsigned first = warp * kWarpSize, last = std::min<unsigned>(first + kWarpSize, unsigned(b.exchange.size()));
  for (unsigned i = first; i < last; ++i) r = combine(r, b.exchange[i]);
  __syncwarp();
  return r;
}
inline float WarpSum(float v) {
  return WarpReduce(v, 0.0f, [](float a, float b) { return a + b; });
}
inline float WarpMax(float v) {
  return WarpReduce(v, -INFINITY, [](float a, float b) { return std::fmax(a, b); });
}
inline unsigned char* TensorCoreSharedMemory() { return current_block->shared.data(); }

// A 16-bit element for the kernels' 16-bit instantiations: bfloat16's bits,
// narrowed to nearest even as __float2bfloat16_rn does, so that their
// 16-byte loads, narrowing loads and 16-bit tile layouts run here too.
struct Bf16 {
  uint16_t bits = 0;
  Bf16() = default;
  explicit Bf16(float f) : bits(kernels::FloatToBFloat16(f)) {}
  explicit operator float() const { return kernels::BFloat16ToFloat(bits); }
};
static_assert(sizeof(Bf16) == 2, "a tile of Bf16 is laid out as the GPU's bf16");

inline float ToFloat(float x) { return x; }
inline float ToFloat(Bf16 x) { return float(x); }
template <typename T>
inline T FromFloat(float x) {
  return T(x);
}
using std::min;

// What every fiber of a RunBlocks runs: the grid's blocks in order, the block
// barrier between two of them.
struct GridRun {
  Dim3 grid;
  unsigned threads;
  const std::vector<Dim3>* order;
  const std::function<void()>* kernel;
};
inline thread_local const GridRun* current_run = nullptr;

inline void RunFiber() {
  Scheduler& s = *current_scheduler;
  Fiber& me = CurrentFiber();
#ifdef PSTAR_EMULATION_ASAN
  const void* from_stack = nullptr;
  size_t from_bytes = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_stack, &from_bytes);
  if (s.main_stack == nullptr) s.main_stack = from_stack, s.main_stack_bytes = from_bytes;  // thread 0, from the caller
#endif
  const GridRun& run = *current_run;
  blockDim = {run.threads, 1, 1};
  gridDim = run.grid;
  for (const Dim3& at : *run.order) {
    blockIdx = at;
    (*run.kernel)();
    if (!me.uncommitted_copies.empty() || !me.committed_copies.empty()) {
      std::fprintf(stderr, "warp emulation: thread %u ended block %u,%u with cp.async copies not waited for\n", me.tid,
                   at.x, at.y);
      std::abort();
    }
    current_block->all.arrive_and_wait();  // every thread is done with the block
    if (me.tid == 0) {
      std::fill(current_block->shared.begin(), current_block->shared.end(), 0xCD);
      ++s.blocks_done;
      s.ascending = s.blocks_done % 2 == 0;
      s.eager_copies = (s.blocks_done + 1) / 2 % 2 == 1;  // lazy, eager, eager, lazy with the orders above
    }
    current_block->all.arrive_and_wait();
  }
  me.done = true;
  s.Yield();  // never comes back
}

// A fiber for thread `t` that starts in RunFiber, on a stack above a guard
// page: room for the kernels' register arrays and the sanitizers' redzones,
// and no more, since AddressSanitizer clears a context's whole stack shadow
// at every switch (1 MiB stacks made the emulated tests seven times slower
// under it). (Not inlined: getcontext returns twice, and no caller's
// variable must live across it.)
constexpr size_t kStackBytes = size_t{128} << 10, kStackGuard = 4096;
[[gnu::noinline]] inline std::unique_ptr<Fiber> MakeFiber(unsigned t) {
  auto f = std::make_unique<Fiber>();
  f->tid = t;
  void* region = mmap(nullptr, kStackBytes + kStackGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED || mprotect(region, kStackGuard, PROT_NONE) != 0) {
    std::fprintf(stderr, "warp emulation: no memory for thread %u's stack\n", t);
    std::abort();
  }
  f->stack = static_cast<unsigned char*>(region) + kStackGuard;
  f->stack_bytes = kStackBytes;
  if (getcontext(&f->context) != 0) std::abort();
  f->context.uc_stack.ss_sp = f->stack;
  f->context.uc_stack.ss_size = f->stack_bytes;
  f->context.uc_link = nullptr;
  makecontext(&f->context, &RunFiber, 0);
  return f;
}

// Runs kernel() as a grid of blocks, one block at a time, on one fiber per
// CUDA thread (the same fibers for every block; shared memory is refilled
// with garbage between blocks). Blocks run in launch order (x fastest), or
// with `shuffle_seed` in a shuffled order: CUDA promises none, and a kernel
// whose blocks wait on one another must not depend on it.
inline void RunBlocks(Dim3 grid, unsigned threads, size_t shared_bytes, const std::function<void()>& kernel,
                      unsigned shuffle_seed = 0) {
  Block block(threads, shared_bytes);
  std::vector<Dim3> order;
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) order.push_back({bx, by, 0});
  }
  if (shuffle_seed != 0) std::shuffle(order.begin(), order.end(), std::mt19937(shuffle_seed));
  const GridRun run{grid, threads, &order, &kernel};
  current_run = &run;
  Scheduler scheduler;
  current_scheduler = &scheduler;
  current_block = &block;
  for (unsigned t = 0; t < threads; ++t) scheduler.fibers.push_back(MakeFiber(t));
  scheduler.SwitchTo(nullptr, scheduler.fibers[0].get());
  for (auto& f : scheduler.fibers) munmap(f->stack - kStackGuard, f->stack_bytes + kStackGuard);
  current_scheduler = nullptr;
  current_block = nullptr;
  current_run = nullptr;
}

}  // namespace pstar::test::emulation

namespace pstar::test::emulation {

[[noreturn]] inline void EmulationFault(const char* what, const void* p) {
  std::fprintf(stderr, "warp emulation: %s (address %p, thread %u, block %u,%u)\n", what, p, threadIdx.x, blockIdx.x,
               blockIdx.y);
  std::abort();
}

inline bool InShared(const void* p, size_t bytes) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  const std::vector<unsigned char>& s = current_block->shared;
  return c >= s.data() && c + bytes <= s.data() + s.size();
}

// Every lane of the calling warp publishes `n` words; `read(lane, i)` then
// gives lane `lane`'s word i until Done.
struct WarpExchange {
  explicit WarpExchange(const uint64_t* mine, size_t n) : block(*current_block) {
    base = threadIdx.x - threadIdx.x % kWarpSize;
    __syncwarp();
    std::copy(mine, mine + n, block.words.begin() + ptrdiff_t(threadIdx.x * Block::kWords));
    __syncwarp();
  }
  uint64_t read(unsigned lane, size_t i) const { return block.words[(base + lane) * Block::kWords + i]; }
  ~WarpExchange() { __syncwarp(); }
  Block& block;
  unsigned base = 0;
};

inline uint16_t LoadHalfBits(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// mma.sync.m16n8k16 with fp32 C/D, for the emulation's 16-bit type.
template <typename T>
void MmaM16N8K16(float* d, const uint32_t* a, const uint32_t* b) {
  static_assert(sizeof(T) == 2, "16-bit operands");
  const uint64_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  WarpExchange x(mine, 6);
  auto element = [&](unsigned lane, size_t reg, int high) {
    const uint32_t w = uint32_t(x.read(lane, reg));
    return kernels::BFloat16ToFloat(uint16_t(high ? w >> 16 : w & 0xFFFFu));
  };
  auto A = [&](int row, int k) {
    return element(unsigned((row % 8) * 4 + (k % 8) / 2), (row >= 8) + 2 * (k >= 8), k % 2);
  };
  auto B = [&](int k, int n) { return element(unsigned(n * 4 + (k % 8) / 2), 4 + (k >= 8), k % 2); };
  const int lane = int(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    d[e] = sum;
  }
}

inline void LdMatrixX4Impl(uint32_t* r, const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) EmulationFault("ldmatrix row address not 16-byte aligned", row);
  if (!InShared(row, 16)) EmulationFault("ldmatrix row address outside shared memory", row);
  const uint64_t mine[1] = {uint64_t(reinterpret_cast<uintptr_t>(row))};
  WarpExchange x(mine, 1);
  auto row_of = [&](unsigned lane) { return reinterpret_cast<const uint16_t*>(uintptr_t(x.read(lane, 0))); };
  const unsigned lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      lo = LoadHalfBits(row_of(8 * i + g) + 2 * t);
      hi = LoadHalfBits(row_of(8 * i + g) + 2 * t + 1);
    } else {
      lo = LoadHalfBits(row_of(8 * i + 2 * t) + g);
      hi = LoadHalfBits(row_of(8 * i + 2 * t + 1) + g);
    }
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}
inline void LdMatrixX4(uint32_t* r, const void* row) { LdMatrixX4Impl(r, row, false); }
inline void LdMatrixX4Trans(uint32_t* r, const void* row) { LdMatrixX4Impl(r, row, true); }

inline void CpAsync16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) EmulationFault("cp.async destination not 16-byte aligned", dst);
  if (!InShared(dst, 16)) EmulationFault("cp.async destination outside shared memory", dst);
  if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) EmulationFault("cp.async source not 16-byte aligned", src);
  if (current_scheduler->eager_copies) {  // lands now; again, unchanged, at its wait
    if (valid) {
      std::memcpy(dst, src, 16);
    } else {
      std::memset(dst, 0, 16);
    }
  }
  CurrentFiber().uncommitted_copies.push_back({dst, valid ? src : nullptr});
}
inline void CpAsyncCommit() {
  Fiber& me = CurrentFiber();
  me.committed_copies.push_back(std::move(me.uncommitted_copies));
  me.uncommitted_copies.clear();
}
template <int kPending>
void CpAsyncWait() {
  std::vector<std::vector<AsyncCopy>>& committed_copies = CurrentFiber().committed_copies;
  while (committed_copies.size() > size_t(kPending)) {
    for (const AsyncCopy& c : committed_copies.front()) {
      if (c.src != nullptr) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    committed_copies.erase(committed_copies.begin());
  }
}

inline float ShflXor(float v, int mask) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint64_t mine[1] = {bits};
  WarpExchange x(mine, 1);
  const uint32_t theirs = uint32_t(x.read((threadIdx.x % kWarpSize) ^ unsigned(mask), 0));
  float out;
  std::memcpy(&out, &theirs, sizeof out);
  return out;
}

inline void StoreShared32(void* p, uint32_t v) {
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0) EmulationFault("32-bit shared store not 4-byte aligned", p);
  if (!InShared(p, 4)) EmulationFault("32-bit shared store outside shared memory", p);
  std::memcpy(p, &v, sizeof v);
}
// Blocks run one at a time in launch order, so a count a block waits for must
// have been released by an earlier block already: one that is not would spin
// forever on a GPU whose earlier blocks are all done or resident.
inline void WaitForCount(const int* count, int want) {
  if (*count != want) {
    std::fprintf(stderr,
                 "warp emulation: block %u,%u waits for count %d, which reads %d: no earlier block released it\n",
                 blockIdx.x, blockIdx.y, want, *count);
    std::abort();
  }
}
inline void FenceDevice() {}
inline int TakeTicket(int* counter) { return (*counter)++; }
inline void ReleaseCount(int* count, int value) { *count = value; }
struct float2 {
  float x, y;
};
inline float2 LoadPairL2(const float* p) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) EmulationFault("float2 load not 8-byte aligned", p);
  return {p[0], p[1]};
}
inline void StorePairL2(float* p, float2 v) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) EmulationFault("float2 store not 8-byte aligned", p);
  p[0] = v.x;
  p[1] = v.y;
}
template <typename T>
uint32_t PackPair(float lo, float hi) {
  static_assert(sizeof(T) == 2, "16-bit pairs");
  return uint32_t(kernels::FloatToBFloat16(lo)) | uint32_t(kernels::FloatToBFloat16(hi)) << 16;
}

}  // namespace pstar::test::emulation

// WMMA, 16x16x16 only: lane 0 of each warp holds the whole tile.
namespace nvcuda::wmma {
inline bool HoldsTiles() { return threadIdx.x % pstar::test::emulation::kWarpSize == 0; }

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 tiles only");
  float x[16][16];
};

template <typename F>
void fill_fragment(F& f, float v) {
  if (!HoldsTiles()) return;
  for (auto& row : f.x) std::fill(std::begin(row), std::end(row), v);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_a, M, N, K, T, row_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = float(p[r * ld + c]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_b, M, N, K, T, row_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k][n] = float(p[k * ld + n]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_b, M, N, K, T, col_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k][n] = float(p[k + n * ld]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const float* p, unsigned ld, layout_t layout) {
  if (!HoldsTiles()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = layout == mem_row_major ? p[r * ld + c] : p[r + c * ld];
}
template <int M, int N, int K, typename T>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, T>& f, unsigned ld, layout_t layout) {
  __syncwarp();
  if (HoldsTiles()) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ld + c] : p[r + c * ld]) = f.x[r][c];
  }
  __syncwarp();
}
template <typename D, typename A, typename B, typename C>
void mma_sync(D& d, const A& a, const B& b, const C& c) {
  if (!HoldsTiles()) return;
  float out[16][16];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float s = c.x[m][n];
      for (int k = 0; k < 16; ++k) s += a.x[m][k] * b.x[k][n];
      out[m][n] = s;
    }
  }
  std::memcpy(d.x, out, sizeof out);
}
}  // namespace nvcuda::wmma
