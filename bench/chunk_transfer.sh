#!/usr/bin/env bash
# Chunk transfer efficiency on one GPU, two figures:
#
#  1. Bandwidth: chunk copies through the CUDA DeviceBackend against a plain
#     pinned cudaMemcpyAsync of the same size, H2D, D2H and both at once, for
#     chunk sizes 16 to 256 MiB (bin/chunk_transfer_bench). Target: the
#     backend at >= 90% of the plain copy.
#  2. Overlap: the share of the chunk copy time hidden behind compute while
#     training the largest offloaded shape, from `pstar train --profile`:
#       idle   = step time - op time   (the compute stream waiting, for
#                copies or for the host)
#       moves  = h2d seconds + d2h seconds (copy-stream busy time)
#       hidden = 1 - min(1, idle / moves)
#     Every idle moment is charged to the copies, so this leans low; copies
#     inside the optimizer phase count as op time (the profiler times the
#     `adam` phase whole), which leans the other way. Both inputs are printed.
#
# Usage: bench/chunk_transfer.sh [--dry-run] [--log-dir DIR] [--sizes-mib 16,32,...] [--layers L]
#                                [--steps N] [--skip-bandwidth] [--skip-overlap]
#   --layers   the shape of bench/gpu_offload_scale.sh to profile (width 4096, 32
#              heads, seq 1024); default: DIR/offload_largest.env from that script,
#              else 24 layers
#   --dry-run  on the CPU: the bandwidth benchmark reports that it skips, the
#              overlap runs a tiny shape on the CPU backend (copies are memcpy
#              there, none is hidden)
# Environment: PSTAR_BUILD_DIR, BATCH (16), CHECKPOINT (1), DEVICE_MEMORY, as
#   bench/gpu_offload_scale.sh; RUN_TIMEOUT (480 s).
set -euo pipefail
# shellcheck source=bench/gpu_common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu_common.sh"

dry_run=0 log_dir="" sizes="16,32,64,128,256" layers="" steps="" skip_bw=0 skip_overlap=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --log-dir) log_dir="$2"; shift ;;
    --sizes-mib) sizes="$2"; shift ;;
    --layers) layers="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --skip-bandwidth) skip_bw=1 ;;
    --skip-overlap) skip_overlap=1 ;;
    -h | --help) print_header; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
log_dir="${log_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"
require_pstar
detect_gpu
[ "$dry_run" -eq 1 ] && echo "DRY RUN on the CPU: no GPU figures below"
describe_gpu

# --- 1. bandwidth --------------------------------------------------------------
if [ "$skip_bw" -eq 0 ]; then
  echo
  echo "== chunk copies: DeviceBackend against plain cudaMemcpyAsync (pinned), sizes $sizes MiB"
  bench="$PSTAR_BUILD_DIR/bin/chunk_transfer_bench"
  if [ ! -x "$bench" ]; then
    echo "not measured: $bench not found (a build with CUDA makes it: ninja chunk_transfer_bench)"
  else
    ensure_libs "$bench"
    set +e
    "$bench" --sizes-mib "$sizes" 2>&1 | tee "$log_dir/transfer_bandwidth.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || echo "chunk_transfer_bench failed (exit $rc)"
    if grep -q '^transfer:' "$log_dir/transfer_bandwidth.log"; then
      printf "%-5s %9s %14s %14s %8s\n" dir "size MiB" "backend GB/s" "plain GB/s" ratio
      awk '/^transfer:/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
             printf "%-5s %9s %14s %14s %7.0f%%\n", v["dir"], v["size_mib"], v["backend_gbps"], v["plain_gbps"], 100 * v["ratio"] }' \
        "$log_dir/transfer_bandwidth.log"
    fi
  fi
fi

# --- 2. overlap ----------------------------------------------------------------
[ "$skip_overlap" -eq 1 ] && exit 0
echo
if [ "$dry_run" -eq 1 ]; then
  L=${layers:-4} C=128 NH=4 T=64 V=512 batch=${BATCH:-2} device=cpu precision=fp32
  steps=${steps:-4}
else
  if [ -z "$layers" ] && [ -f "$log_dir/offload_largest.env" ]; then
    layers=$(sed -n 's/^offload_largest_layers=//p' "$log_dir/offload_largest.env")
  fi
  L=${layers:-24} C=4096 NH=32 T=1024 V=50257 batch=${BATCH:-16} device=cuda precision=bf16
  steps=${steps:-4}
fi
ckpt=$([ "${CHECKPOINT:-1}" = 1 ] && echo true || echo false)
echo "== overlap: pstar train --profile, $L layers, width $C, seq $T, batch $batch, $steps steps"
args=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
      --set "runtime.device=$device" --set "train.precision=$precision" --set "train.batch_size=$batch"
      --set "train.seq_len=$T" --set "train.activation_checkpointing=$ckpt" --set "train.steps=$steps"
      --set train.log_every=1 --set data.source=generated)
if [ "$dry_run" -eq 1 ]; then
  # An emulated tier of activations plus half the model data: chunks move.
  plan=$("$pstar" plan "${args[@]}" --json)
  tier=$(awk -v a="$(plan_field activation_bytes "$plan")" -v m="$(plan_field model_bytes "$plan")" \
    'BEGIN { printf "%d", a + int(m / 2) }')
  args+=(--set "runtime.device_memory=$tier")
elif [ -n "${DEVICE_MEMORY:-}" ]; then
  args+=(--set "runtime.device_memory=$(to_bytes "$DEVICE_MEMORY")")
fi

if ! "$pstar" train --profile --print-config > /dev/null 2>&1; then
  echo "overlap: TODO, not measured: this pstar has no 'train --profile' (the profile: block with the" \
       "time of each copy direction); rebuild from a tree that has it and rerun this script"
  exit 0
fi
log="$log_dir/transfer_overlap_L${L}.log"
set +e
timeout "${RUN_TIMEOUT:-480}" "$pstar" train "${args[@]}" --profile > "$log" 2>&1
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "overlap: not measured: the profiled run failed (exit $rc; log $log):"
  tail -3 "$log" | sed 's/^/  /'
  exit 0
fi
grep -E '^(memory|summary|chunks):' "$log"
sed -n '/^profile:/,$p' "$log" | grep -E '^profile:|^  move' || true
if ! grep -q '^profile:' "$log"; then
  echo "overlap: TODO, not measured: the run printed no profile: block (log $log)"
  exit 0
fi
awk '
  /^profile:/ {
    for (i = 1; i <= NF; ++i) {
      if ($i == "time" && $(i - 1) == "step") step = $(i + 1)
      if ($i == "ops") ops = $(i + 1)
    }
  }
  /^  move/ { moves[$2] = $5; total += $5 }
  END {
    if (step == "" || ops == "") { print "overlap: TODO, not measured: the profile: line has no step or op time"; exit }
    idle = step - ops; if (idle < 0) idle = 0
    if (total <= 0) { printf "overlap: no chunk copies in the measured steps (step %.3f s): nothing to hide\n", step; exit }
    exposed = idle < total ? idle : total
    printf "overlap: step %.4f s, ops %.4f s, compute idle %.4f s; copies h2d %.4f s + d2h %.4f s = %.4f s\n",
      step, ops, idle, moves["h2d"], moves["d2h"], total
    printf "overlap: hidden share of copy time %.0f%% (1 - min(1, idle / copies)), %.0f%% of the step exposed at most\n",
      100 * (1 - exposed / total), 100 * exposed / step
  }' "$log" | tee "$log_dir/transfer_overlap.txt"
