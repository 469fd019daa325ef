#!/usr/bin/env bash
# Installs every dependency, builds everything, runs the whole test suite, then the
# whole suite (but the GPU session's dry run, the container tests, the
# tokenizers' reference corpora and the install page's walk) again under ASan, LSan and
# UBSan (a Clang build of the CPU configuration) and the fuzz targets from
# that build for a bounded time (scripts/sanitize.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_BUILD_DIR:-$root/build}"
bash "$root/scripts/install-deps.sh"
# The tests and the operator, also where the first command built pstar alone.
bash "$root/scripts/build.sh" -DPSTAR_BUILD_TESTS=ON -DPSTAR_BUILD_OPERATOR=ON
cd "$build"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
# Everything again under the sanitizers, then the readers of untrusted input
# under libFuzzer.
bash "$root/scripts/sanitize.sh" "${PSTAR_FUZZ_SECONDS:-30}"
