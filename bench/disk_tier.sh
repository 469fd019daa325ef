#!/usr/bin/env bash
# The disk tier's read and write bandwidth against a plain O_DIRECT
# sequential copy of the same bytes on the same disk, in one run
# (bin/disk_tier_bench; what it times is described there). Target: the tier
# at >= 90% of the plain copy both ways.
#
# Usage: bench/disk_tier.sh [--dir DIR] [--gib G] [--home-mib M] [--rounds N] [--threads T]
#   --dir   a directory on the disk to measure (default: a fresh one under
#           $TMPDIR, else /var/tmp); it needs 2 x G GiB free
# Environment: PSTAR_BUILD_DIR (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${PSTAR_BUILD_DIR:-$root/build}/bin/disk_tier_bench"
[ -x "$bin" ] || { echo "disk_tier.sh: $bin is missing: build first (bash scripts/build.sh)" >&2; exit 2; }
dir="" args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift ;;
    --gib|--home-mib|--rounds|--threads) args+=("$1" "$2"); shift ;;
    *) echo "disk_tier.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
own=""
if [ -z "$dir" ]; then
  own="$(mktemp -d "${TMPDIR:-/var/tmp}/pstar-disk-bench-XXXXXX")"
  dir="$own"
fi
trap '[ -z "$own" ] || rm -rf "$own"' EXIT
echo "disk: $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' ')"
out="$("$bin" --dir "$dir" "${args[@]}")"
echo "$out"
echo "$out" | awk '/^ratio:/ {
  split($2, w, "="); split($3, r, "=");
  printf "target: tier >= 0.90 of plain: write %s, read %s\n", (w[2] >= 0.9 ? "met" : "NOT met"), (r[2] >= 0.9 ? "met" : "NOT met") }'
