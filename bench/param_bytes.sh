#!/usr/bin/env bash
# Param bytes moved per step, bf16 (16-bit parameter chunks) against fp32, at
# one device budget: the fp32 run's minimum, where every param chunk streams
# for every use. CPU backend (its emulated tier moves and counts chunks as a
# GPU's would); the counts are exact, not timings. Prints both and the ratio.
# Usage: bench/param_bytes.sh [steps]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-4}"
L=6 NH=6 C=384 V=8192 T=256 B=4 CHUNK=4194304
job=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
     --set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1000}"
     --set "data={source: generated, generated_tokens: 1048576}"
     --set "default_chunk_size=$CHUNK" --set runtime.device=cpu)

min=$("$pstar" plan "${job[@]}" --set train.precision=fp32 --json |
      sed -nE 's/.*"min_device_bytes": ([0-9]+).*/\1/p' | head -1)
echo "shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T batch=$B steps=$steps chunk=$CHUNK elements"
echo "device tier: $min bytes (the fp32 run's minimum)"

param_bytes() {  # precision -> param bytes moved host to device per step after the first
  "$pstar" train "${job[@]}" --set "train.precision=$1" --set "runtime.device_memory=$min" |
    sed -nE 's/^chunks:.* param_h2d_bytes_per_step=([0-9]+).*/\1/p'
}
fp32=$(param_bytes fp32)
bf16=$(param_bytes bf16)
[ -n "$fp32" ] && [ -n "$bf16" ] && [ "$fp32" -gt 0 ] || { echo "param_bytes.sh: no chunk summary" >&2; exit 1; }
printf "%-10s %20s\n" precision "param bytes/step"
printf "%-10s %20d\n" fp32 "$fp32" bf16 "$bf16"
awk -v a="$bf16" -v b="$fp32" 'BEGIN { printf "bf16 / fp32: %.3f (target <= 0.5)\n", a / b }'
