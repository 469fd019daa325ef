#!/usr/bin/env bash
# GPT-2 124M and 350M training in GPU memory (every chunk resident, nothing
# moves after the first step), seq 1024, bf16: pstar's tokens/s and MFU
# against PyTorch eager and torch.compile running the same model, optimizer,
# batch, sequence length and steps (bench/torch_gpt_train.py), in one run on
# one GPU. The model llama-1b is Llama 3.2 1B (grouped-query attention, RoPE
# with Llama 3's scaling, SwiGLU, RMSNorm, tied embeddings) at seq 2048, its
# PyTorch side bench/torch_llama_train.py. Warm-up steps are left out of every rate. A second pstar run of
# the same steps with --profile prints where its step time goes (each GEMM by
# layer role and pass, each op by pass, casts, idle) and what profiling costs:
# its tokens/s against the plain run's (profile_cost, in percent).
#
# Usage: bench/gpu_in_memory.sh [--dry-run] [--quick] [--steps N] [--warmup W] [--models "124m 350m llama-1b"] [--log-dir DIR]
#   --dry-run  the same plumbing on the CPU with a tiny GPT (fp32, no peak):
#              checks the scripts, measures nothing about GPUs
#   --quick    one shape, GPT-2 124M, 20 steps (5 warm-up): pstar, pstar
#              --profile, PyTorch eager and compiled in under 4 minutes on
#              an H100 (the ratio and the profile from one call); with
#              --models, those models at 20 steps
# Environment: PSTAR_BUILD_DIR, PYTHON, PEAK_FLOPS (see bench/gpu_common.sh);
#   BATCH_124M, BATCH_350M, BATCH_LLAMA_1B fix the batch (default: the largest of 32, 16, 8, 4
#   whose all-resident plan fits 0.8 x the GPU's memory); TORCH_TIMEOUT
#   bounds each PyTorch run in seconds (default 600).
#
# MFU = tokens/s * (6 N + 6 L C T) / peak, the GPU's dense bf16 peak
# (989 TFLOP/s for H100 SXM and H200; PEAK_FLOPS overrides). Target: 45%.
set -euo pipefail
# shellcheck source=bench/gpu_common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu_common.sh"

dry_run=0 quick=0 steps="" warmup="" models="" log_dir=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --quick) quick=1 ;;
    --steps) steps="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --models) models="$2"; shift ;;
    --log-dir) log_dir="$2"; shift ;;
    -h | --help) print_header; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
if [ "$quick" -eq 1 ]; then models="${models:-124m}" steps="${steps:-20}" warmup="${warmup:-5}"; fi
models="${models:-124m 350m}"
if [ "$dry_run" -eq 1 ]; then steps="${steps:-4}" warmup="${warmup:-1}"; else steps="${steps:-40}" warmup="${warmup:-10}"; fi
[ "$steps" -gt "$warmup" ] || die "--steps must exceed --warmup"
log_dir="${log_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"
target_mfu=45

require_pstar
detect_gpu
find_torch || true
if [ "$dry_run" -eq 1 ]; then
  echo "DRY RUN on the CPU: tiny shapes, fp32; the figures below say nothing about GPUs"
  device=cpu precision=fp32 torch_device=cpu PEAK_FLOPS=""
else
  [ "$GPU_MEM_BYTES" -gt 0 ] || die "no GPU visible to nvidia-smi (use --dry-run on a machine without one)"
  device=cuda precision=bf16 torch_device=cuda
fi
describe_gpu
echo "pstar: $pstar ($("$pstar" info | head -1))"
if [ -n "$TORCH_VERSION" ]; then echo "pytorch: $TORCH_VERSION ($PYTHON)"; else echo "pytorch: not available: $TORCH_MISSING"; fi
echo "steps: $steps, the first $warmup left out of tokens/s; logs in $log_dir"

# name -> "preset layers heads embd vocab seq" (width: the attention's, NH x head size)
shape_of() {
  case "$1" in
    124m) echo "gpt2-124m 12 12 768 50257 1024" ;;
    350m) echo "gpt2-350m 24 16 1024 50257 1024" ;;
    llama-1b) echo "llama-3.2-1b 16 32 2048 128256 2048" ;;
    tiny-124m) echo "- 2 2 128 512 64" ;;  # dry-run stand-ins
    tiny-350m) echo "- 4 4 128 512 64" ;;
    tiny-llama-1b) echo "llama-tiny 4 4 128 512 64" ;;
    *) die "unknown model $1 (124m, 350m or llama-1b)" ;;
  esac
}
# The Llama shapes' PyTorch side: bench/torch_llama_train.py's shape flags.
llama_torch_shape() {
  case "$1" in
    llama-1b) echo "--layers 16 --heads 32 --kv-heads 8 --embd 2048 --head-dim 64 --intermediate 8192 --vocab 128256 --tie --rope-factor 32" ;;
    tiny-llama-1b) echo "--layers 4 --heads 4 --kv-heads 2 --embd 128 --head-dim 32 --intermediate 352 --vocab 512 --theta 10000" ;;
  esac
}

