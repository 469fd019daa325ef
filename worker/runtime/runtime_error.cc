#include "worker/runtime/runtime_error.h"

#include <cstdio>
#include <cstdlib>

namespace pstar {

void RuntimeBug(const std::string& what) {
  std::fprintf(stderr, "pstar: internal error: %s\n", what.c_str());
  std::abort();
}

void CollectiveFailed(int rank, const std::string& what) {
  std::fprintf(stderr, "pstar: error: rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace pstar
