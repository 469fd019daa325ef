#!/usr/bin/env bash
# Offloaded training at scale on one GPU: GPT shapes of width 4096 (32 heads,
# seq 1024, vocab 50257) with more and more layers (2B to 20B parameters),
# model data homed in pinned host memory, the device tier at the GPU's memory.
#
#  1. `pstar plan` for each size: does the host (and the GPU tier) hold it?
#  2. pstar: the fitting sizes from the largest down, a few steps each, until
#     one trains: its tokens/s, TFLOP/s, MFU, and MFU against the in-memory
#     MFU of bench/gpu_in_memory.sh (from the same --log-dir).
#  3. PyTorch FSDP2 + CPUOffloadPolicy (bench/torch_fsdp_offload.py) on the
#     same shapes: a tiny smoke run, then the largest it trains.
#  4. Both at the largest size both train: tokens/s and pstar/FSDP.
#  5. waits: the largest size pstar trained (or --layers' largest that fits)
#     at batch WAIT_BATCH (8), runtime.optimizer_overlap speculate and off,
#     under --profile: per step (medians after the warm-up) the step time,
#     the GPU's kernel time, the host Adam time, the H2D and D2H copy time,
#     the step's waits for updates, the GPU-busy share, and step against
#     max(kernels, Adam, copies) (target <= 1.15 with the overlap; about
#     their sum without it); the model FLOP rate counting the recompute
#     (8 N + 8 L C T per token with activation checkpointing). Clipping is
#     off (WAIT_GRAD_CLIP, 0), as in a run past its first steps whose norms
#     stay under the clip: a step that clips undoes its speculation.
#  6. sweep: that size at batches SWEEP_BATCHES ("2 4 8 16"), overlap on:
#     where the host's Adam stops being the bound (kernels >= Adam).
#  7. margin: runtime.margin_use_ratio MARGINS ("0.8 1.0"): the largest size
#     each plans at batch WAIT_BATCH, trained a few steps (does the extra
#     margin fit in practice?).
#
# Usage: bench/gpu_offload_scale.sh [--dry-run] [--log-dir DIR]
#                                   [--part all|plan|pstar|fsdp|compare|waits|sweep|margin]
#                                   [--layers "10 20 ..."] [--steps N] [--warmup W]
#   --part     run one stage; the measured runs accumulate in DIR/offload_runs.txt,
#              so stages can run in separate calls (compare reads what is there)
#   --dry-run  the plumbing on the CPU: the plan of the real shapes against an
#              assumed 128 GiB host and 80 GiB GPU, then tiny shapes trained on
#              the CPU backend with an emulated tier that forces chunk moves
# Environment: PSTAR_BUILD_DIR, PYTHON, PEAK_FLOPS (bench/gpu_common.sh);
#   BATCH (4: the GPU room activations leave homes Adam moments), ACCUM (1),
#   GRAD_PRECISION (16bit with bf16: gradients homed at 2 bytes per parameter), CHECKPOINT (1: activation checkpointing, both sides),
#   HOST_MEMORY (default: 0.8 x RAM or the cgroup limit, as pstar takes it),
#   DEVICE_MEMORY (default 0: pstar's 0.8 x the GPU's memory), PSTAR_TRIES (3),
#   FSDP_TRIES (3), RUN_TIMEOUT (seconds per run, 480), FSDP_HOST_OVERHEAD (6GiB),
#   IN_MEMORY_MFU (percent; default: read from DIR/in_memory.txt).
#
# FLOPs per token 6 N + 6 L C T (recomputation not counted); MFU against the
# dense bf16 peak. Target: offloaded MFU of at least 40%.
set -euo pipefail
# shellcheck source=bench/gpu_common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu_common.sh"

dry_run=0 part=all log_dir="" layers_list="" steps="" warmup=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --part) part="$2"; shift ;;
    --log-dir) log_dir="$2"; shift ;;
    --layers) layers_list="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    -h | --help) print_header; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
  esac
  shift
