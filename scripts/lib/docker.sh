# Docker helpers shared by scripts/build-images.sh and the container-mode
# tests' runtime image (scripts/runtime-image.sh). Source it; every failure
# prints one line naming what failed and exits 2.
#
#   docker_ensure_daemon STATE_DIR   reach a daemon, or start one (stopped by
#                                    docker_stop_daemon, and only then)
#   docker_debian_base TAG...        make each missing debian:<ver>[-slim] tag
#                                    from a debootstrap of that release
#   docker_stage_context ROOT DIR    the build context: the checkout's files
#                                    without .git or build trees

docker_fail() {
  echo "${PSTAR_DOCKER_SCRIPT:-docker}: $*" >&2
  exit 2
}

# The daemon's flags when this script starts one: the vfs driver, no iptables
# and no default bridge work in any container sandbox; builds and containers
# use the host network.
: "${PSTAR_DOCKERD_ARGS:=--storage-driver=vfs --iptables=false --bridge=none}"
PSTAR_DOCKERD_PID=""

docker_ensure_daemon() {
  local state="$1"
  command -v docker > /dev/null || docker_fail "the docker client is not installed (apt-get install docker.io)"
  if docker info > /dev/null 2>&1; then
    return 0
  fi
  [ "$(id -u)" = 0 ] || docker_fail "no Docker daemon is reachable, and starting one needs root"
  command -v dockerd > /dev/null || docker_fail "no Docker daemon is reachable and dockerd is not installed (apt-get install docker.io)"
  mkdir -p "$state"
  # shellcheck disable=SC2086
  dockerd $PSTAR_DOCKERD_ARGS > "$state/dockerd.log" 2>&1 &
  PSTAR_DOCKERD_PID=$!
  local i
  for i in $(seq 1 60); do
    if docker info > /dev/null 2>&1; then
      echo "started dockerd (pid $PSTAR_DOCKERD_PID, log $state/dockerd.log); it stops when this script ends"
      return 0
    fi
    if ! kill -0 "$PSTAR_DOCKERD_PID" 2> /dev/null; then
      PSTAR_DOCKERD_PID=""
      docker_fail "dockerd exited at start: $(docker_log_reason "$state/dockerd.log")"
    fi
    sleep 0.5
  done
  docker_stop_daemon
  docker_fail "dockerd did not answer within 30 s: $(docker_log_reason "$state/dockerd.log")"
}

# The line of a log that says why: its first error, else its last line.
docker_log_reason() {
  grep -m 1 -iE 'error|unknown|fail|denied|cannot|not found|no such' "$1" 2> /dev/null ||
    grep -v '^$' "$1" 2> /dev/null | tail -n 1
}

docker_stop_daemon() {
  [ -n "$PSTAR_DOCKERD_PID" ] || return 0
  kill "$PSTAR_DOCKERD_PID" 2> /dev/null || true
  local i
  for i in $(seq 1 40); do
    kill -0 "$PSTAR_DOCKERD_PID" 2> /dev/null || break
    sleep 0.5
  done
  kill -9 "$PSTAR_DOCKERD_PID" 2> /dev/null || true
  PSTAR_DOCKERD_PID=""
}

# debian:12.12 -> bookworm, and so on.
docker_debian_codename() {
  case "${1%%.*}" in
    11) echo bullseye ;;
    12) echo bookworm ;;
    13) echo trixie ;;
    *) docker_fail "no Debian codename known for release $1" ;;
  esac
}

# docker_debian_base TMP TAG...: each tag debian:<ver> or debian:<ver>-slim
# that the daemon lacks is made from one debootstrap per release (minbase; the
# -slim tag also drops documentation, man pages and locales, as Debian's slim
# images do) and imported under that tag.
docker_debian_base() {
  local tmp="$1"
  shift
  local tag ver rootfs codename mirror="${PSTAR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  for tag in "$@"; do
    docker image inspect "$tag" > /dev/null 2>&1 && continue
    [[ "$tag" =~ ^debian:([0-9]+(\.[0-9]+)?)(-slim)?$ ]] || docker_fail "cannot make base image $tag: only debian:<version>[-slim] can be made here"
    ver="${BASH_REMATCH[1]}"
    codename=$(docker_debian_codename "$ver")
    rootfs="$tmp/debootstrap-$codename"
    if [ ! -f "$rootfs/.complete" ]; then
      [ "$(id -u)" = 0 ] || docker_fail "debootstrap needs root"
      command -v debootstrap > /dev/null || docker_fail "debootstrap is not installed (apt-get install debootstrap)"
      rm -rf "$rootfs"
      echo "debootstrap --variant=minbase $codename from $mirror (for $tag)"
      if ! debootstrap --variant=minbase "$codename" "$rootfs" "$mirror" > "$tmp/debootstrap-$codename.log" 2>&1; then
        docker_fail "debootstrap of $codename from $mirror failed: $(docker_log_reason "$tmp/debootstrap-$codename.log")"
      fi
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
      touch "$rootfs/.complete"
    fi
    local made="$rootfs"
    if [[ "$tag" == *-slim ]]; then
      made="$tmp/slim-$codename"
      rm -rf "$made"
      cp -a "$rootfs" "$made"
      mkdir -p "$made/etc/dpkg/dpkg.cfg.d"
      printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
        'path-include /usr/share/locale/locale.alias' > "$made/etc/dpkg/dpkg.cfg.d/docker-slim"
      find "$made/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2> /dev/null || true
      rm -rf "$made"/usr/share/man/* "$made"/usr/share/info/*
      find "$made/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2> /dev/null || true
    fi
    tar -C "$made" --exclude=./.complete -c . | docker import --change 'CMD ["bash"]' - "$tag" > /dev/null ||
      docker_fail "docker import of $tag failed"
    echo "made $tag from a debootstrap of $codename (Debian $(cat "$rootfs/etc/debian_version")), imported under that tag"
    [ "$made" = "$rootfs" ] || rm -rf "$made"
  done
}

# The checkout's tracked and untracked-but-not-ignored files, so .git, build
# trees and anything else .gitignore names stay out of the context (the
# legacy builder ignores the per-Dockerfile .dockerignore files).
docker_stage_context() {
  local root="$1" dir="$2"
  mkdir -p "$dir"
  if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
      [ -e "$f" ] && printf '%s\0' "$f"
    done | tar --null -T - -c) | tar -x -C "$dir"
  else
    tar -C "$root" --exclude=./.git --exclude='./build' --exclude='./build-*' --exclude='__pycache__' -c . |
      tar -x -C "$dir"
  fi
}
