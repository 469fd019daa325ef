#include "worker/runtime/runtime_error.h"

#include <cstdio>
#include <cstdlib>

namespace pstar {

void RuntimeBug(const std::string& what) {
  std::fprintf(stderr, "pstar: internal error: %s\n", what.c_str());
  std::abort();
}

}  // namespace pstar