done
case "$part" in
  all | plan | pstar | fsdp | compare | waits | sweep | margin) ;;
  *) die "--part: all, plan, pstar, fsdp, compare, waits, sweep or margin" ;;
esac
log_dir="${log_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"
runs="$log_dir/offload_runs.txt"
touch "$runs"
target_mfu=40
batch="${BATCH:-4}" accum="${ACCUM:-1}" ckpt="${CHECKPOINT:-1}"
ckpt_yaml=$([ "$ckpt" = 1 ] && echo true || echo false)

require_pstar
detect_gpu
find_torch || true

if [ "$dry_run" -eq 1 ]; then
  echo "DRY RUN on the CPU: tiny shapes on the CPU backend; the figures below say nothing about GPUs"
  C=128 NH=4 T=64 V=512
  layers_list="${layers_list:-2 4 8}"
  steps="${steps:-4}" warmup="${warmup:-1}" batch="${BATCH:-2}"
  device=cpu precision=fp32 PEAK_FLOPS=""
  # A host that holds the 2- and 4-layer shapes and not the 8-layer one, to
  # show the plan's refusal.
  host_budget=$(to_bytes "${HOST_MEMORY:-290MiB}")
  tier_bytes=0
else
  C=4096 NH=32 T=1024 V=50257
  layers_list="${layers_list:-10 20 24 28 32 36 40 42 44 46 48 50 52 54 56 58 60 75 100}"
  steps="${steps:-4}" warmup="${warmup:-2}"
  [ "$GPU_MEM_BYTES" -gt 0 ] || die "no GPU visible to nvidia-smi (use --dry-run on a machine without one)"
  device=cuda precision=bf16
  if [ -n "${HOST_MEMORY:-}" ]; then host_budget=$(to_bytes "$HOST_MEMORY"); else host_budget=$(default_host_budget); fi
  if [ -n "${DEVICE_MEMORY:-}" ]; then
    tier_bytes=$(to_bytes "$DEVICE_MEMORY")
  else
    tier_bytes=$(awk -v m="$GPU_MEM_BYTES" 'BEGIN { printf "%.0f", m * 0.8 }')
  fi
fi
[ "$steps" -gt "$warmup" ] || die "--steps must exceed --warmup"
describe_gpu
if [ -n "$TORCH_VERSION" ]; then echo "pytorch: $TORCH_VERSION ($PYTHON)"; else echo "pytorch: not available: $TORCH_MISSING"; fi
echo "shapes: width $C, $NH heads, seq $T, vocab $V, layers {$layers_list}; batch $batch x accum $accum," \
     "activation checkpointing $ckpt_yaml, $precision; $steps steps, the first $warmup left out of tokens/s"
echo "host budget $(gib "$host_budget")$([ "$dry_run" -eq 1 ] && echo ' (simulated)');" \
     "device tier $([ "$tier_bytes" -gt 0 ] && gib "$tier_bytes" || echo 'per shape (dry run)'); logs in $log_dir"

job_args() {  # layers -> pstar --set arguments
  local args=(--set "model={n_layer: $1, n_head: $NH, n_embd: $C, vocab_size: $V, max_seq_len: $T}"
              --set "runtime.device=$device" --set "train.precision=$precision"
              --set "train.batch_size=$batch" --set "train.seq_len=$T" --set "train.grad_accum_steps=$accum"
              --set "train.grad_precision=$([ "$precision" = fp32 ] && echo fp32 || echo "${GRAD_PRECISION:-16bit}")"
              --set "train.activation_checkpointing=$ckpt_yaml" --set "train.steps=$steps" --set train.log_every=1
              --set data.source=generated --set optimizer.params.lr=0.0006 --set train.warmup_steps=0
              --set train.lr_decay=constant --set "runtime.host_memory=$host_budget")
  [ -n "${CHUNK:-}" ] && args+=(--set "default_chunk_size=$CHUNK")
  printf '%s\n' "${args[@]}"
}

