// Column partitioning for OpenMP threads, and column sums of a row-major (N, C)
// matrix added into acc (C) in row order
// whatever the thread count: the deterministic reduction behind bias and norm
// weight gradients.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>

#include <omp.h>

namespace pstar::kernels::cpu {

// The calling thread's share [first, second) of C columns inside an OpenMP
// parallel region: contiguous, disjoint, covering all columns.
inline std::pair<int64_t, int64_t> ThreadColumns(int64_t C) {
  int nthreads = omp_get_num_threads();
  int tid = omp_get_thread_num();
  int64_t per = (C + nthreads - 1) / nthreads;
  int64_t c0 = std::min<int64_t>(C, tid * per);
  return {c0, std::min<int64_t>(C, c0 + per)};
}

// acc[c] += sum_n f(n, c) for each column c; f is evaluated once per element.
template <typename F>
void AccumulateColumns(float* acc, int64_t N, int64_t C, F f) {
#pragma omp parallel
  {
    auto [c0, c1] = ThreadColumns(C);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = c0; c < c1; ++c) acc[c] += f(n, c);
    }
  }
}

}  // namespace pstar::kernels::cpu
