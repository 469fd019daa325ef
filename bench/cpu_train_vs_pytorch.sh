#!/usr/bin/env bash
# CPU training throughput: pstar against PyTorch eager (Debian's python3-torch),
# the same GPT shape, batch and step count, in one run on this machine.
# Usage: bench/cpu_train_vs_pytorch.sh [steps]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-20}"
L=6 NH=6 C=384 V=8192 T=256 B=8

echo "shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T batch=$B steps=$steps threads=$(nproc)"
pstar_line=$("$pstar" train \
  --set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}" \
  --set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1000, grad_clip: 1.0}" \
  --set "data={source: generated, generated_tokens: 1048576}" \
  --set "optimizer={type: AdamW, params: {lr: 0.0006, betas: [0.9, 0.95], weight_decay: 0.1}}" \
  | grep '^summary:')
torch_line=$(/usr/bin/python3 "$root/bench/torch_gpt_train.py" --layers $L --heads $NH --embd $C \
  --vocab $V --seq $T --batch $B --steps "$steps")
echo "pstar $pstar_line"
echo "$torch_line"
p=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$pstar_line")
t=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$torch_line")
awk -v p="$p" -v t="$t" 'BEGIN { printf "tokens/s: pstar %.0f, pytorch %.0f, ratio pstar/pytorch %.2fx\n", p, t, p / t }'