# The device tier a shape trains with: on the GPU, DEVICE_MEMORY or 0 (pstar
# takes 0.8 x the GPU's memory); in the dry run, activations plus half the
# model data, so that chunks move.
train_tier() {  # plan_json -> bytes for runtime.device_memory
  if [ "$dry_run" -eq 0 ]; then
    if [ -n "${DEVICE_MEMORY:-}" ]; then echo "$tier_bytes"; else echo 0; fi
    return 0
  fi
  awk -v a="$(plan_field activation_bytes "$1")" -v m="$(plan_field model_bytes "$1")" \
      -v lo="$(plan_field min_device_bytes "$1")" 'BEGIN { b = a + int(m / 2); if (b < lo) b = lo; printf "%d", b }'
}

# --- 1. the plan ---------------------------------------------------------------
declare -A params fits plan_tier
plan_table() {
  local plan_tier_bytes=$1 label=$2 dev=$3 where=$4
  printf "%-7s %14s %12s %12s %12s %12s %12s  %s\n" layers parameters "model data" "host min" "dev min" "dev slots" \
    "homed on dev" "$label"
  local L plan args host_min dev_min verdict t largest_fit=""
  for L in $layers_list; do
    mapfile -t args < <(job_args "$L")
    if [ "$plan_tier_bytes" = shape ]; then
      t=$(train_tier "$("$pstar" plan "${args[@]}" --set "runtime.device=$dev" --json)")
      plan_tier[$L]=$t
    else
      t=$plan_tier_bytes
      plan_tier[$L]=$(train_tier "")
    fi
    # Exit 1 is a plan that does not fit this host: the table says so.
    plan=$("$pstar" plan "${args[@]}" --set "runtime.device=$dev" --set "runtime.device_memory=$t" --json) ||
      [ $? -eq 1 ]
    params[$L]=$(plan_field parameters "$plan")
    host_min=$(plan_field min_host_bytes "$plan") dev_min=$(plan_field min_device_bytes "$plan")
    if [ "$host_min" -gt "$host_budget" ]; then
      verdict="no: host needs $(gib "$host_min")"
      fits[$L]=0
    elif [ "$t" -gt 0 ] && [ "$dev_min" -gt "$t" ]; then
      verdict="no: device tier needs $(gib "$dev_min")"
      fits[$L]=0
    else
      verdict=yes
      fits[$L]=1
    fi
    printf "%-7s %14s %12s %12s %12s %12s %12s  %s\n" "$L" "${params[$L]}" "$(gib "$(plan_field model_bytes "$plan")")" \
      "$(gib "$host_min")" "$(gib "$dev_min")" "$(plan_field device_slots "$plan")" \
      "$(gib "$(plan_field device_home_bytes "$plan")")" "$verdict"
    [ "$verdict" = yes ] && largest_fit="$L layers (${params[$L]} parameters)"
  done
  echo "plan: largest that fits $where: ${largest_fit:-none}"
}

if [ "$dry_run" -eq 1 ] && { [ "$part" = all ] || [ "$part" = plan ]; }; then
  # What the GPU host will see, planned here: nothing is allocated.
  echo
  echo "== plan of the real shapes for the GPU host (assumed: 128 GiB host x 0.8, 80 GiB GPU x 0.8)"
  saved=("$C" "$NH" "$T" "$V" "$layers_list" "$host_budget" "$device" "$precision" "$batch")
  C=4096 NH=32 T=1024 V=50257 layers_list="10 20 24 28 32 36 40 42 44 46 48 50 52 54 56 58 60 75 100" device=cuda precision=bf16
  batch="${BATCH:-4}"
  host_budget=$(awk 'BEGIN { printf "%.0f", 128 * 2^30 * 0.8 }')
  plan_table "$(awk 'BEGIN { printf "%.0f", 80 * 2^30 * 0.8 }')" "fits the GPU host" cuda "the assumed GPU host"
  C=${saved[0]} NH=${saved[1]} T=${saved[2]} V=${saved[3]} layers_list=${saved[4]} host_budget=${saved[5]}
  device=${saved[6]} precision=${saved[7]} batch=${saved[8]}
  unset params fits plan_tier
  declare -A params fits plan_tier
