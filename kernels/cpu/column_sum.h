// Column sums of a row-major (N, C) matrix added into acc (C), in row order
// whatever the thread count: the deterministic reduction behind bias and norm
// weight gradients.
#pragma once
#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace pstar::kernels::cpu {

// acc[c] += sum_n f(n, c) for each column c; f is evaluated once per element.
template <typename F>
void AccumulateColumns(float* acc, int64_t N, int64_t C, F f) {
#pragma omp parallel
  {
    int nthreads = omp_get_num_threads();
    int tid = omp_get_thread_num();
    int64_t per = (C + nthreads - 1) / nthreads;
    int64_t c0 = std::min<int64_t>(C, tid * per), c1 = std::min<int64_t>(C, c0 + per);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = c0; c < c1; ++c) acc[c] += f(n, c);
    }
  }
}

}  // namespace pstar::kernels::cpu
