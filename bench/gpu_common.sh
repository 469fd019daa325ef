# shellcheck shell=bash
# Shared by the GPU benchmarks (bench/gpu_*.sh, bench/chunk_transfer.sh,
# bench/run-gpu-benchmarks.sh); sourced, not run. Finds pstar (a build
# directory), a python3 with PyTorch, the GPU and its bf16 peak, and holds the FLOP and log arithmetic.
#
# Environment:
#   PSTAR_BUILD_DIR  directory holding bin/pstar (default: <source>/build;
#                    scripts/gpu-session.sh --bench sets its own build)
#   PYTHON           python3 to run the PyTorch peers (default: the first of
#                    python3, /usr/bin/python3, /opt/torch/.venv/bin/python3
#                    that imports torch)
#   PEAK_FLOPS       the GPU's dense bf16 peak in FLOP/s (default: from its name)

bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$bench_dir/.." && pwd)"
PSTAR_BUILD_DIR="${PSTAR_BUILD_DIR:-$root/build}"
export PSTAR_BUILD_DIR
pstar="$PSTAR_BUILD_DIR/bin/pstar"

# The calling script's header comment, for --help.
print_header() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

require_pstar() {
  [ -x "$pstar" ] || die "$pstar not found: build it (ninja -C BUILD pstar) and set PSTAR_BUILD_DIR=BUILD"
  ensure_libs "$pstar"
}

# Libraries a binary cannot find (e.g. NCCL on a host whose CUDA toolkit lacks
# it, where PyTorch's wheels carry one): looked up where the GPU session looks
# (scripts/gpu/cuda-libs.sh: the CUDA toolkit, then the python3s' nvidia-*
# packages), and their folders put on LD_LIBRARY_PATH.
# shellcheck source=scripts/gpu/cuda-libs.sh
source "$root/scripts/gpu/cuda-libs.sh"
ensure_libs() {
  local bin="$1" missing dirs=() d lib found
  missing=$(ldd "$bin" 2>/dev/null | awk '$3 == "not" { print $1 }' || true)
  [ -z "$missing" ] && return 0
  mapfile -t dirs < <(cuda_lib_candidates | awk '!seen[$0]++')
  for lib in $missing; do
    found=""
    for d in ${dirs[@]+"${dirs[@]}"}; do
      if [ -e "$d/$lib" ]; then found="$d"; break; fi
    done
    if [ -n "$found" ]; then
      case ":${LD_LIBRARY_PATH:-}:" in *":$found:"*) ;; *) export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
      echo "libraries: $lib from $found/$lib (not found by $(basename "$bin") itself)"
    else
      die "$(basename "$bin") needs $lib, which is neither on the loader's path nor in the CUDA toolkit or python3's nvidia packages"
    fi
  done
}

# PYTHON and TORCH_VERSION, or TORCH_VERSION empty and TORCH_MISSING saying why.
# shellcheck disable=SC2034  # read by the scripts that source this file
find_torch() {
  TORCH_VERSION="" TORCH_MISSING=""
  local candidates=() py v
  if [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON"); else candidates=(python3 /usr/bin/python3 /opt/torch/.venv/bin/python3); fi
  for py in "${candidates[@]}"; do
    command -v "$py" >/dev/null 2>&1 || continue
    if v=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
      PYTHON="$(command -v "$py")" TORCH_VERSION="$v"
      return 0
    fi
  done
  TORCH_MISSING="no python3 with PyTorch found (tried: ${candidates[*]}; set PYTHON=...)"
  PYTHON=""
  return 1
}

# GPU_NAME, GPU_MEM_BYTES (0 without nvidia-smi) and PEAK_FLOPS.
detect_gpu() {
  GPU_NAME="" GPU_MEM_BYTES=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    local line
    line=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
    if [ -n "$line" ]; then
      GPU_NAME="$(sed -E 's/ *,.*//' <<<"$line")"
      GPU_MEM_BYTES=$(awk -F, '{ printf "%d", $2 * 1048576 }' <<<"$line")
    fi
  fi
  if [ -z "${PEAK_FLOPS:-}" ]; then
    # Dense bf16 tensor-core peaks from the vendor's data sheets.
    case "$GPU_NAME" in
      *H100*PCIe*) PEAK_FLOPS=756e12 ;;
      *H100*NVL*) PEAK_FLOPS=835e12 ;;
      *H100* | *H200*) PEAK_FLOPS=989e12 ;;
      *A100*) PEAK_FLOPS=312e12 ;;
      *) PEAK_FLOPS="" ;;
    esac
  fi
}