fi

echo
echo "== plan ($([ "$dry_run" -eq 1 ] && echo 'dry-run shapes, emulated tier' || echo 'this host and GPU'))"
if [ "$dry_run" -eq 1 ]; then
  plan_table shape fits "$device" "the simulated host"
else
  plan_table "$tier_bytes" fits "$device" "this host and GPU"
fi
[ "$part" = plan ] && exit 0

descending() { tr ' ' '\n' <<<"$layers_list" | sed '/^$/d' | sort -n -r; }

# --- 2. pstar -------------------------------------------------------------------
pstar_run() {  # layers -> appends a line to $runs; returns 0 when it trained
  local L=$1 args log tps
  mapfile -t args < <(job_args "$L")
  log="$log_dir/offload_pstar_L${L}.log"
  echo "-- pstar, $L layers (${params[$L]} parameters): log $log"
  set +e
  timeout "${RUN_TIMEOUT:-480}" "$pstar" train "${args[@]}" --set "runtime.device_memory=${plan_tier[$L]}" > "$log" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "   failed (exit $rc$([ "$rc" -eq 124 ] && echo ': timed out')): $(grep -m1 'error' "$log" || tail -1 "$log")"
    echo "pstar layers=$L params=${params[$L]} status=failed rc=$rc" >> "$runs"
    return 1
  fi
  tps=$(pstar_steady_tps "$log" "$warmup")
  grep -E '^(memory|summary|chunks):' "$log" | sed 's/^/   /'
  echo "pstar layers=$L params=${params[$L]} status=ok tokens_per_s=$tps batch=$batch accum=$accum" >> "$runs"
  echo "   tokens/s (after $warmup warm-up steps): $tps"
}

if [ "$part" = all ] || [ "$part" = pstar ]; then
  echo
  echo "== pstar: the largest size that trains"
  tries=0
  for L in $(descending); do
    [ "${fits[$L]}" = 1 ] || continue
    if pstar_run "$L"; then break; fi
    tries=$((tries + 1))
    [ "$tries" -ge "${PSTAR_TRIES:-3}" ] && { echo "   giving up after $tries failed sizes"; break; }
  done
fi

# --- 3. PyTorch FSDP2 + CPU offload --------------------------------------------
fsdp_run() {  # layers [extra args] -> appends to $runs unless it is the smoke run
  local L=$1 record=1 suffix="" log line rc
  shift
  [ "${1:-}" = --smoke ] && { record=0 suffix=_smoke; shift; }
  [ "${1:-}" = --check-only ] && record=0 suffix=_check
  log="$log_dir/offload_fsdp_L${L}${suffix}.log"
  local flags=(--layers "$L" --heads "$NH" --embd "$C" --vocab "$V" --seq "$T" --batch "$batch"
               --steps "$steps" --warmup "$warmup" --host-budget "$host_budget"
               --host-overhead "$(to_bytes "${FSDP_HOST_OVERHEAD:-6GiB}")")
  [ "$ckpt" = 1 ] && flags+=(--checkpoint)
  flags+=("$@")
  set +e
  timeout "${RUN_TIMEOUT:-480}" "$PYTHON" "$bench_dir/torch_fsdp_offload.py" "${flags[@]}" > "$log" 2>&1
  rc=$?
  set -e
  line=$(grep -E '^fsdp: (steps=|unavailable|failed|check)' "$log" | tail -1 || true)
  echo "   $L layers: ${line:-exit $rc, no result line (log $log)}"
  [ -z "$line" ] && tail -3 "$log" | sed 's/^/     /'
  if [ "$record" = 1 ] && [ "$rc" -ne 3 ]; then
    if [ "$rc" -eq 0 ]; then
      echo "fsdp layers=$L params=${params[$L]:-?} status=ok tokens_per_s=$(field tokens_per_s "$line") batch=$batch" >> "$runs"
    else
      echo "fsdp layers=$L params=${params[$L]:-?} status=failed rc=$rc" >> "$runs"
    fi
  fi
  return "$rc"
}

