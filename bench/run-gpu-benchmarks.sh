#!/usr/bin/env bash
# Every GPU benchmark in order, each one's output in OUT_DIR/<part>.log and
# the result lines gathered in OUT_DIR/summary.txt. About 20 to 25 minutes on
# one H100 or H200; the parts can be run in separate invocations with the
# same OUT_DIR (later parts read what earlier ones wrote there).
#
# Usage: bench/run-gpu-benchmarks.sh OUT_DIR [--dry-run] [--archive FILE] [PART...]
#   parts, in their default order (about how long each takes on the GPU):
#     env              host, GPU, driver, PyTorch, libraries            (10 s)
#     transfer         chunk copy bandwidth, backend against plain      (30 s)
#     in-memory        GPT-2 124M and 350M in GPU memory, pstar and
#                      PyTorch eager and compiled (bench/gpu_in_memory.sh) (4-6 min)
#     step             GPT-2 124M only, 20 steps: the ratio to PyTorch, the
#                      profile and its cost (gpu_in_memory.sh --quick)   (under 4 min)
#     llama-step       not by default: Llama 3.2 1B in GPU memory, bf16, seq
#                      2048, 20 steps: the same against PyTorch running the
#                      same architecture (gpu_in_memory.sh --quick --models
#                      llama-1b)                                          (under 5 min)
#     attention        attention alone, each forward kernel and the backward,
#                      against PyTorch SDPA's flash and cuDNN backends at head
#                      sizes 64 and 128 (bench/gpu_attention.sh)          (1 min)
#     offload-plan     the plan of the 2B..20B shapes against this host   (10 s)
#     offload-pstar    pstar: the largest shape that trains              (2-5 min)
#     overlap          copy time hidden behind compute at that shape     (2 min)
#     offload-fsdp     FSDP2 + CPU offload: the largest it trains         (3-8 min)
#     offload-compare  both at the largest size both train               (0-3 min)
#     offload-waits    that size at batch 8, optimizer overlap on and off,
#                      profiled: step against max(kernels, Adam, copies)  (3-6 min)
#     offload-sweep    that size at batches 2..16: where Adam stops bounding (5-9 min)
#     offload-margin   margin_use_ratio 0.8 and 1.0: the largest each plans, trained (3-6 min)
#     adam             CPU Adam against the bandwidth bound, 1..16 threads (1-2 min)
#     zero-netns       not by default: ZeRO over a 1 Gbit/s shaped link at 2 and 3
#                      ranks on the CPU backend, each rank with cores of its own
#                      (bench/zero_netns.sh; skipped where namespaces or tc are
#                      missing)                                          (1-2 min)
#     zero-netns-12    not by default: the same at 12 layers, GPT-2's depth (2-3 min)
#   "offload" stands for offload-plan, offload-pstar, offload-fsdp and offload-compare.
#   Three invocations of under 10 minutes each (the same OUT_DIR each time:
#   later parts read what earlier ones wrote there):
#     run-gpu-benchmarks.sh OUT env transfer in-memory adam
#     run-gpu-benchmarks.sh OUT offload-plan offload-pstar overlap
#     run-gpu-benchmarks.sh OUT offload-fsdp offload-compare
#   and for the optimizer's overlap, after offload-pstar in the same OUT:
#     run-gpu-benchmarks.sh OUT offload-plan offload-waits
#     run-gpu-benchmarks.sh OUT offload-plan offload-sweep   (or offload-margin)
#   --dry-run  every part in its CPU dry-run mode (tiny shapes; no GPU figures)
#   --archive FILE  at the end, OUT_DIR as one .tar.gz (to copy back one file)
# Environment: passed on to the scripts (bench/gpu_common.sh and each script's
#   header); PART_TIMEOUT bounds each part in seconds (default 540), RUN_TIMEOUT
#   each offloaded training run (default 300), TORCH_TIMEOUT each in-memory
#   PyTorch run (default 300).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/gpu_common.sh
source "$here/gpu_common.sh"

if [ "$#" -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  print_header
  exit 2
fi
mkdir -p "$1" && out="$(cd "$1" && pwd)"
shift
dry=()
parts=()
archive=""
while [ "$#" -gt 0 ]; do
  a=$1
  shift
  case "$a" in
    --dry-run) dry=(--dry-run) ;;
    --archive) archive="${1:?--archive needs a file}"; shift ;;
    offload) parts+=(offload-plan offload-pstar offload-fsdp offload-compare) ;;
    env | transfer | in-memory | step | llama-step | attention | offload-plan | offload-pstar | overlap | offload-fsdp | offload-compare | \
      offload-waits | offload-sweep | offload-margin | adam | zero-netns | zero-netns-12) parts+=("$a") ;;
    *) die "unknown part $a (try --help)" ;;
  esac
done
[ "${#parts[@]}" -gt 0 ] || parts=(env transfer in-memory offload-plan offload-pstar overlap offload-fsdp offload-compare adam)
export TORCH_TIMEOUT="${TORCH_TIMEOUT:-300}" RUN_TIMEOUT="${RUN_TIMEOUT:-300}"

