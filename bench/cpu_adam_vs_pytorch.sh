#!/usr/bin/env bash
# CPU Adam throughput: pstar's fused SIMD kernel against torch.optim.Adam
# (foreach=True, Debian's python3-torch) and against the memory-bandwidth
# bound (parallel memcpy bytes/s / 28 bytes per parameter; also Adam's own
# access pattern without arithmetic), in one run on this machine with the same
# thread count.
# Usage: bench/cpu_adam_vs_pytorch.sh [n_params]   (default 64M = 67108864)
#   ITERS=K sets the timed iterations (default 7, median reported).
#   Build first: scripts/build.sh (PSTAR_BUILD_DIR picks the build directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="${PSTAR_BUILD_DIR:-$root/build}/bin/cpu_adam_bench"
n="${1:-$((64 << 20))}"
iters="${ITERS:-7}"
threads=$(nproc)

echo "adam: n=$n params, threads=$threads, iters=$iters (median), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
pstar_out=$(OMP_NUM_THREADS=$threads "$bench" --n "$n" --iters "$iters")
torch_line=$(/usr/bin/python3 "$root/bench/torch_adam.py" --n "$n" --tensors 100 \
  --iters "$iters" --threads "$threads")
echo "$pstar_out"
echo "$torch_line"

field() { sed -E "s/.*[ ]$1=([^ ]+).*/\1/" <<<"$2"; }
pstar_line=$(grep '^pstar:' <<<"$pstar_out")
copy_line=$(grep '^copy:' <<<"$pstar_out")
isa=$(field isa "$pstar_line")
p=$(field params_per_s "$pstar_line")
t=$(field params_per_s "$torch_line")
bw=$(field bytes_per_s "$copy_line")
bound=$(field bound_params_per_s "$copy_line")
traffic_line=$(grep '^traffic:' <<<"$pstar_out")
traffic=$(field bound_params_per_s "$traffic_line")
traffic_bw=$(field bytes_per_s "$traffic_line")
echo "isa path: $isa"
awk -v p="$p" -v t="$t" 'BEGIN {
  printf "pstar/torch: %.2fx (pstar %.3g params/s, torch foreach %.3g params/s)\n", p / t, p, t }'
awk -v p="$p" -v b="$bound" -v bw="$bw" 'BEGIN {
  printf "pstar/bound: %.0f%% (bound %.3g params/s = copy %.2f GB/s read+write / 28 B per param)\n",
    100 * p / b, b, bw / 1e9 }'
awk -v p="$p" -v b="$traffic" -v bw="$traffic_bw" 'BEGIN {
  printf "pstar/traffic: %.0f%% (same 4-read/3-write streams without arithmetic: %.2f GB/s, %.3g params/s)\n",
    100 * p / b, bw / 1e9, b }'