if [ "$part" = all ] || [ "$part" = fsdp ]; then
  echo
  echo "== PyTorch FSDP2 + CPUOffloadPolicy: the largest size that trains"
  if [ -z "$TORCH_VERSION" ]; then
    echo "   not measured: $TORCH_MISSING"
  elif [ "$dry_run" -eq 1 ]; then
    # No GPU here: check the API and the budget logic only.
    for L in $(descending); do
      fsdp_run "$L" --check-only && break
      # Past the budget, a smaller size may pass; any other refusal holds for all.
      grep -q 'of host memory' "$log_dir/offload_fsdp_L${L}_check.log" || break
    done
  else
    echo "-- smoke run (2 layers, width 256, seq 128): checks the API before the big sizes"
    saved_batch=$batch
    batch=2
    smoke_ok=1
    C_saved=$C NH_saved=$NH T_saved=$T
    C=256 NH=4 T=128
    fsdp_run 2 --smoke || smoke_ok=0
    C=$C_saved NH=$NH_saved T=$T_saved batch=$saved_batch
    if [ "$smoke_ok" = 1 ]; then
      tries=0
      for L in $(descending); do
        # 16 bytes a parameter (fp32 weight, grad, two Adam moments) + overhead.
        need=$(awk -v n="${params[$L]}" -v o="$(to_bytes "${FSDP_HOST_OVERHEAD:-6GiB}")" 'BEGIN { printf "%.0f", 16 * n + o }')
        if [ "$need" -gt "$host_budget" ]; then
          echo "   $L layers: skipped, needs about $(gib "$need") of host memory"
          continue
        fi
        if fsdp_run "$L"; then break; fi
        tries=$((tries + 1))
        [ "$tries" -ge "${FSDP_TRIES:-3}" ] && { echo "   giving up after $tries failed sizes"; break; }
      done
    else
      echo "   the smoke run failed: FSDP2 sizes not tried (see $log_dir/offload_fsdp_L2_smoke.log)"
    fi
  fi
fi

# --- 4. the comparison ----------------------------------------------------------
# Largest ok run of a system in $runs, as "layers tokens_per_s params".
largest_ok() {
  awk -v s="$1" '$1 == s && / status=ok / {
      for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
      if (v["layers"] + 0 > best) { best = v["layers"] + 0; tps = v["tokens_per_s"]; n = v["params"] } }
    END { if (best > 0) print best, tps, n }' "$runs"
}
ok_at() {  # system layers -> tokens_per_s of its last ok run at that size, or empty
  awk -v s="$1" -v l="layers=$2" '$1 == s && $2 == l && / status=ok / { for (i = 2; i <= NF; ++i) if ($i ~ /^tokens_per_s=/) t = substr($i, 14) }
    END { if (t != "") print t }' "$runs"
}

