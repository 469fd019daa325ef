#!/usr/bin/env bash
# Heterogeneous training on the CPU backend: the device tier holds 100%, 50%
# and 25% of the model data (plus the activations), with OPT and with LRU
# eviction. Prints step time against the all-resident run and the chunk bytes
# moved per step (after the warm-up step) for OPT against LRU, in one run.
# Usage: bench/chunk_training.sh [steps]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-12}"
L=6 NH=6 C=384 V=2048 T=128 B=4 CHUNK=1048576
job=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
     --set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1000, grad_clip: 1.0}"
     --set "data={source: generated, generated_tokens: 1048576}"
     --set "default_chunk_size=$CHUNK" --set "runtime.prefetch_depth=${PREFETCH:-2}")

plan=$("$pstar" plan "${job[@]}" --json)
field() { sed -nE "s/.*\"$1\": ([0-9]+).*/\1/p" <<<"$plan" | head -1; }
model=$(field model_bytes) acts=$(field activation_bytes) min=$(field min_device_bytes)
echo "shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T batch=$B steps=$steps chunk=$CHUNK elements"
echo "model data $model bytes, activations $acts bytes, minimum device tier $min bytes"

run() {  # fraction policy -> "seconds_per_step h2d_per_step d2h_per_step"
  local budget
  # 100%: device_memory 0, the tier sized for everything (no margin held back).
  budget=$(awk -v a="$acts" -v m="$model" -v f="$1" -v lo="$min" \
    'BEGIN { b = a + int(m * f); if (b < lo) b = lo; if (f >= 1) b = 0; printf "%d", b }')
  local out
  out=$("$pstar" train "${job[@]}" --set "runtime.device_memory=$budget" --set "runtime.eviction=$2")
  local sum chunks
  sum=$(grep '^summary:' <<<"$out")
  chunks=$(grep '^chunks:' <<<"$out")
  local secs tps h2d d2h
  secs=$(sed -E 's/.*seconds=([0-9.]+).*/\1/' <<<"$sum")
  h2d=$(sed -E 's/.* h2d_bytes_per_step=([0-9]+).*/\1/' <<<"$chunks")
  d2h=$(sed -E 's/.*d2h_bytes_per_step=([0-9]+).*/\1/' <<<"$chunks")
  awk -v s="$secs" -v n="$steps" -v h="$h2d" -v d="$d2h" 'BEGIN { printf "%.4f %d %d\n", s / n, h, d }'
}

printf "%-9s %-6s %14s %16s %16s\n" "device" "policy" "s/step" "h2d bytes/step" "d2h bytes/step"
declare -A t moved
for f in 1.0 0.5 0.25; do
  for p in opt lru; do
    read -r s h d < <(run "$f" "$p")
    t[$f$p]=$s moved[$f$p]=$((h + d))
    printf "%-9s %-6s %14s %16s %16s\n" "$(awk -v f="$f" 'BEGIN{printf "%d%%", f*100}')" "$p" "$s" "$h" "$d"
  done
done
for f in 0.5 0.25; do
  awk -v f="$f" -v a="${t[1.0opt]}" -v o="${t[${f}opt]}" -v mo="${moved[${f}opt]}" -v ml="${moved[${f}lru]}" \
    'BEGIN { printf "device %d%%: step time %.2fx the all-resident run; bytes moved OPT/LRU %.2f\n",
             f * 100, o / a, (ml > 0 ? mo / ml : 0) }'
done
