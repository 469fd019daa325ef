#!/usr/bin/env bash
# The whole test suite under AddressSanitizer, LeakSanitizer and UBSan: one
# Clang build of the CPU configuration (worker, operator, tests and the
# libFuzzer targets) into build-sanitize/ (or $PSTAR_SANITIZE_BUILD_DIR),
# ctest there, then the fuzz targets from the same build (scripts/fuzz.sh,
# SECONDS each, default 30). Any sanitizer report fails the test it occurs
# in (UBSan does not recover; ASan and LSan exit non-zero). Reports are
# suppressed only where tests/sanitizers/{lsan,ubsan}.supp name third-party
# code, each with its reason.
#
#   scripts/sanitize.sh [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
seconds="${1:-30}"
command -v clang++ >/dev/null || { echo "sanitize: clang++ is not installed (scripts/install-deps.sh installs it)" >&2; exit 2; }

export PSTAR_FUZZ_BUILD_DIR="$build" PSTAR_FUZZ_BUILD_TESTS=ON
bash "$root/scripts/fuzz.sh" --configure-only
cmake --build "$build" --parallel "$(nproc)"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizers/ubsan.supp"
# The GPU session's dry run (label gpu_session) builds and runs the CUDA
# configuration with the host compiler: nothing of it is instrumented, and
# the first pass ran it already. The container tests (label containers) hold
# ranks' peak RSS to their pod's limit, which ASan's shadow memory inflates;
# they too ran in the first pass. The tokenizers' reference comparisons
# (label reference_corpus: dozens of pstar runs loading 128k-token
# vocabularies, 7 CPU-minutes under ASan) ran there too; under
# the sanitizers the tokenizers run in their unit tests, the fuzz targets and
# chat_format_test, which loads the same real files. The walk of
# docs/install.md (label docs) checks the page's steps, which the first pass
# did; the operator and the worker it starts run under the sanitizers in the
# operator's end-to-end tests and the integration tests.
(cd "$build" && ctest --output-on-failure --parallel "$(nproc)" --timeout 1800 \
  -LE "gpu_session|containers|reference_corpus|docs")

bash "$root/scripts/fuzz.sh" "$seconds"
