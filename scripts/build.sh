#!/usr/bin/env bash
# Configures and builds pstar (Release) into build/ (or $PSTAR_BUILD_DIR):
# every target, or only $PSTAR_BUILD_TARGET's. Extra arguments go to CMake,
# e.g. -DPSTAR_WITH_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
target=()
if [ -n "${PSTAR_BUILD_TARGET:-}" ]; then target=(--target "$PSTAR_BUILD_TARGET"); fi
cmake --build "$build" --parallel "$(nproc)" "${target[@]}"
