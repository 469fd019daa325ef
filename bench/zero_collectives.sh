#!/usr/bin/env bash
# ZeRO communication on this machine: ranks as processes over Gloo on
# loopback. Scaling is meaningless on two cores, so this reports, per step and
# per rank, the collective bytes sent against ZeRO-3's volume for ring
# collectives ((2*accum + 1) * (N-1)/N * param bytes: every param chunk
# gathered for forward and for backward, every grad chunk reduce-scattered
# once), and the share of the step spent in collectives that no compute hid.
# Usage: bench/zero_collectives.sh [steps]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-8}"
L=4 NH=4 C=256 V=1024 T=128 GB=8 CHUNK=262144
echo "shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T global_batch=$GB steps=$steps chunk=$CHUNK elements"
printf "%-6s %-10s %16s %16s %8s %10s %12s\n" ranks device "sent B/step" "ZeRO-3 B/step" ratio "s/step" "comm share"
for n in 2 4; do
  for budget in all tight; do
    job=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
         --set "train={batch_size: $((GB / n)), seq_len: $T, steps: $steps, log_every: 1000}"
         --set "data={source: generated, generated_tokens: 1048576}" --set "default_chunk_size=$CHUNK")
    if [[ $budget == tight ]]; then
      min=$("$pstar" plan "${job[@]}" --world-size "$n" --json | sed -nE 's/.*"min_device_bytes": ([0-9]+).*/\1/p')
      job+=(--set "runtime.device_memory=$min")
    fi
    out=$("$pstar" launch --nproc-per-node "$n" --master-port $((29900 + n)) -- train "${job[@]}")
    coll=$(grep '^collectives:' <<<"$out")
    sum=$(grep '^summary:' <<<"$out")
    sent=$(sed -E 's/.*sent_bytes_per_step=([0-9]+).*/\1/' <<<"$coll")
    ref=$(sed -E 's/.*zero3_bytes_per_step=([0-9]+).*/\1/' <<<"$coll")
    comm=$(sed -E 's/.* seconds_total=([0-9.]+).*/\1/' <<<"$coll")
    secs=$(sed -E 's/.*seconds=([0-9.]+) tokens_per_s.*/\1/' <<<"$sum")
    awk -v n="$n" -v b="$budget" -v s="$sent" -v r="$ref" -v c="$comm" -v t="$secs" -v k="$steps" \
      'BEGIN { printf "%-6d %-10s %16d %16d %8.2f %10.3f %11.0f%%\n", n, b, s, r, s / r, t / k, 100 * c / t }'
  done
done
echo "comm share: seconds inside collectives / wall seconds of the run (rank 0). The CPU backend's"
echo "collectives are synchronous, so none of that time overlaps compute."