describe_gpu() {
  if [ -n "$GPU_NAME" ]; then
    awk -v n="$GPU_NAME" -v m="$GPU_MEM_BYTES" -v p="${PEAK_FLOPS:-}" 'BEGIN {
      printf "gpu: %s, %.1f GiB, bf16 peak %s\n", n, m / 2^30, p == "" ? "unknown (set PEAK_FLOPS)" : sprintf("%.0f TFLOP/s", p / 1e12) }'
  else
    echo "gpu: none visible to nvidia-smi"
  fi
}

# Model FLOPs per trained token (forward + backward, recomputation not
# counted): 6 per parameter plus the attention scores and their use,
# 6 * layers * width * seq.  flops_per_token N L C T
flops_per_token() {
  awk -v n="$1" -v l="$2" -v c="$3" -v t="$4" 'BEGIN { printf "%.0f", 6 * n + 6 * l * c * t }'
}

# MFU in percent, or "n/a" without a peak.  mfu TOKENS_PER_S FLOPS_PER_TOKEN
mfu() {
  if [ -z "${PEAK_FLOPS:-}" ] || [ -z "$1" ] || [ "$1" = n/a ]; then echo n/a; return; fi
  awk -v r="$1" -v f="$2" -v p="$PEAK_FLOPS" 'BEGIN { printf "%.1f", 100 * r * f / p }'
}

# The value of KEY=VALUE in a line.  field KEY LINE
field() { sed -nE "s/(^|.* )$1=([^ ]+).*/\2/p" <<<"$2" | head -1; }

# A number from `pstar plan --json`.  plan_field KEY JSON
plan_field() { sed -nE "s/.*\"$1\": ([0-9]+).*/\1/p" <<<"$2" | head -1; }

# Tokens/s over the steps after the first WARMUP, from pstar's per-step lines
# (log_every 1: "step i/n | ... | X tok/s | ..."); each step trains the same
# tokens, so the rate is the harmonic mean.  pstar_steady_tps LOG WARMUP
pstar_steady_tps() {
  awk -v w="$2" '/^step [0-9]+\/[0-9]+ \|/ {
      split($2, s, "/"); if (s[1] + 0 <= w) next
      for (i = 1; i <= NF; ++i) if ($i == "tok/s") { r = $(i - 1) + 0; if (r > 0) { n++; inv += 1 / r } }
    }
    END { if (n > 0) printf "%.1f", n / inv; else print "n/a" }' "$1"
}

# Bytes from a size with a unit (GiB, MiB, GB...) or plain bytes.
to_bytes() {
  awk -v s="$1" 'BEGIN {
    n = s + 0; u = s; sub(/^[0-9.]+/, "", u)
    m["" ] = 1; m["B"] = 1; m["KiB"] = 2^10; m["MiB"] = 2^20; m["GiB"] = 2^30; m["TiB"] = 2^40
    m["KB"] = 1e3; m["MB"] = 1e6; m["GB"] = 1e9; m["TB"] = 1e12
    if (!(u in m)) exit 1
    printf "%.0f", n * m[u] }'
}

# The host budget pstar gives one rank when runtime.host_memory is 0: the
# cgroup v2 limit, else physical RAM, times overall_cpu_mem_ratio (0.8).
default_host_budget() {
  local limit ram
  ram=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo)
  limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)
  if [ "$limit" != max ] && [ "$limit" -lt "$ram" ]; then ram=$limit; fi
  awk -v r="$ram" 'BEGIN { printf "%.0f", r * 0.8 }'
}

gib() { awk -v b="$1" 'BEGIN { if (b < 2^30) printf "%.1f MiB", b / 2^20; else printf "%.1f GiB", b / 2^30 }'; }

# Runs a command with its output in LOG and on stdout; returns its status.
run_logged() {
  local log="$1"
  shift
  set +e
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}
