#!/usr/bin/env bash
# Configures and builds pstar (Release) into build/ (or $PSTAR_BUILD_DIR).
# Extra arguments go to CMake, e.g. -DPSTAR_WITH_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" --parallel "$(nproc)"
