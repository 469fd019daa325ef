#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the benchmarks need.
# Safe to run again: it does nothing when everything is already installed.
set -euo pipefail

PACKAGES=(
  cmake g++ ninja-build ccache pkg-config
  libyaml-cpp-dev libcpprest-dev libssl-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libgloo-dev
  libopenblas-dev libopenblas-openmp-dev
  python3 python3-numpy python3-torch python3-kubernetes python3-jsonschema
  prometheus  # promtool, which the metrics tests run
  clang libomp-dev  # the libFuzzer targets (scripts/fuzz.sh)
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
