#!/usr/bin/env bash
# CPU training throughput: pstar against PyTorch eager (Debian's python3-torch),
# the same GPT shape, batch and step count, in one run on this machine, at
# seq 256 (batch 8) and seq 1024 (batch 2): the same tokens per step, so
# pstar's time per token at 1024 over 256 shows what attention's growth with
# T costs (its causal half is skipped).
# Usage: bench/cpu_train_vs_pytorch.sh [steps]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-20}"
L=6 NH=6 C=384 V=8192

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), threads=$(nproc)"
declare -A pstar_tps
for shape in "256 8" "1024 2"; do
  read -r T B <<<"$shape"
  echo "shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T batch=$B steps=$steps"
  pstar_line=$("$pstar" train \
    --set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}" \
    --set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1000, grad_clip: 1.0}" \
    --set "data={source: generated, generated_tokens: 1048576}" \
    --set "optimizer={type: AdamW, params: {lr: 0.0006, betas: [0.9, 0.95], weight_decay: 0.1}}" \
    | grep '^summary:')
  torch_line=$(/usr/bin/python3 "$root/bench/torch_gpt_train.py" --layers $L --heads $NH --embd $C \
    --vocab $V --seq "$T" --batch "$B" --steps "$steps")
  echo "  pstar $pstar_line"
  echo "  $torch_line"
  p=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$pstar_line")
  t=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$torch_line")
  pstar_tps[$T]=$p
  awk -v p="$p" -v t="$t" -v T="$T" \
    'BEGIN { printf "  seq %d tokens/s: pstar %.0f, pytorch %.0f, ratio pstar/pytorch %.2fx\n", T, p, t, p / t }'
done
awk -v a="${pstar_tps[256]}" -v b="${pstar_tps[1024]}" \
  'BEGIN { printf "pstar time per token, seq 1024 / seq 256: %.2f\n", a / b }'
