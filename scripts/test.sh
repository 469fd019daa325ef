#!/usr/bin/env bash
# Installs the dependencies, builds, runs the whole test suite, then the fuzz
# targets for a bounded time (scripts/fuzz.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
# The readers of untrusted input under libFuzzer, ASan and UBSan.
bash "$root/scripts/fuzz.sh" "${PSTAR_FUZZ_SECONDS:-30}"
