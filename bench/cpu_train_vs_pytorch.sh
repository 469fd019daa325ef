#!/usr/bin/env bash
# CPU training throughput: pstar against PyTorch eager (Debian's python3-torch),
# the same shape, batch and step count, in one run on this machine, at seq 256
# (batch 8) and seq 1024 (batch 2): the same tokens per step, so pstar's time
# per token at 1024 over 256 shows what attention's growth with T costs (its
# causal half is skipped). Two models: GPT-2 (6 layers, 384 wide, 8192
# tokens) and a Llama shape of about 20M parameters (8 layers, 384 wide, 8
# query heads on 2 kv heads of 48, SwiGLU at 1024, RoPE, untied, 8192 tokens;
# bench/torch_llama_train.py is its PyTorch side).
#
# A shared machine's speed drifts by 10% and more between runs, so with
# rounds > 1 every round runs both shapes of both trainers back to back, each
# ratio is taken within its round, and the medians over rounds are reported.
# Usage: bench/cpu_train_vs_pytorch.sh [steps] [rounds]   (build first: scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pstar="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
steps="${1:-20}"
rounds="${2:-1}"
L=6 NH=6 C=384 V=8192
LL=8 LNH=8 LKV=2 LHS=48 LF=1024
if ! [[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 2 && "$rounds" =~ ^[0-9]+$ && "$rounds" -ge 1 ]]; then
  echo "usage: $0 [steps >= 2] [rounds >= 1]" >&2
  exit 2
fi

tokens_per_s() { sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), threads=$(nproc)"
ratios_256="" ratios_1024="" growth="" llama_256="" llama_1024=""
for round in $(seq 1 "$rounds"); do
  declare -A pstar_tps=()
  for shape in "256 8" "1024 2"; do
    read -r T B <<<"$shape"
    train_sets=(--set "train={batch_size: $B, seq_len: $T, steps: $steps, log_every: 1000, grad_clip: 1.0}"
      --set "data={source: generated, generated_tokens: 1048576}"
      --set "optimizer={type: AdamW, params: {lr: 0.0006, betas: [0.9, 0.95], weight_decay: 0.1}}")
    echo "round $round/$rounds, shape: layers=$L heads=$NH embd=$C vocab=$V seq=$T batch=$B steps=$steps"
    pstar_line=$("$pstar" train \
      --set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}" "${train_sets[@]}" \
      | grep '^summary:')
    torch_line=$(/usr/bin/python3 "$root/bench/torch_gpt_train.py" --layers $L --heads $NH --embd $C \
      --vocab $V --seq "$T" --batch "$B" --steps "$steps")
    echo "  pstar $pstar_line"
    echo "  $torch_line"
    p=$(tokens_per_s "$pstar_line")
    t=$(tokens_per_s "$torch_line")
    pstar_tps[$T]=$p
    ratio=$(awk -v p="$p" -v t="$t" 'BEGIN { printf "%.4f", p / t }')
    if [ "$T" = 256 ]; then ratios_256+="$ratio"$'\n'; else ratios_1024+="$ratio"$'\n'; fi
    awk -v p="$p" -v t="$t" -v T="$T" \
      'BEGIN { printf "  seq %d tokens/s: pstar %.0f, pytorch %.0f, ratio pstar/pytorch %.2fx\n", T, p, t, p / t }'

    echo "round $round/$rounds, llama shape: layers=$LL heads=$LNH kv_heads=$LKV head_dim=$LHS embd=$C" \
      "intermediate=$LF vocab=$V seq=$T batch=$B steps=$steps"
    pstar_line=$("$pstar" train \
      --set "model={architecture: llama, n_layer: $LL, n_head: $LNH, n_kv_head: $LKV, n_embd: $C, head_dim: $LHS, intermediate_size: $LF, vocab_size: $V, max_seq_len: $T, norm_eps: 1.0e-5, rope_theta: 500000}" \
      "${train_sets[@]}" | grep '^summary:')
    torch_line=$(/usr/bin/python3 "$root/bench/torch_llama_train.py" --layers $LL --heads $LNH --kv-heads $LKV \
      --embd $C --head-dim $LHS --intermediate $LF --vocab $V --seq "$T" --batch "$B" --steps "$steps")
    echo "  pstar $pstar_line"
    echo "  $torch_line"
    p=$(tokens_per_s "$pstar_line")
    t=$(tokens_per_s "$torch_line")
    ratio=$(awk -v p="$p" -v t="$t" 'BEGIN { printf "%.4f", p / t }')
    if [ "$T" = 256 ]; then llama_256+="$ratio"$'\n'; else llama_1024+="$ratio"$'\n'; fi
    awk -v p="$p" -v t="$t" -v T="$T" \
      'BEGIN { printf "  llama seq %d tokens/s: pstar %.0f, pytorch %.0f, ratio pstar/pytorch %.2fx\n", T, p, t, p / t }'
  done
  g=$(awk -v a="${pstar_tps[256]}" -v b="${pstar_tps[1024]}" 'BEGIN { printf "%.4f", a / b }')
  growth+="$g"$'\n'
  awk -v g="$g" 'BEGIN { printf "pstar time per token, seq 1024 / seq 256: %.2f\n", g }'
done
if [ "$rounds" -gt 1 ]; then
  printf 'median of %d rounds: ratio pstar/pytorch %.2fx at seq 256, %.2fx at seq 1024; ' "$rounds" \
    "$(median <<<"${ratios_256%$'\n'}")" "$(median <<<"${ratios_1024%$'\n'}")"
  printf 'pstar time per token, seq 1024 / seq 256: %.2f (rounds: %s)\n' "$(median <<<"${growth%$'\n'}")" \
    "$(awk '{ printf "%s%.2f", (NR > 1 ? " " : ""), $1 }' <<<"${growth%$'\n'}")"
  printf 'median of %d rounds, llama: ratio pstar/pytorch %.2fx at seq 256, %.2fx at seq 1024\n' "$rounds" \
    "$(median <<<"${llama_256%$'\n'}")" "$(median <<<"${llama_1024%$'\n'}")"
fi