results=()
for name in $models; do
  shape_name="$name"
  [ "$dry_run" -eq 1 ] && shape_name="tiny-$name"
  read -r preset L NH C V T <<<"$(shape_of "$shape_name")"
  torch_script="$bench_dir/torch_gpt_train.py"
  if [ "$preset" = - ]; then
    model_args=(--set "model={n_layer: $L, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}")
    torch_shape=(--layers "$L" --heads "$NH" --embd "$C" --vocab "$V")
  elif [ "${name#llama}" != "$name" ]; then
    model_args=(--set "model.preset=$preset")
    read -r -a torch_shape <<<"$(llama_torch_shape "$shape_name")"
    torch_script="$bench_dir/torch_llama_train.py"
  else
    model_args=(--set "model.preset=$preset")
    torch_shape=(--model "$name")
  fi
  common=("${model_args[@]}" --set "runtime.device=$device" --set "train.precision=$precision"
          --set "train.seq_len=$T" --set "train.steps=$steps" --set train.log_every=1
          --set data.source=generated --set optimizer.params.lr=0.0006 --set train.warmup_steps=0
          --set train.lr_decay=constant)

  # Batch: given, or the largest whose all-resident plan fits the GPU tier.
  var="BATCH_${name^^}"
  var="${var//-/_}"
  batch="${!var:-}"
  if [ -z "$batch" ]; then
    if [ "$dry_run" -eq 1 ]; then
      batch=2
    else
      tier=$(awk -v m="$GPU_MEM_BYTES" 'BEGIN { printf "%.0f", m * 0.8 }')
      for b in 32 16 8 4; do
        need=$(plan_field all_resident_device_bytes "$("$pstar" plan "${common[@]}" --set "train.batch_size=$b" --json)")
        if [ "$need" -le "$tier" ]; then batch=$b; break; fi
      done
      [ -n "$batch" ] || die "$name: not even batch 4 fits $(gib "$tier") of GPU memory"
    fi
  fi
  plan=$("$pstar" plan "${common[@]}" --set "train.batch_size=$batch" --json) || [ $? -eq 1 ]  # 1: does not fit
  N=$(plan_field parameters "$plan")
  fpt=$(flops_per_token "$N" "$L" "$C" "$T")
  echo
  echo "== $name: $L layers, $NH heads, width $C, vocab $V, seq $T, batch $batch, $N parameters," \
       "$fpt FLOPs/token, device tier all resident ($(gib "$(plan_field all_resident_device_bytes "$plan")"))"

  # pstar
  plog="$log_dir/in_memory_${name}_pstar.log"
  pstar_tps=n/a prof_tps=n/a profile_cost=n/a
  if run_logged "$plog" "$pstar" train "${common[@]}" --set "train.batch_size=$batch" > /dev/null; then
    pstar_tps=$(pstar_steady_tps "$plog" "$warmup")
    grep -E '^(compute|memory|summary|chunks):' "$plog" | sed 's/^/  pstar /'
    # Where the step time goes: a second run of the same steps with
    # --profile (the first step left out of the table), its op table kept
    # beside the timed run's log, and its tokens/s against the plain run's:
    # what profiling costs.
    prof="$log_dir/in_memory_${name}_profile.log"
    if run_logged "$prof" "$pstar" train "${common[@]}" --set "train.batch_size=$batch" --profile > /dev/null; then
      prof_tps=$(pstar_steady_tps "$prof" "$warmup")
      profile_cost=$(awk -v p="$pstar_tps" -v q="$prof_tps" 'BEGIN {
        if (p + 0 > 0 && q + 0 > 0) printf "%.1f", 100 * (1 - q / p); else print "n/a" }')
      sed -n '/^profile:/,$p' "$prof" | grep -E '^(profile:|  (op|move|collective) )' | sed 's/^/  pstar /'
      echo "  pstar --profile: $prof_tps tokens/s against $pstar_tps without: profile_cost=${profile_cost}%" \
           "(target: at most 5%)"
    else
      echo "  pstar --profile: FAILED (log $prof)"
    fi
  else
    echo "  pstar: FAILED (exit status above; log $plog):"
    tail -5 "$plog" | sed 's/^/    /'
  fi

  # PyTorch eager and compiled
  declare -A torch_tps=([eager]=n/a [compile]=n/a)
  for mode in eager compile; do
    tlog="$log_dir/in_memory_${name}_torch_${mode}.log"
    if [ -z "$TORCH_VERSION" ]; then
      echo "  torch $mode: not measured: $TORCH_MISSING" | tee "$tlog"
      continue
    fi
    flags=(--device "$torch_device" --dtype "$precision" "${torch_shape[@]}" --seq "$T" --batch "$batch"
           --steps "$steps" --warmup "$warmup")
    [ "$mode" = compile ] && flags+=(--compile)
    set +e
    timeout "${TORCH_TIMEOUT:-600}" "$PYTHON" "$torch_script" "${flags[@]}" > "$tlog" 2>&1
    rc=$?
    set -e
    line=$(grep '^torch:' "$tlog" | tail -1 || true)
    if [ "$rc" -eq 0 ] && [ -n "$line" ] && [ "$(field params "$line")" != "$N" ]; then
      # Not the same model: no ratio from it.
      echo "  torch $mode: not measured (its model has $(field params "$line") parameters, pstar's $N; log $tlog)"
    elif [ "$rc" -eq 0 ] && [ -n "$line" ]; then
      torch_tps[$mode]=$(field tokens_per_s "$line")
      echo "  $line"
    else
      echo "  torch $mode: not measured (exit $rc${line:+: ${line#torch: }}; log $tlog)"
      [ -z "$line" ] && tail -3 "$tlog" | sed 's/^/    /'
    fi
  done

  best=n/a best_mode=""
  for mode in eager compile; do
    t=${torch_tps[$mode]}
    [ "$t" = n/a ] && continue
    if [ "$best" = n/a ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$t best_mode=$mode; fi
  done
  ratio=n/a
  if [ "$pstar_tps" != n/a ] && [ "$best" != n/a ]; then
    ratio=$(awk -v p="$pstar_tps" -v t="$best" 'BEGIN { printf "%.2f", p / t }')
  fi
  pm=$(mfu "$pstar_tps" "$fpt") em=$(mfu "${torch_tps[eager]}" "$fpt") cm=$(mfu "${torch_tps[compile]}" "$fpt")
  results+=("$name $batch $pstar_tps $pm ${torch_tps[eager]} $em ${torch_tps[compile]} $cm $ratio ${best_mode:-none}")
  echo "in_memory: model=$name batch=$batch seq=$T params=$N flops_per_token=$fpt pstar_tokens_per_s=$pstar_tps" \
       "pstar_mfu=$pm eager_tokens_per_s=${torch_tps[eager]} eager_mfu=$em compile_tokens_per_s=${torch_tps[compile]}" \
       "compile_mfu=$cm pstar_over_best_torch=$ratio best_torch=${best_mode:-none}" \
       "pstar_profiled_tokens_per_s=$prof_tps profile_cost_pct=$profile_cost" | tee -a "$log_dir/in_memory.txt"
  unset torch_tps
done

echo
printf "%-6s %6s %12s %7s %12s %7s %12s %7s %14s\n" model batch "pstar tok/s" MFU "eager tok/s" MFU \
  "compile tok/s" MFU "pstar/best pt"
for r in "${results[@]}"; do
  read -r name batch p pm e em c cm ratio best_mode <<<"$r"
  pct() { [ "$1" = n/a ] && echo n/a || echo "$1%"; }
  printf "%-6s %6s %12s %7s %12s %7s %12s %7s %14s\n" "$name" "$batch" "$p" "$(pct "$pm")" "$e" "$(pct "$em")" \
    "$c" "$(pct "$cm")" "$([ "$ratio" = n/a ] && echo n/a || echo "${ratio}x ($best_mode)")"
done
for r in "${results[@]}"; do
  read -r name batch p pm _ <<<"$r"
  if [ "$pm" = n/a ]; then
    echo "$name: MFU n/a ($([ "$dry_run" -eq 1 ] && echo 'dry run on the CPU' || echo 'no peak for this GPU: set PEAK_FLOPS'))"
  else
    awk -v n="$name" -v m="$pm" -v t="$target_mfu" 'BEGIN {
      printf "%s: pstar MFU %.1f%% against the %d%% target: %s\n", n, m, t, (m >= t ? "met" : "not met") }'
  fi
done
