#!/usr/bin/env bash
# ctest fixture of the container-mode tests: `setup` reaches a Docker daemon
# (starting one when none runs, as root) and makes the runtime image
# (scripts/runtime-image.sh); `cleanup` stops the daemon if setup started it.
# Setup writes STATE_DIR/state: "ready IMAGE CGROUP_VERSION LIB_DIR" or
# "skip REASON"; LIB_DIR holds the libraries the binaries link from outside
# Debian, which containers mount read-only at /opt/pstar/lib.
# Where Docker cannot run here, or its data root has less than
# PSTAR_CONTAINER_MIN_FREE_MB free (default 3072: the vfs driver copies the
# image for every layer and container), the tests skip on that reason; with
# PSTAR_EXPECT_DOCKER=1 setup fails instead.
#
# Usage: container_runtime.sh setup BUILD_DIR STATE_DIR | cleanup STATE_DIR
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
action="${1:?usage}"

skip() {
  echo "skip $*" > "$state/state"
  echo "container tests skip: $*"
  if [ "${PSTAR_EXPECT_DOCKER:-0}" = 1 ]; then
    echo "PSTAR_EXPECT_DOCKER=1: a skip is a failure" >&2
    exit 1
  fi
  exit 0
}

case "$action" in
  setup)
    build="$2" state="$3"
    mkdir -p "$state"
    rm -f "$state/state" "$state/dockerd.pid"
    command -v docker > /dev/null || skip "the docker client is not installed"
    if ! docker info > /dev/null 2>&1; then
      [ "$(id -u)" = 0 ] || skip "no Docker daemon runs and starting one needs root"
      command -v dockerd > /dev/null || skip "no Docker daemon runs and dockerd is not installed"
      grep -qw memory /proc/cgroups 2> /dev/null || [ -f /sys/fs/cgroup/cgroup.controllers ] ||
        skip "the kernel has no cgroup memory controller"
      # shellcheck disable=SC2086
      setsid dockerd ${PSTAR_DOCKERD_ARGS:---storage-driver=vfs --iptables=false --bridge=none} \
        > "$state/dockerd.log" 2>&1 < /dev/null &
      echo $! > "$state/dockerd.pid"
      for _ in $(seq 1 60); do
        docker info > /dev/null 2>&1 && break
        kill -0 "$(cat "$state/dockerd.pid")" 2> /dev/null || break
        sleep 0.5
      done
      docker info > /dev/null 2>&1 || skip "dockerd did not start: $(grep -v '^$' "$state/dockerd.log" | tail -n 1)"
    fi
    [ "$(docker info --format '{{.MemoryLimit}}' 2> /dev/null)" = true ] ||
      skip "the Docker daemon cannot set memory limits (no cgroup memory controller)"
    cgroup=$(docker info --format '{{.CgroupVersion}}' 2> /dev/null)
    data_root=$(docker info --format '{{.DockerRootDir}}' 2> /dev/null)
    need_mb=${PSTAR_CONTAINER_MIN_FREE_MB:-3072}
    free_mb=$(df -Pm "${data_root:-/var/lib/docker}" 2> /dev/null | awk 'NR == 2 { print $4 }')
    [ -n "$free_mb" ] || skip "the Docker data root ${data_root:-/var/lib/docker} cannot be read"
    [ "$free_mb" -ge "$need_mb" ] ||
      skip "the Docker data root $data_root has $free_mb MB free, under the $need_mb MB the tests need"
    out=$(bash "$root/scripts/runtime-image.sh" "$build" "$state/lib" 2>&1)
    rc=$?
    echo "$out"
    # The build's own error lines come before the script's last line.
    [ $rc = 0 ] || skip "the runtime image could not be made: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    echo "ready $(tail -n 1 <<<"$out") ${cgroup:-1} $state/lib" > "$state/state"
    ;;
  cleanup)
    state="$2"
    if [ -f "$state/dockerd.pid" ]; then
      pid=$(cat "$state/dockerd.pid")
      kill "$pid" 2> /dev/null
      for _ in $(seq 1 40); do kill -0 "$pid" 2> /dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2> /dev/null
      rm -f "$state/dockerd.pid"
    fi
    ;;
  *) echo "usage: $0 setup BUILD_DIR STATE_DIR | cleanup STATE_DIR" >&2; exit 2 ;;
esac
