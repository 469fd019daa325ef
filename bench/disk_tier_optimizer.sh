#!/usr/bin/env bash
# The optimizer phase with its state homed on disk against its two floors, in
# one run: the same Adam with every chunk in RAM, and the disk bytes it moves
# over the plain O_DIRECT bandwidth of the same disk (bin/disk_tier_bench's
# plain copy, measured here). Target: adam(disk) <= 1.1 x max(the floors);
# equal to the larger floor means the I/O and the arithmetic overlap fully.
#
# The model: a bf16 GPT (so the fp32 masters go to disk with the moments: 12
# bytes per parameter read and written each step) on the CPU backend, every
# chunk resident on the emulated device except what the optimizer updates on
# the host (use_hybrid_adam false). Times are the profiler's `adam` op
# (pstar train --profile), per step, the first step left out. Chunks are the
# embedding's size, so the disk homes far outnumber the host windows and
# every step reads and writes them all.
#
# Usage: bench/disk_tier_optimizer.sh [--dir DIR] [--layers L] [--width C] [--steps N]
#                                     [--rounds R] [--read-ahead K] [--io-threads T]
#   --dir   a directory on the disk to measure (default: a fresh one under
#           $TMPDIR, else /var/tmp)
#   --rounds  runs with the disk tier, each between two plain copies (3)
#   --read-ahead, --io-threads  runtime.nvme_read_ahead and nvme_io_threads
#           (default: the config's defaults)
# Environment: PSTAR_BUILD_DIR (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
pstar="$build/bin/pstar" bench="$build/bin/disk_tier_bench"
for b in "$pstar" "$bench"; do [ -x "$b" ] || { echo "disk_tier_optimizer.sh: $b is missing: build first" >&2; exit 2; }; done
dir="" L=24 C=512 steps=5 rounds=3 tier=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift ;;
    --layers) L="$2"; shift ;;
    --width) C="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --read-ahead) tier+=(--set "runtime.nvme_read_ahead=$2"); shift ;;
    --io-threads) tier+=(--set "runtime.nvme_io_threads=$2"); shift ;;
    *) echo "disk_tier_optimizer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
own=""
if [ -z "$dir" ]; then
  own="$(mktemp -d "${TMPDIR:-/var/tmp}/pstar-disk-opt-XXXXXX")"
  dir="$own"
fi
trap '[ -z "$own" ] || rm -rf "$own"' EXIT
job=(--set "model={n_layer: $L, n_head: 8, n_embd: $C, vocab_size: 8192, max_seq_len: 128}"
     --set "train={batch_size: 2, seq_len: 128, steps: $steps, log_every: 1000, precision: bf16}"
     --set "data={source: generated, generated_tokens: 1048576}"
     --set optimizer.params.use_hybrid_adam=false
     --set "default_chunk_size=$((8192 * C))")
adam_per_step() {  # profile output -> seconds of the adam op per step
  awk '/^profile:/ { steps = $2 } $1 == "op" && $2 == "adam" { printf "%.4f", $5 / steps }'
}
echo "disk: $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' ')"
# A shared disk's rate drifts: the plain copy is measured just before and
# just after each run with the disk tier, and its floor takes their mean.
plain_rates() {  # GiB -> "read_bytes_per_s write_bytes_per_s"
  local p
  p="$("$bench" --dir "$dir" --gib "$1" --rounds 1 | grep '^plain:')"
  echo "$(sed -nE 's/.*read_bytes_per_s=([0-9.e+]+).*/\1/p' <<< "$p") $(sed -nE 's/.*write_bytes_per_s=([0-9.e+]+).*/\1/p' <<< "$p")"
}
ram_out="$("$pstar" train "${job[@]}" --profile)"
ram=$(adam_per_step <<< "$ram_out")
probe="$("$pstar" plan "${job[@]}" --set "runtime.nvme_path=$dir" ${tier[@]+"${tier[@]}"} --json)"
gib=$(awk -v b="$(sed -nE 's/.*"disk_bytes": ([0-9]+).*/\1/p' <<< "$probe")" \
      'BEGIN { g = 2 * b / 2^30; if (g < 0.25) g = 0.25; printf "%.2f", g }')
echo "adam in RAM: $ram s/step"
# Rounds alternate the plain copy and the run with the disk tier; each run is
# judged against the mean of the plain rates just before and just after it,
# and the summary is the median of the rounds' ratios.
read -r r_prev w_prev <<< "$(plain_rates "$gib")"
ratios=()
for ((round = 1; round <= rounds; ++round)); do
  disk_out="$("$pstar" train "${job[@]}" --set "runtime.nvme_path=$dir" ${tier[@]+"${tier[@]}"} --profile)"
  read -r r_next w_next <<< "$(plain_rates "$gib")"
  [ "$round" -gt 1 ] || echo "$disk_out" | grep -E '^(model|disk tier):' || true
  line=$(grep '^disk:' <<< "$disk_out")
  read_b=$(sed -nE 's/.* read_bytes_per_step=([0-9]+).*/\1/p' <<< "$line")
  written_b=$(sed -nE 's/.* written_bytes_per_step=([0-9]+).*/\1/p' <<< "$line")
  disk=$(adam_per_step <<< "$disk_out")
  ratio=$(awk -v ram="$ram" -v disk="$disk" -v r="$read_b" -v w="$written_b" \
              -v rbw="$(awk -v a="$r_prev" -v b="$r_next" 'BEGIN { print (a + b) / 2 }')" \
              -v wbw="$(awk -v a="$w_prev" -v b="$w_next" 'BEGIN { print (a + b) / 2 }')" -v round="$round" 'BEGIN {
    io = r / rbw + w / wbw; floor = (ram > io ? ram : io)
    printf "round %d: disk bytes per step read %d, written %d; plain O_DIRECT read %.3g B/s, write %.3g B/s: I/O floor %.4f s/step; adam with the disk tier %.4f s/step = %.2f x max(floors)\n", round, r, w, rbw, wbw, io, disk, disk / floor > "/dev/stderr"
    printf "%.4f", disk / floor }')
  ratios+=("$ratio")
  r_prev=$r_next w_prev=$w_next
done 2>&1
median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
echo "rounds: ${ratios[*]}"
awk -v m="$median" 'BEGIN { printf "median: %.2f x max(floors); target <= 1.1: %s\n", m, (m <= 1.1 ? "met" : "NOT met") }'
