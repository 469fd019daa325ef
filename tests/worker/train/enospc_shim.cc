// An LD_PRELOAD library for tests: pwrite and pwrite64 to the disk tier's
// files (pstar-chunks-rank*.bin) fail with ENOSPC once
// PSTAR_TEST_ENOSPC_AFTER_BYTES bytes have been written to them, as a disk
// that fills up mid-run does. Every other write passes through.
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<long long> budget_left{-2};  // -2: not read yet; -1: no limit

int IsDiskTierFile(int fd) {
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t len = readlink(link, path, sizeof path - 1);
  if (len <= 0) return 0;
  path[len] = '\0';
  return std::strstr(path, "pstar-chunks-rank") != nullptr;
}

// Whether `bytes` more may be written; charges them when so.
bool Allowed(size_t bytes) {
  if (budget_left.load() == -2) {
    const char* env = std::getenv("PSTAR_TEST_ENOSPC_AFTER_BYTES");
    long long expected = -2;
    budget_left.compare_exchange_strong(expected, env != nullptr ? std::atoll(env) : -1);
  }
  long long left = budget_left.load();
  for (;;) {
    if (left == -1) return true;
    if (static_cast<long long>(bytes) > left) return false;
    if (budget_left.compare_exchange_weak(left, left - static_cast<long long>(bytes))) return true;
  }
}

using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);

ssize_t Write(const char* name, int fd, const void* buf, size_t n, off_t offset) {
  auto real = reinterpret_cast<PwriteFn>(dlsym(RTLD_NEXT, name));
  if (IsDiskTierFile(fd) && !Allowed(n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, offset);
}

}  // namespace

extern "C" ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) { return Write("pwrite", fd, buf, n, offset); }
extern "C" ssize_t pwrite64(int fd, const void* buf, size_t n, off_t offset) {
  return Write("pwrite64", fd, buf, n, offset);
}
