#!/usr/bin/env bash
# Builds the project's images from its Dockerfiles on a machine without
# registry access: the CPU worker (docker/worker-cpu.Dockerfile) and the
# operator (docker/operator.Dockerfile); the CUDA worker too when its NVIDIA
# base is already on the daemon (it cannot be fetched here; skipped in one
# line otherwise).
#
# - Reaches a Docker daemon or starts one (root; stopped again at the end, and
#   only if this script started it).
# - Makes the Debian bases the Dockerfiles pin (debian:12.12, -slim) by
#   debootstrap of that release when the daemon lacks them, and says so.
# - Builds from a staged copy of the checkout (no .git, no build trees), with
#   --network host for the images' apt-get, removes the build stages' images,
#   checks each image runs as its non-root user on a read-only root
#   filesystem, and prints sizes and build times.
#
# Usage: scripts/build-images.sh [--repository REPO] [--only NAME]...
#   REPO defaults to ghcr.io/patrickstar-k8s; NAME is worker-cpu, operator or
#   worker. Exit 2 when the daemon, debootstrap or a build fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PSTAR_DOCKER_SCRIPT="build-images"
# shellcheck source=scripts/lib/docker.sh
source "$root/scripts/lib/docker.sh"

repository="ghcr.io/patrickstar-k8s"
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --repository) repository="$2"; shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--repository REPO] [--only worker-cpu|operator|worker]..." >&2; exit 2 ;;
  esac
done
[ ${#only[@]} -gt 0 ] || only=(worker-cpu operator worker)
version=$(sed -nE 's/^project\(patrickstar VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")

tmp=$(mktemp -d /tmp/pstar-images.XXXXXX)
cleanup() {
  docker_stop_daemon
  rm -rf "$tmp"
}
trap cleanup EXIT
docker_ensure_daemon "$tmp/daemon"

stage="$tmp/context"
docker_stage_context "$root" "$stage"
echo "build context: $(du -sh "$stage" | cut -f1) staged from $root"

report=()
for name in "${only[@]}"; do
  dockerfile="$stage/docker/$name.Dockerfile"
  [ -f "$dockerfile" ] || docker_fail "no Dockerfile docker/$name.Dockerfile"
  tag="$repository/pstar-$name:$version"
  # The bases it names, with build arguments' defaults substituted.
  mapfile -t bases < <(awk '
    /^ARG [A-Z_]+=/ { split($2, kv, "="); arg[kv[1]] = kv[2] }
    /^FROM / { b = $2; for (k in arg) gsub("\\$\\{" k "\\}", arg[k], b); print b }' "$dockerfile" | sort -u)
  missing=()
  for b in "${bases[@]}"; do
    [[ "$b" == debian:* ]] && continue
    docker image inspect "$b" > /dev/null 2>&1 || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "skipping pstar-$name: its base ${missing[*]} is not on this daemon and cannot be fetched without a registry"
    report+=("pstar-$name|skipped|-|base ${missing[*]} missing")
    continue
  fi
  debian=()
  for b in "${bases[@]}"; do [[ "$b" == debian:* ]] && debian+=("$b"); done
  [ ${#debian[@]} -eq 0 ] || docker_debian_base "$tmp" "${debian[@]}"

  echo "building $tag from docker/$name.Dockerfile"
  start=$(date +%s)
  if ! docker build --network host --rm --force-rm -f "$dockerfile" -t "$tag" "$stage" > "$tmp/$name.log" 2>&1; then
    tail -n 20 "$tmp/$name.log" >&2
    docker image prune -f --filter "label=io.patrickstar.stage=build" > /dev/null || true
    docker_fail "docker build of $tag failed (the log's end is above)"
  fi
  seconds=$(($(date +%s) - start))
  # The build stage's image (untagged, gigabytes of compilers) goes.
  docker image prune -f --filter "label=io.patrickstar.stage=build" > /dev/null
  # Runs as its non-root user on a read-only root filesystem.
  user=$(docker run --rm --read-only --network none --entrypoint id "$tag" -u)
  [ "$user" != 0 ] || docker_fail "$tag runs as root"
  if [[ "$name" == worker* ]]; then
    docker run --rm --read-only --network none --tmpfs /tmp "$tag" info > "$tmp/$name.info" ||
      docker_fail "$tag: pstar info failed in a read-only container"
    isa=$(sed -n 's/^cpu kernels: \([^ ]*\).*/\1/p' "$tmp/$name.info")
    check="pstar info ok, cpu kernels $isa"
  else
    docker run --rm --read-only --network none "$tag" --help > /dev/null ||
      docker_fail "$tag: pstar-operator --help failed in a read-only container"
    check="pstar-operator --help ok"
  fi
  size=$(docker image inspect --format '{{.Size}}' "$tag")
  report+=("pstar-$name|$((size / 1000000)) MB|${seconds} s|user $user, read-only root: $check")
done

echo
printf '%-20s %-10s %-8s %s\n' image size build checks
for r in "${report[@]}"; do
  IFS='|' read -r n s t c <<<"$r"
  printf '%-20s %-10s %-8s %s\n' "$n" "$s" "$t" "$c"
done
left=$(docker images -q --filter dangling=true --filter "label=io.patrickstar.stage=build" | wc -l)
[ "$left" = 0 ] || docker_fail "$left build-stage images were left behind"
