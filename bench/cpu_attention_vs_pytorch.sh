#!/usr/bin/env bash
# CPU causal attention, forward and backward: pstar's kernel (no T x T
# storage, the causal half skipped) against PyTorch's (Debian's
# python3-torch: scaled_dot_product_attention where it has it, else the
# explicit scores-softmax-product form), fp32, the same shapes and threads, in
# one run on this machine, at the CPU training benchmark's two shapes
# (width 384, 6 heads of 64; seq 256 x batch 8 and seq 1024 x batch 2).
# Usage: bench/cpu_attention_vs_pytorch.sh [iters]   (default 7; build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="${PSTAR_BUILD_DIR:-$root/build}/bin/cpu_attention_bench"
iters="${1:-7}"
threads=$(nproc)
C=384 NH=6

field() { sed -E "s/.*[ ]$1=([^ ]+).*/\1/" <<<"$2"; }
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), threads=$threads, iters=$iters (median)"
for shape in "256 8" "1024 2"; do
  read -r T B <<<"$shape"
  pstar_line=$(OMP_NUM_THREADS=$threads "$bench" --batch "$B" --seq "$T" --embd $C --heads $NH --iters "$iters")
  torch_line=$(/usr/bin/python3 "$root/bench/torch_attention.py" --batch "$B" --seq "$T" --embd $C --heads $NH \
    --iters "$iters" --threads "$threads")
  echo "$pstar_line"
  echo "$torch_line"
  awk -v pf="$(field forward_ms "$pstar_line")" -v pb="$(field backward_ms "$pstar_line")" \
    -v tf="$(field forward_ms "$torch_line")" -v tb="$(field backward_ms "$torch_line")" -v T="$T" -v B="$B" \
    'BEGIN { printf "seq %d batch %d: forward %.2fx, backward %.2fx, both %.2fx faster than PyTorch\n",
             T, B, tf / pf, tb / pb, (tf + tb) / (pf + pb) }'
done
