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
#   --dir   a directory on the disk to measure (default: a fresh one under
#           $TMPDIR, else /var/tmp)
# Environment: PSTAR_BUILD_DIR (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
pstar="$build/bin/pstar" bench="$build/bin/disk_tier_bench"
for b in "$pstar" "$bench"; do [ -x "$b" ] || { echo "disk_tier_optimizer.sh: $b is missing: build first" >&2; exit 2; }; done
dir="" L=24 C=512 steps=5
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift ;;
    --layers) L="$2"; shift ;;
    --width) C="$2"; shift ;;
    --steps) steps="$2"; shift ;;
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
# just after the run with the disk tier, and the floor takes their mean.
plain_rates() {  # GiB -> "read_bytes_per_s write_bytes_per_s"
  local p
  p="$("$bench" --dir "$dir" --gib "$1" --rounds 1 | grep '^plain:')"
  echo "$(sed -nE 's/.*read_bytes_per_s=([0-9.e+]+).*/\1/p' <<< "$p") $(sed -nE 's/.*write_bytes_per_s=([0-9.e+]+).*/\1/p' <<< "$p")"
}
ram_out="$("$pstar" train "${job[@]}" --profile)"
probe="$("$pstar" plan "${job[@]}" --set "runtime.nvme_path=$dir" --json)"
gib=$(awk -v b="$(sed -nE 's/.*"disk_bytes": ([0-9]+).*/\1/p' <<< "$probe")" \
      'BEGIN { g = 2 * b / 2^30; if (g < 0.25) g = 0.25; printf "%.2f", g }')
read -r r1 w1 <<< "$(plain_rates "$gib")"
disk_out="$("$pstar" train "${job[@]}" --set "runtime.nvme_path=$dir" --profile)"
read -r r2 w2 <<< "$(plain_rates "$gib")"
rbw=$(awk -v a="$r1" -v b="$r2" 'BEGIN { printf "%.6g", (a + b) / 2 }')
wbw=$(awk -v a="$w1" -v b="$w2" 'BEGIN { printf "%.6g", (a + b) / 2 }')
ram=$(adam_per_step <<< "$ram_out")
disk=$(adam_per_step <<< "$disk_out")
echo "$disk_out" | grep -E '^(model|disk tier):' || true
line=$(grep '^disk:' <<< "$disk_out")
read_b=$(sed -nE 's/.* read_bytes_per_step=([0-9]+).*/\1/p' <<< "$line")
written_b=$(sed -nE 's/.* written_bytes_per_step=([0-9]+).*/\1/p' <<< "$line")
echo "plain O_DIRECT before: read $r1 B/s, write $w1 B/s; after: read $r2 B/s, write $w2 B/s"
awk -v ram="$ram" -v disk="$disk" -v r="$read_b" -v w="$written_b" -v rbw="$rbw" -v wbw="$wbw" 'BEGIN {
  io = r / rbw + w / wbw; floor = (ram > io ? ram : io)
  printf "adam in RAM: %.4f s/step\n", ram
  printf "disk bytes per step: read %d, written %d; plain O_DIRECT read %.3g B/s, write %.3g B/s: I/O floor %.4f s/step\n", r, w, rbw, wbw, io
  printf "adam with the disk tier: %.4f s/step = %.2f x max(floors)\n", disk, disk / floor
  printf "target: <= 1.1 x max(floors): %s\n", (disk <= 1.1 * floor ? "met" : "NOT met") }'
