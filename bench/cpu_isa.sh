#!/usr/bin/env bash
# A portable build's CPU kernels against a -march=native build's: the default
# job trained by both on this machine, in one run, with the step-time ratio
# and the final losses side by side. The portable build picks its kernels'
# instruction set at start-up (kernels/cpu/isa.h), as the images do; its
# x86-64 baseline variant, pinned with PSTAR_CPU_ISA, shows what that choice
# is worth. With --image TAG the worker image trains the same job too, in a
# container on this machine's Docker daemon (scripts/build-images.sh builds it).
#
# A shared machine's speed drifts between runs, so each round runs every
# variant back to back, ratios are taken within the round, and with several
# rounds their medians are printed.
#
# Usage: bench/cpu_isa.sh [--steps N] [--rounds R] [--image TAG]
#   The native build is $PSTAR_BUILD_DIR (default build/, scripts/build.sh);
#   the portable one is configured and built into build-portable/ when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
native="${PSTAR_BUILD_DIR:-$root/build}/bin/pstar"
portable_dir="${PSTAR_PORTABLE_BUILD_DIR:-$root/build-portable}"
steps=300 rounds=1 image=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --image) image="$2"; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--rounds R] [--image TAG]" >&2; exit 2 ;;
  esac
done
if ! [[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 10 && "$rounds" =~ ^[0-9]+$ && "$rounds" -ge 1 ]]; then
  echo "cpu_isa: --steps must be at least 10 and --rounds at least 1" >&2
  exit 2
fi
[ -x "$native" ] || { echo "cpu_isa: $native is missing (bash scripts/build.sh)" >&2; exit 2; }
if ! grep -q '^cpu kernels: native ' <<<"$("$native" info)"; then
  echo "cpu_isa: $native is not a -march=native build (its 'pstar info': $("$native" info | grep '^cpu kernels'))" >&2
  exit 2
fi
if [ ! -x "$portable_dir/bin/pstar" ]; then
  echo "cpu_isa: building the portable pstar into $portable_dir"
  cmake -S "$root" -B "$portable_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSTAR_NATIVE_ARCH=OFF \
    -DPSTAR_WITH_CUDA=OFF -DPSTAR_BUILD_OPERATOR=OFF -DPSTAR_BUILD_TESTS=OFF > /dev/null
  cmake --build "$portable_dir" --target pstar --parallel "$(nproc)" > /dev/null
fi
portable="$portable_dir/bin/pstar"
if [ -n "$image" ] && ! docker image inspect "$image" > /dev/null 2>&1; then
  echo "cpu_isa: image $image not found on the Docker daemon (${DOCKER_HOST:-default socket})" >&2
  exit 2
fi

field() { sed -E "s/.* $2=([0-9.]+).*/\1/" <<<"$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# One training of the default job: its summary line.
train() {
  local name="$1"
  shift
  "$@" train --set "train.steps=$steps" | grep '^summary:' || { echo "cpu_isa: $name failed" >&2; exit 1; }
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), threads=$(nproc)"
echo "portable build picks: $("$portable" info | sed -n 's/^cpu kernels: \([^ ]*\).*/\1/p')"
names=(portable portable-x86-64)
[ -n "$image" ] && names+=(image)
declare -A ratios=()
final_native=""
for round in $(seq 1 "$rounds"); do
  declare -A line=()
  line[native]=$(train native env -u PSTAR_CPU_ISA "$native")
  line[portable]=$(train portable env -u PSTAR_CPU_ISA "$portable")
  line[portable-x86-64]=$(train portable-x86-64 env PSTAR_CPU_ISA=x86-64 "$portable")
  if [ -n "$image" ]; then
    line[image]=$(train image docker run --rm --network none --read-only --tmpfs /tmp "$image")
  fi
  native_tps=$(field "${line[native]}" tokens_per_s)
  final_native=$(field "${line[native]}" final_loss)
  echo "round $round/$rounds, default job, $steps steps"
  printf '  %-16s %8.0f tokens/s  final_loss %s\n' native "$native_tps" "$final_native"
  for n in "${names[@]}"; do
    tps=$(field "${line[$n]}" tokens_per_s)
    loss=$(field "${line[$n]}" final_loss)
    r=$(awk -v a="$native_tps" -v b="$tps" 'BEGIN { printf "%.4f", a / b }')
    ratios[$n]+="$r"$'\n'
    same=$(awk -v a="$loss" -v b="$final_native" 'BEGIN { d = a - b; if (d < 0) d = -d; print (d <= 2e-4) ? "same" : "DIFFERENT" }')
    printf '  %-16s %8.0f tokens/s  final_loss %s (%s)  step time / native %.2fx\n' "$n" "$tps" "$loss" "$same" "$r"
    [ "$same" = same ] || { echo "cpu_isa: $n's final loss $loss differs from native's $final_native" >&2; exit 1; }
  done
done
printf 'median of %d round(s), step time over the native build:' "$rounds"
for n in "${names[@]}"; do printf ' %s %.2fx' "$n" "$(median <<<"${ratios[$n]%$'\n'}")"; done
echo