if [ "$part" = all ] || [ "$part" = compare ]; then
  echo
  echo "== summary"
  read -r pL pT pN <<<"$(largest_ok pstar)" || true
  read -r fL fT fN <<<"$(largest_ok fsdp)" || true
  in_mem_mfu="${IN_MEMORY_MFU:-}" in_mem_model="given"
  if [ -z "$in_mem_mfu" ] && [ -f "$log_dir/in_memory.txt" ]; then
    # The in-memory reference: the 350M run, else the 124M run (last line of each).
    for m in 350m 124m; do
      line=$(grep "model=$m " "$log_dir/in_memory.txt" | tail -1 || true)
      v=$(field pstar_mfu "$line")
      if [ -n "$v" ] && [ "$v" != n/a ]; then in_mem_mfu=$v in_mem_model=$m; break; fi
    done
  fi
  if [ -n "${pL:-}" ]; then
    fpt=$(flops_per_token "$pN" "$pL" "$C" "$T")
    tflops=$(awk -v r="$pT" -v f="$fpt" 'BEGIN { printf "%.1f", r * f / 1e12 }')
    m=$(mfu "$pT" "$fpt")
    echo "pstar largest: $pL layers, $pN parameters: $pT tokens/s, $tflops TFLOP/s, MFU ${m}$([ "$m" != n/a ] && echo '%')"
    if [ "$m" = n/a ]; then
      echo "   MFU target (>= ${target_mfu}%): n/a ($([ "$dry_run" -eq 1 ] && echo 'dry run' || echo 'set PEAK_FLOPS'))"
    else
      awk -v m="$m" -v t="$target_mfu" 'BEGIN { printf "   MFU %.1f%% against the %d%% target: %s\n", m, t, (m >= t ? "met" : "not met") }'
    fi
    if [ -n "$in_mem_mfu" ] && [ "$m" != n/a ]; then
      awk -v m="$m" -v r="$in_mem_mfu" -v n="$in_mem_model" 'BEGIN {
        printf "   against the in-memory MFU (%s, %.1f%%): %.2f of it\n", n, r, m / r }'
    else
      echo "   against the in-memory MFU: n/a (no in_memory.txt with an MFU in $log_dir: run bench/gpu_in_memory.sh --log-dir $log_dir first)"
    fi
    echo "offload_largest_layers=$pL" > "$log_dir/offload_largest.env"
  else
    echo "pstar largest: none trained (see $runs and the offload_pstar_*.log files)"
  fi
  if [ -n "${fL:-}" ]; then
    echo "FSDP2 largest: $fL layers, $fN parameters: $fT tokens/s"
  else
    echo "FSDP2 largest: none trained"
  fi
  if [ -n "${pL:-}" ] && [ -n "${fL:-}" ]; then
    common=$((pL < fL ? pL : fL))
    pc=$(ok_at pstar "$common") fc=$(ok_at fsdp "$common")
    if [ -z "$pc" ] && [ "$dry_run" -eq 0 ] && [ "$part" = all ]; then
      echo "-- pstar at FSDP2's largest size, for the comparison"
      pstar_run "$common" && pc=$(ok_at pstar "$common")
    fi
    if [ -z "$fc" ] && [ "$dry_run" -eq 0 ] && [ "$part" = all ] && [ -n "$TORCH_VERSION" ]; then
      echo "-- FSDP2 at pstar's largest size, for the comparison"
      fsdp_run "$common" && fc=$(ok_at fsdp "$common")
    fi
    if [ -n "$pc" ] && [ -n "$fc" ]; then
      awk -v l="$common" -v p="$pc" -v f="$fc" 'BEGIN {
        printf "both at %d layers: pstar %.1f tokens/s, FSDP2 %.1f tokens/s, pstar/FSDP2 %.2fx\n", l, p, f, p / f }'
    else
      echo "both at $common layers: not both measured (pstar ${pc:-none}, FSDP2 ${fc:-none})"
    fi
  fi
fi

# --- 5..7. where the step waits -------------------------------------------------
# The size these parts train: the largest pstar trained here (compare writes
# it), else the largest that fits the plan.
waits_layers() {
  local L
  if [ -f "$log_dir/offload_largest.env" ]; then
    L=$(sed -nE 's/^offload_largest_layers=([0-9]+)$/\1/p' "$log_dir/offload_largest.env")
    [ -n "$L" ] && [ -n "${params[$L]:-}" ] && { echo "$L"; return; }
  fi
  for L in $(descending); do [ "${fits[$L]}" = 1 ] && { echo "$L"; return; }; done
}

