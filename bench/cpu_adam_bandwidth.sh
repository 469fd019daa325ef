#!/usr/bin/env bash
# CPU Adam against the memory-bandwidth bound over a thread-count sweep: the
# hybrid-Adam host update of offloaded training runs on every core, so what
# matters is how close it stays to the bound as threads are added.
#
# bin/cpu_adam_bench (see bench/cpu_adam_vs_pytorch.sh) at each thread count:
# pstar's fused Adam on N fp32 parameters, and in the same process and
# threads the bound it is held to, a bandwidth / 28 bytes per parameter, with
# two bandwidths: "copy" (parallel memcpy, read + write bytes) and "traffic"
# (Adam's own 4-read/3-write streams with no arithmetic). At the largest
# thread count, PyTorch's torch.optim.Adam(foreach=True) on the same N too,
# where a python3 with PyTorch is found.
#
# Usage: bench/cpu_adam_bandwidth.sh [--dry-run] [--threads "1 2 4 8 16"] [--n N] [--iters K] [--log-dir DIR]
#   default threads: 1 2 4 8 16 up to the core count, and the core count
#   --dry-run  small N, few iterations, threads 1 and 2
# Environment: PSTAR_BUILD_DIR, PYTHON (bench/gpu_common.sh).
set -euo pipefail
# shellcheck source=bench/gpu_common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu_common.sh"

dry_run=0 threads="" n="" iters="" log_dir=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --threads) threads="$2"; shift ;;
    --n) n="$2"; shift ;;
    --iters) iters="$2"; shift ;;
    --log-dir) log_dir="$2"; shift ;;
    -h | --help) print_header; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
cores=$(nproc)
if [ "$dry_run" -eq 1 ]; then
  echo "DRY RUN: small N and few iterations; the figures are not a measurement"
  threads="${threads:-1 2}" n="${n:-4194304}" iters="${iters:-3}" copy_mib=64
else
  n="${n:-$((64 << 20))}" iters="${iters:-7}" copy_mib=512
  if [ -z "$threads" ]; then
    for t in 1 2 4 8 16; do [ "$t" -le "$cores" ] && threads="$threads $t"; done
    case " $threads " in *" $cores "*) ;; *) threads="$threads $cores" ;; esac
  fi
fi
log_dir="${log_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"
bench="$PSTAR_BUILD_DIR/bin/cpu_adam_bench"
[ -x "$bench" ] || die "$bench not found: ninja -C BUILD cpu_adam_bench (PSTAR_BUILD_DIR=BUILD)"
ensure_libs "$bench"
find_torch || true

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores;" \
     "adam: n=$n params, $iters timed iterations (median); threads: $threads"
printf "%7s %-7s %14s %11s %11s %13s %10s %13s %8s\n" threads isa "adam params/s" "adam GB/s" "copy GB/s" \
  "traffic GB/s" "adam/copy" "adam/traffic" scaling
first="" last_t=""
for t in $threads; do
  out=$(OMP_NUM_THREADS=$t "$bench" --n "$n" --iters "$iters" --copy-mib "$copy_mib")
  echo "$out" > "$log_dir/cpu_adam_t$t.log"
  p_line=$(grep '^pstar:' <<<"$out") c_line=$(grep '^copy:' <<<"$out") tr_line=$(grep '^traffic:' <<<"$out")
  p=$(field params_per_s "$p_line") isa=$(field isa "$p_line")
  cbw=$(field bytes_per_s "$c_line") cb=$(field bound_params_per_s "$c_line")
  tbw=$(field bytes_per_s "$tr_line") tb=$(field bound_params_per_s "$tr_line")
  first=${first:-$p}
  awk -v t="$t" -v isa="$isa" -v p="$p" -v cbw="$cbw" -v cb="$cb" -v tbw="$tbw" -v tb="$tb" -v f="$first" 'BEGIN {
    printf "%7d %-7s %14.3e %11.2f %11.2f %13.2f %9.0f%% %12.0f%% %7.2fx\n",
      t, isa, p, 28 * p / 1e9, cbw / 1e9, tbw / 1e9, 100 * p / cb, 100 * p / tb, p / f }'
  echo "cpu_adam: threads=$t isa=$isa params_per_s=$p adam_bytes_per_s=$(awk -v p="$p" 'BEGIN { printf "%.4e", 28 * p }')" \
       "copy_bytes_per_s=$cbw traffic_bytes_per_s=$tbw" >> "$log_dir/cpu_adam.txt"
  last_t=$t last_p=$p
done
echo "adam GB/s = 28 bytes per parameter x params/s; adam/copy and adam/traffic: params/s against each bound"

if [ -z "$TORCH_VERSION" ]; then
  echo "pytorch Adam: not measured: $TORCH_MISSING"
else
  torch_line=$("$PYTHON" "$bench_dir/torch_adam.py" --n "$n" --tensors 100 --iters "$iters" --threads "$last_t")
  echo "$torch_line" | tee -a "$log_dir/cpu_adam.txt"
  awk -v p="$last_p" -v t="$(field params_per_s "$torch_line")" -v n="$last_t" 'BEGIN {
    printf "pstar/pytorch at %d threads: %.2fx (pstar %.3g params/s, torch foreach %.3g params/s)\n", n, p / t, p, t }'
fi
