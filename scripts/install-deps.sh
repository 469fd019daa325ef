#!/usr/bin/env bash
# Installs the Debian packages pstar needs:
#   install-deps.sh run   what building and running `pstar` needs (the first command)
#   install-deps.sh       everything: the operator, the tests, the sanitizer and
#                         fuzz passes, the benchmarks, the images
# Safe to run again: it does nothing when everything is already installed.
set -euo pipefail
level="${1:-all}"
case "$level" in
  run|all) ;;
  *) echo "install-deps: expected 'run' or nothing, got '$level'" >&2; exit 2 ;;
esac

# Building and running the worker.
PACKAGES=(
  cmake g++ ninja-build ccache pkg-config
  libyaml-cpp-dev nlohmann-json3-dev prometheus-cpp-dev libgloo-dev
  libpcre2-dev  # the tokenizers' patterns
  libopenblas-dev libopenblas-openmp-dev
)
if [ "$level" = all ]; then
  PACKAGES+=(
    libcpprest-dev libssl-dev  # the operator's API client
    libgtest-dev libgmock-dev
    python3 python3-numpy python3-torch python3-kubernetes python3-jsonschema
    prometheus  # promtool, which the metrics tests run
    clang libomp-dev  # the sanitizer build and the libFuzzer targets (scripts/sanitize.sh, fuzz.sh)
    iproute2  # ip netns and tc: ZeRO ranks over shaped links (bench/zero_netns.sh)
    debootstrap  # the images' Debian base without a registry (scripts/lib/docker.sh)
  )
  # A Docker engine for the images and the container-mode tests: Debian's,
  # unless one (e.g. docker-ce) is installed already.
  if ! command -v dockerd >/dev/null 2>&1; then
    PACKAGES+=(docker.io)
  fi
  # node and npm run the tokenizer's references (scripts/npm-refs.sh); a node
  # from elsewhere (e.g. NodeSource, which bundles npm) is kept.
  if ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing: ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