# Medians over the steps after the warm-up of pstar's JSON progress lines, as
# KEY=VALUE: step_ms, kernel_ms, adam_ms, h2d_ms, d2h_ms, wait_ms, busy (percent).
step_waits() {  # log warmup
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    if not line.startswith('{'):
        continue
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if 'step' in j and 'ms_per_step' in j and j['step'] > int(sys.argv[2]):
        rows.append(j)
if not rows:
    print('steps=0')
    sys.exit(0)
def med(key, scale=1e3):
    vals = [r[key] * scale for r in rows if r.get(key) is not None and r[key] >= 0]
    return statistics.median(vals) if vals else float('nan')
step = statistics.median(r['ms_per_step'] for r in rows)
kernel, adam, h2d, d2h, wait = med('kernel_s'), med('host_adam_s'), med('h2d_s'), med('d2h_s'), med('update_wait_s')
bound = max(kernel, adam, max(h2d, d2h))
print('steps=%d step_ms=%.1f kernel_ms=%.1f adam_ms=%.1f h2d_ms=%.1f d2h_ms=%.1f wait_ms=%.1f busy=%.1f '
      'bound_ms=%.1f step_over_bound=%.3f sum_ms=%.1f speculated=%d rolled_back=%d' % (
          len(rows), step, kernel, adam, h2d, d2h, wait, 100 * kernel / step if step > 0 else 0, bound,
          step / bound if bound > 0 else float('nan'), kernel + adam + h2d + d2h,
          sum(r.get('speculated_chunks', 0) for r in rows), sum(1 for r in rows if r.get('rolled_back'))))
PY
}

# One profiled run with JSON progress lines; prints and records its waits.
waits_run() {  # layers batch overlap tag [extra --set args...]
  local L=$1 b=$2 overlap=$3 tag=$4 args log rc line tps fpt8
  shift 4
  mapfile -t args < <(batch=$b job_args "$L")
  log="$log_dir/offload_${tag}_L${L}_b${b}_${overlap}.log"
  set +e
  timeout "${RUN_TIMEOUT:-480}" "$pstar" train "${args[@]}" --set "runtime.device_memory=${plan_tier[$L]}" \
    --set "runtime.optimizer_overlap=$overlap" --set "train.grad_clip=${WAIT_GRAD_CLIP:-0}" "$@" \
    --profile --log-format json > "$log" 2>&1
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "   $L layers, batch $b, overlap $overlap: failed (exit $rc$([ "$rc" -eq 124 ] && echo ': timed out')):" \
         "$(grep -m1 'error' "$log" || tail -1 "$log")"
    echo "$tag layers=$L batch=$b overlap=$overlap status=failed rc=$rc $*" >> "$runs"
    return 1
  fi
  line=$(step_waits "$log" "$warmup")
  tps=$(awk -v b="$b" -v t="$T" -v a="$accum" -v ms="$(field step_ms "$line")" 'BEGIN { printf "%.1f", b * t * a / (ms / 1000) }')
  # With activation checkpointing the forward runs twice: 8 N per token (and 8 L C T of attention).
  fpt8=$(awk -v n="${params[$L]}" -v l="$L" -v c="$C" -v t="$T" -v k="$ckpt" 'BEGIN {
    m = (k == 1 ? 8 : 6); printf "%.0f", m * n + m * l * c * t }')
  echo "   $L layers, batch $b, overlap $overlap: $line"
  awk -v r="$tps" -v f="$fpt8" -v k="$ckpt" 'BEGIN {
    printf "     %.1f tokens/s, model FLOP rate %.1f TFLOP/s (%s N per token)\n", r, r * f / 1e12, (k == 1 ? "8" : "6") }'
  echo "$tag layers=$L batch=$b overlap=$overlap status=ok tokens_per_s=$tps $line $*" >> "$runs"
}

