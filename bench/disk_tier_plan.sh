#!/usr/bin/env bash
# The largest width-4096 GPT `pstar plan` places on one 80 GB GPU, a 128 GiB
# host and 1 TiB of NVMe (the disk tier), against the same machine without
# the disk. Plan arithmetic only: nothing is allocated or measured. Target:
# >= 25B parameters with the disk tier.
#
# Shapes as bench/gpu_offload_scale.sh: width 4096, 32 heads, seq 1024, vocab
# 50257, bf16 with 16-bit gradient homes, activation checkpointing, batch 8;
# the GPU tier 0.8 x 80 GiB, the host budget 0.8 x 128 GiB. Chunks are as
# small as the embedding allows (padded vocab 50304 x width elements, 786
# MiB), for both runs: the disk tier's host windows (12 shards) and the
# host's one-chunk buffers scale with the chunk, not the model.
#
# Usage: bench/disk_tier_plan.sh [--batch B] [--nvme-gib G] [--host-gib H] [--gpu-gib G]
# Environment: PSTAR_BUILD_DIR (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
[ -x "$pstar" ] || { echo "disk_tier_plan.sh: $pstar is missing: build first" >&2; exit 2; }
batch=8 nvme_gib=1024 host_gib=128 gpu_gib=80
while [ "$#" -gt 0 ]; do
  case "$1" in
    --batch) batch="$2"; shift ;;
    --nvme-gib) nvme_gib="$2"; shift ;;
    --host-gib) host_gib="$2"; shift ;;
    --gpu-gib) gpu_gib="$2"; shift ;;
    *) echo "disk_tier_plan.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
host_budget=$(awk -v g="$host_gib" 'BEGIN { printf "%.0f", 0.8 * g * 2^30 }')
gpu_tier=$(awk -v g="$gpu_gib" 'BEGIN { printf "%.0f", 0.8 * g * 2^30 }')
nvme_bytes=$(awk -v g="$nvme_gib" 'BEGIN { printf "%.0f", g * 2^30 }')
nvme_dir="$(mktemp -d)"
trap 'rm -rf "$nvme_dir"' EXIT

field() { sed -nE "s/.*\"$1\": \"?([^,\"}]*)\"?.*/\1/p" <<< "$2" | head -1; }
gib() { awk -v b="$1" 'BEGIN { printf "%.1f GiB", b / 2^30 }'; }

# plan LAYERS DISK -> the plan's JSON, or nothing when the plan refuses the shape
plan() {
  local args=(--set "model={n_layer: $1, n_head: 32, n_embd: 4096, vocab_size: 50257, max_seq_len: 1024}"
              --set runtime.device=cuda --set train.precision=bf16 --set train.grad_precision=16bit
              --set train.activation_checkpointing=true --set "train.batch_size=$batch" --set train.seq_len=1024
              --set "runtime.device_memory=$gpu_tier" --set "runtime.host_memory=$host_budget"
              --set "default_chunk_size=$((50304 * 4096))")
  [ "$2" = disk ] && args+=(--set "runtime.nvme_path=$nvme_dir" --set "runtime.nvme_memory=$nvme_bytes")
  "$pstar" plan "${args[@]}" --json 2>/dev/null || true
}
fits() {  # layers disk -> 0 when it fits
  local p
  p=$(plan "$1" "$2")
  [ -n "$p" ] && [ "$(field min_host_bytes "$p")" -le "$host_budget" ]
}
largest() {  # disk -> the most layers that fit (binary search up to 400)
  local lo=1 hi=400 mid
  fits 1 "$1" || { echo 0; return; }
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if fits "$mid" "$1"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
echo "machine: GPU tier $(gib "$gpu_tier"), host budget $(gib "$host_budget"), NVMe $(gib "$nvme_bytes"); batch $batch"
for where in host disk; do
  L=$(largest "$where")
  p=$(plan "$L" "$where")
  printf "%-5s largest: %d layers, %s parameters | host min %s | disk %s (moments of %s chunks, masters of %s) | homed on the GPU %s\n" \
    "$where" "$L" "$(field parameters "$p")" "$(gib "$(field min_host_bytes "$p")")" \
    "$(gib "$(field disk_bytes "$p")")" "$(field disk_moment_chunks "$p")" "$(field disk_master_chunks "$p")" \
    "$(gib "$(field device_home_bytes "$p")")"
  [ "$where" = disk ] && awk -v n="$(field parameters "$p")" 'BEGIN {
    printf "target: >= 25B parameters with the disk tier: %s (%.2fB)\n", (n >= 25e9 ? "met" : "NOT met"), n / 1e9 }'
done