environment() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n) $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "memory: $(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 2^20 }' /proc/meminfo);" \
       "pstar's default host budget $(gib "$(default_host_budget)")"
  echo "pstar: $pstar"
  "$pstar" info 2>&1 | sed 's/^/  /'
  detect_gpu
  describe_gpu
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max,clocks.max.sm \
      --format=csv 2>&1 | sed 's/^/  /'
  else
    echo "  (no nvidia-smi)"
  fi
  if find_torch; then
    echo "pytorch: $TORCH_VERSION at $PYTHON"
    "$PYTHON" -c 'import torch; print("  cuda available:", torch.cuda.is_available(), "| cuda", torch.version.cuda,
      "| device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
      "| compile:", hasattr(torch, "compile"))' 2>&1
  else
    echo "pytorch: not available: $TORCH_MISSING"
  fi
  for b in chunk_transfer_bench cpu_adam_bench; do
    if [ -x "$PSTAR_BUILD_DIR/bin/$b" ]; then echo "bench binary: $b present"; else echo "bench binary: $b MISSING"; fi
  done
}

run_part() {
  local part=$1 log="$out/$1.log" rc
  local t0=$SECONDS
  echo "=== $part ($(date -u +%H:%M:%S))"
  case "$part" in
    env) environment > "$log" 2>&1; rc=$?; cat "$log" ;;
    *)
      local cmd
      case "$part" in
        transfer) cmd=("$here/chunk_transfer.sh" --skip-overlap --sizes-mib "16,32,64,128,256,1024") ;;
        in-memory) cmd=("$here/gpu_in_memory.sh") ;;
        step) cmd=("$here/gpu_in_memory.sh" --quick) ;;
        llama-step) cmd=("$here/gpu_in_memory.sh" --quick --models llama-1b) ;;
        attention) cmd=("$here/gpu_attention.sh") ;;
        offload-plan) cmd=("$here/gpu_offload_scale.sh" --part plan) ;;
        offload-pstar) cmd=("$here/gpu_offload_scale.sh" --part pstar) ;;
        offload-fsdp) cmd=("$here/gpu_offload_scale.sh" --part fsdp) ;;
        offload-compare) cmd=("$here/gpu_offload_scale.sh" --part compare) ;;
        offload-waits) cmd=("$here/gpu_offload_scale.sh" --part waits) ;;
        offload-sweep) cmd=("$here/gpu_offload_scale.sh" --part sweep) ;;
        offload-margin) cmd=("$here/gpu_offload_scale.sh" --part margin) ;;
        overlap) cmd=("$here/chunk_transfer.sh" --skip-bandwidth) ;;
        adam) cmd=("$here/cpu_adam_bandwidth.sh") ;;
        zero-netns) cmd=("$here/zero_netns.sh" --ranks "2 3" --rates 1gbit --steps 12 --events) ;;
        zero-netns-12) cmd=("$here/zero_netns.sh" --layers 12 --ranks "2 3" --rates 1gbit --steps 10 --events) ;;
      esac
      timeout "${PART_TIMEOUT:-540}" bash "${cmd[@]}" ${dry[@]+"${dry[@]}"} --log-dir "$out" 2>&1 | tee "$log"
      rc=${PIPESTATUS[0]}
      ;;
  esac
  echo "=== $part: exit $rc after $((SECONDS - t0)) s"
  {
    echo "--- $part (exit $rc, $((SECONDS - t0)) s)"
    case "$part" in
      env) grep -E '^(gpu|pytorch|cpu|memory):' "$log" ;;
      transfer) grep -E '^(device|summary|skipped|not measured)' "$log" ;;
      in-memory | step | llama-step)
        grep -E '^(in_memory:|[0-9a-z-]+: (pstar )?MFU|DRY RUN)|^  pstar (profile:|--profile:|  op )' "$log" ;;
      attention) grep -E '^(attention:|ratio:|DRY RUN|skipped)' "$log" ;;
      offload-plan) grep -E '^(plan:|DRY RUN)' "$log" ;;
      offload-pstar | offload-fsdp) grep -E '^   (tokens/s|[0-9]+ layers:|failed|giving up|not measured)|^-- ' "$log" ;;
      offload-compare) sed -n '/^== summary/,$p' "$log" ;;
      offload-waits | offload-sweep | offload-margin) grep -E '^(==|   )' "$log" | grep -v '^== plan' ;;
      overlap) grep -E '^overlap' "$log" ;;
      adam) grep -E '^ +[0-9]+ |^pstar/pytorch|^pytorch' "$log" ;;
      zero-netns | zero-netns-12) grep -E '^(netns|link|zero_netns|shape)|timeline +(step|median)' "$log" ;;
    esac
  } >> "$out/summary.txt"
  return 0
}

echo "pstar GPU benchmarks$([ "${#dry[@]}" -gt 0 ] && echo ' (DRY RUN on the CPU)'): parts ${parts[*]}; logs in $out"
for p in "${parts[@]}"; do run_part "$p"; done
echo
echo "=== summary ($out/summary.txt)"
cat "$out/summary.txt"
if [ -n "$archive" ]; then
  tar -C "$(dirname "$out")" -czf "$archive" "$(basename "$out")" && echo "archive: $archive"
fi
