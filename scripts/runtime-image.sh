#!/usr/bin/env bash
# The container-mode tests' runtime image: pstar and pstar-operator from a
# build tree on the debootstrapped Debian base (tests/containers/runtime.Dockerfile),
# tagged pstar-runtime:<content hash of the binaries>, so an image already
# made from the same binaries is reused. The shared libraries the binaries
# link from outside Debian's folders (CUDA's, in a CUDA build: 760 MB, which
# the vfs storage driver would copy for every layer and container) are staged
# in LIB_DIR instead, for the containers to mount read-only at /opt/pstar/lib.
# Needs a reachable Docker daemon (tests/containers/container_runtime.sh
# starts one for ctest).
#
# Usage: scripts/runtime-image.sh BUILD_DIR LIB_DIR
#   prints the tag on its last line; exit 2 with one line on failure
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PSTAR_DOCKER_SCRIPT="runtime-image"
# shellcheck source=scripts/lib/docker.sh
source "$root/scripts/lib/docker.sh"
build="${1:?usage: runtime-image.sh BUILD_DIR LIB_DIR}"
libs="${2:?usage: runtime-image.sh BUILD_DIR LIB_DIR}"
for b in pstar pstar-operator; do
  [ -x "$build/bin/$b" ] || docker_fail "$build/bin/$b is missing (build it first)"
done
docker info > /dev/null 2>&1 || docker_fail "no Docker daemon is reachable"

# The node's libraries: what ldd resolves outside /lib and /usr/lib.
mkdir -p "$libs"
find "$libs" -mindepth 1 -delete
ldd "$build/bin/pstar" "$build/bin/pstar-operator" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    case "$lib" in
      /lib/* | /usr/lib/*) ;;
      *) cp -L "$lib" "$libs/" ;;
    esac
  done

hash=$(cat "$build/bin/pstar" "$build/bin/pstar-operator" "$root/tests/containers/runtime.Dockerfile" |
  sha256sum | cut -c1-16)
tag="pstar-runtime:$hash"
if ! docker image inspect "$tag" > /dev/null 2>&1; then
  tmp=$(mktemp -d /tmp/pstar-runtime.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  docker_debian_base "$tmp" debian:12.12-slim
  mkdir -p "$tmp/context/bin"
  cp "$build/bin/pstar" "$build/bin/pstar-operator" "$tmp/context/bin/"
  start=$(date +%s)
  # One retry: a build on a busy daemon has failed once and passed at once.
  for try in 1 2; do
    if docker build --network host --rm --force-rm -f "$root/tests/containers/runtime.Dockerfile" -t "$tag" \
      "$tmp/context" > "$tmp/build.log" 2>&1; then
      break
    fi
    tail -n 15 "$tmp/build.log" >&2
    [ "$try" = 2 ] && docker_fail "docker build of $tag failed twice: $(docker_log_reason "$tmp/build.log")"
    echo "docker build of $tag failed ($(docker_log_reason "$tmp/build.log")); trying once more" >&2
    sleep 2
  done
  echo "built $tag in $(($(date +%s) - start)) s ($(docker image inspect --format '{{.Size}}' "$tag" |
    awk '{ printf "%d MB", $1 / 1e6 }'))"
fi
# Images of earlier binaries go, unless a container still uses one.
docker images pstar-runtime --format '{{.Repository}}:{{.Tag}}' | grep -vx "$tag" |
  xargs -r docker rmi > /dev/null 2>&1 || true
# Every library resolves in the container, with the node's mounted.
check=$(docker run --rm --network none --mount "type=bind,source=$libs,target=/opt/pstar/lib,readonly" \
  --entrypoint /bin/sh "$tag" -c \
  'ldd /usr/local/bin/pstar /usr/local/bin/pstar-operator | grep "not found"; /usr/local/bin/pstar --version' 2>&1) ||
  docker_fail "$tag does not run: $(tail -n 1 <<<"$check")"
if grep -q "not found" <<<"$check"; then
  docker_fail "$tag lacks libraries: $(grep 'not found' <<<"$check" | head -n 3 | tr '\n' ' ')"
fi
echo "$tag"