if [ "$part" = all ] || [ "$part" = waits ]; then
  echo
  L=$(waits_layers)
  b="${WAIT_BATCH:-$([ "$dry_run" -eq 1 ] && echo 2 || echo 8)}"
  echo "== waits: ${L:-no} layers at batch $b, overlap speculate and off, --profile (medians after $warmup warm-up steps)"
  if [ -z "$L" ]; then
    echo "   no size fits this host"
  else
    # Without a size pstar trained here before, the plan's largest may not
    # train: the next sizes down are tried.
    tries=1
    until waits_run "$L" "$b" speculate waits; do
      [ -f "$log_dir/offload_largest.env" ] && break
      [ "$tries" -ge "${PSTAR_TRIES:-3}" ] && break
      next=""
      for M in $(descending); do [ "$M" -lt "$L" ] && [ "${fits[$M]}" = 1 ] && { next=$M; break; }; done
      [ -n "$next" ] || break
      L=$next tries=$((tries + 1))
    done
    waits_run "$L" "$b" off waits || true
    on=$(grep "^waits layers=$L batch=$b overlap=speculate status=ok" "$runs" | tail -1 || true)
    off=$(grep "^waits layers=$L batch=$b overlap=off status=ok" "$runs" | tail -1 || true)
    if [ -n "$on" ]; then
      awk -v r="$(field step_over_bound "$on")" 'BEGIN {
        printf "   overlap on: step / max(kernels, Adam, copies) = %.2f against the 1.15 target: %s\n", r, (r <= 1.15 ? "met" : "not met") }'
    fi
    if [ -n "$off" ]; then
      awk -v s="$(field step_ms "$off")" -v m="$(field sum_ms "$off")" 'BEGIN {
        printf "   overlap off: step %.1f ms against the sum of kernels, Adam and copies %.1f ms (%.2f of it)\n", s, m, (m > 0 ? s / m : 0) }'
    fi
    [ "$dry_run" -eq 1 ] && echo "   (dry run: the CPU backend's figures say nothing about a GPU's)"
  fi
fi

if [ "$part" = all ] || [ "$part" = sweep ]; then
  echo
  L=$(waits_layers)
  sweep="${SWEEP_BATCHES:-$([ "$dry_run" -eq 1 ] && echo '1 2' || echo '2 4 8 16')}"
  echo "== sweep: ${L:-no} layers, batches {$sweep}, overlap speculate: where the host's Adam stops being the bound"
  if [ -n "$L" ]; then
    for b in $sweep; do waits_run "$L" "$b" speculate sweep || break; done
    awk -v l="layers=$L" '$1 == "sweep" && $2 == l && / status=ok / {
        for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "   batch %s: kernels %s ms, Adam %s ms: %s\n", v["batch"], v["kernel_ms"], v["adam_ms"],
          (v["kernel_ms"] + 0 >= v["adam_ms"] + 0 ? "compute-bound" : "Adam-bound") }' "$runs" | sort -u -t: -k1,1
  fi
fi

if [ "$part" = all ] || [ "$part" = margin ]; then
  echo
  b="${WAIT_BATCH:-$([ "$dry_run" -eq 1 ] && echo 2 || echo 8)}"
  echo "== margin: client.mem_tracer.margin_use_ratio {${MARGINS:-0.8 1.0}} at batch $b: the largest size each plans, trained"
  for ratio in ${MARGINS:-0.8 1.0}; do
    largest=""
    for L in $(descending); do
      mapfile -t args < <(batch=$b job_args "$L")
      plan=$("$pstar" plan "${args[@]}" --set "client.mem_tracer.margin_use_ratio=$ratio" \
               --set "runtime.device_memory=${plan_tier[$L]:-0}" --json 2>/dev/null) || [ $? -eq 1 ] || continue
      [ "$(plan_field min_host_bytes "$plan")" -le "$host_budget" ] && { largest=$L; break; }
    done
    if [ -z "$largest" ]; then
      echo "   ratio $ratio: no size plans on this host"
      continue
    fi
    echo "   ratio $ratio: $largest layers (${params[$largest]:-?} parameters) plan"
    waits_run "$largest" "$b" speculate margin --set "client.mem_tracer.margin_use_ratio=$ratio" || true
  done
fi
