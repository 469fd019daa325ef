// The disk tier's bandwidth against a plain O_DIRECT sequential copy of the
// same bytes on the same disk, in one run (bench/disk_tier.sh drives it).
//
//  plain:  one file, written then read front to back with O_DIRECT in
//          --request-mib requests by one thread, one request at a time: the
//          simplest copy a program could do, and the disk's sequential rate.
//  tier:   a DiskTier of --gib GiB in homes of --home-mib MiB (a chunk shard),
//          written through its windows as the optimizer does (open, fill,
//          move on: write-behind), then read back with read-ahead 2.
//
// Each round times plain and tier in turn, so a change in the machine's load
// hits both; figures are medians over --rounds. Prints one line each:
//   plain: bytes=B write_s=.. read_s=.. write_bytes_per_s=.. read_bytes_per_s=..
//   tier: bytes=B direct=1 threads=T write_s=.. read_s=.. write_bytes_per_s=.. read_bytes_per_s=..
//   ratio: write=.. read=..
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/runtime/disk_tier.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "disk_tier_bench: %s\n", what.c_str());
  std::exit(1);
}

// The plain copy: returns {write seconds, read seconds}.
std::pair<double, double> Plain(const std::string& path, int64_t bytes, int64_t request, std::byte* buffer) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) Die("cannot open " + path + " with O_DIRECT: " + std::strerror(errno));
  if (::posix_fallocate(fd, 0, bytes) != 0) Die("cannot allocate " + std::to_string(bytes) + " bytes at " + path);
  auto start = Clock::now();
  for (int64_t off = 0; off < bytes; off += request) {
    if (::pwrite(fd, buffer, size_t(request), off) != request) Die("plain write failed");
  }
  ::fdatasync(fd);
  const double write_s = Seconds(start);
  start = Clock::now();
  for (int64_t off = 0; off < bytes; off += request) {
    if (::pread(fd, buffer, size_t(request), off) != request) Die("plain read failed");
  }
  const double read_s = Seconds(start);
  ::close(fd);
  ::unlink(path.c_str());
  return {write_s, read_s};
}

std::pair<double, double> Tier(const std::string& dir, int64_t bytes, int64_t home, int threads, bool* direct) {
  pstar::DiskTier::Shape shape;
  shape.directory = dir;
  shape.rank = 0;
  shape.home_bytes = home;
  shape.homes = int32_t(bytes / home);
  shape.windows = 2 * (1 + 2) + 2;  // as TierLayout::DiskWindows for read-ahead 2, per kind pair
  shape.io_threads = threads;
  auto tier = pstar::DiskTier::Create(shape);
  if (!tier.ok()) Die(tier.status().message());
  *direct = (*tier)->direct();
  auto start = Clock::now();
  for (int32_t h = 0; h < shape.homes; ++h) {
    (*tier)->UnpinAll();
    float* w = (*tier)->Open(h, /*zero=*/true, /*write=*/true);
    w[0] = float(h);
  }
  (*tier)->UnpinAll();
  (*tier)->Sync();
  const double write_s = Seconds(start);
  start = Clock::now();
  float sum = 0;
  for (int32_t h = 0; h < shape.homes; ++h) {
    (*tier)->UnpinAll();
    sum += (*tier)->Open(h, false, false)[0];
    for (int32_t a = 1; a <= 2 && h + a < shape.homes; ++a) (*tier)->ReadAhead(h + a);
  }
  const double read_s = Seconds(start);
  if (sum != float(shape.homes) * float(shape.homes - 1) / 2) Die("the tier read back other bytes");
  return {write_s, read_s};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double gib = 1.0;
  int64_t home_mib = 64, request_mib = 8;
  int rounds = 3, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir") dir = next();
    else if (a == "--gib") gib = std::stod(next());
    else if (a == "--home-mib") home_mib = std::stoll(next());
    else if (a == "--request-mib") request_mib = std::stoll(next());
    else if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else Die("unknown argument " + a + " (--dir D [--gib G] [--home-mib M] [--request-mib M] [--rounds N] [--threads T])");
  }
  if (dir.empty()) Die("--dir is required");
  const int64_t home = home_mib << 20, request = request_mib << 20;
  const int64_t bytes = std::max<int64_t>(1, int64_t(gib * double(int64_t{1} << 30)) / home) * home;
  auto* buffer = static_cast<std::byte*>(std::aligned_alloc(4096, size_t(request)));
  std::memset(buffer, 7, size_t(request));
  std::vector<double> pw, pr, tw, tr;
  bool direct = false;
  for (int r = 0; r < rounds; ++r) {
    auto [w, rd] = Plain(dir + "/plain-o-direct.bin", bytes, request, buffer);
    pw.push_back(w);
    pr.push_back(rd);
    auto [tw1, tr1] = Tier(dir, bytes, home, threads, &direct);
    tw.push_back(tw1);
    tr.push_back(tr1);
  }
  std::free(buffer);
  const double b = double(bytes);
  std::printf("plain: bytes=%lld request=%lld write_s=%.4f read_s=%.4f write_bytes_per_s=%.4g read_bytes_per_s=%.4g\n",
              (long long)bytes, (long long)request, Median(pw), Median(pr), b / Median(pw), b / Median(pr));
  std::printf("tier: bytes=%lld home=%lld direct=%d threads=%d write_s=%.4f read_s=%.4f write_bytes_per_s=%.4g "
              "read_bytes_per_s=%.4g\n",
              (long long)bytes, (long long)home, direct ? 1 : 0, threads, Median(tw), Median(tr), b / Median(tw),
              b / Median(tr));
  std::printf("ratio: write=%.3f read=%.3f\n", Median(pw) / Median(tw), Median(pr) / Median(tr));
  return 0;
}
