#!/usr/bin/env bash
# The container-mode tests' runtime image: pstar and pstar-operator from a
# build tree on the debootstrapped Debian base (tests/containers/runtime.Dockerfile),
# tagged pstar-runtime:<content hash of the binaries>, so an image already
# made from the same binaries is reused. Needs a reachable Docker daemon
# (tests/containers/container_runtime.sh starts one for ctest).
#
# Usage: scripts/runtime-image.sh BUILD_DIR   (prints the tag on its last line)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PSTAR_DOCKER_SCRIPT="runtime-image"
# shellcheck source=scripts/lib/docker.sh
source "$root/scripts/lib/docker.sh"
build="${1:?usage: runtime-image.sh BUILD_DIR}"
for b in pstar pstar-operator; do
  [ -x "$build/bin/$b" ] || docker_fail "$build/bin/$b is missing (build it first)"
done
docker info > /dev/null 2>&1 || docker_fail "no Docker daemon is reachable"
hash=$(cat "$build/bin/pstar" "$build/bin/pstar-operator" "$root/tests/containers/runtime.Dockerfile" |
  sha256sum | cut -c1-16)
tag="pstar-runtime:$hash"
if docker image inspect "$tag" > /dev/null 2>&1; then
  echo "$tag"
  exit 0
fi
tmp=$(mktemp -d /tmp/pstar-runtime.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
docker_debian_base "$tmp" debian:12.12-slim
ctx="$tmp/context"
mkdir -p "$ctx/bin" "$ctx/lib"
cp "$build/bin/pstar" "$build/bin/pstar-operator" "$ctx/bin/"
# The libraries resolved outside Debian's folders travel with the binaries.
ldd "$build/bin/pstar" "$build/bin/pstar-operator" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    case "$lib" in
      /lib/* | /usr/lib/*) ;;
      *) cp -L "$lib" "$ctx/lib/" ;;
    esac
  done
start=$(date +%s)
docker build --network host --rm --force-rm -f "$root/tests/containers/runtime.Dockerfile" -t "$tag" "$ctx" \
  > "$tmp/build.log" 2>&1 || { tail -n 15 "$tmp/build.log" >&2; docker_fail "docker build of $tag failed"; }
echo "built $tag in $(($(date +%s) - start)) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%d MB", $1 / 1e6 }'))"
echo "$tag"
