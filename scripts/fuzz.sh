#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: the config parser, token shards,
# safetensors files, Hugging Face model directories, checkpoint manifests,
# the GPT-2 tokenizer, the rendezvous store's server, the operator's
# decisions on API objects) with Clang, ASan and UBSan into
# build-fuzz/ (or $PSTAR_FUZZ_BUILD_DIR) and runs each for SECONDS (default
# 30) from its committed seed corpus. New inputs go to a scratch directory,
# never into the repository. Exits 1 naming the target and the crashing
# input when one fails. scripts/sanitize.sh shares the build: it sets
# PSTAR_FUZZ_BUILD_TESTS=ON (the tests are built there too) and runs
# `fuzz.sh --configure-only` first.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --configure-only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PSTAR_FUZZ_BUILD_DIR:-$root/build-fuzz}"
configure_only=0
if [ "${1:-}" = --configure-only ]; then configure_only=1; shift; fi
seconds="${1:-30}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(config token_shard safetensors manifest bpe_tokenizer store hf_dir jsonl_examples job_actions)
command -v clang++ >/dev/null || { echo "fuzz: clang++ is not installed (scripts/install-deps.sh installs it)" >&2; exit 2; }

# -O1 and line tables only: the sanitizers' reports keep file:line, and the
# build (tests included, for scripts/sanitize.sh) takes half the time of -O2 -g.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSTAR_FUZZ=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DPSTAR_WITH_CUDA=OFF -DPSTAR_BUILD_OPERATOR=ON -DPSTAR_BUILD_TESTS="${PSTAR_FUZZ_BUILD_TESTS:-OFF}" \
  -DPSTAR_NATIVE_ARCH=OFF > /dev/null
[ "$configure_only" -eq 1 ] && exit 0
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/%/_fuzz}"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# One target's run; its report goes to $scratch/$t.report, a failure also
# leaves $scratch/$t.failed.
fuzz_target() {
  local t=$1 log="$scratch/$1.log"
  mkdir -p "$scratch/$t" "$scratch/$t-artifacts"
  if (cd "$scratch" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$build/bin/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "$( [ "$t" = store ] && echo -detect_leaks=0 || echo -detect_leaks=1)" \
      -artifact_prefix="$scratch/$t-artifacts/" "$scratch/$t" "$root/tests/fuzz/corpus/$t") > "$log" 2>&1; then
    echo "fuzz: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs in ${seconds} s, no failure"
  else
    touch "$scratch/$t.failed"
    echo "fuzz: $t: FAILED"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -10
    echo "  the run's last lines:"
    grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|INITED|RELOAD)|^(INFO|MS):|^"' "$log" | tail -40 | sed 's/^/    /'
    for a in "$scratch/$t-artifacts"/*; do [ -f "$a" ] && echo "  input (base64): $(base64 -w0 "$a" | head -c 2000)"; done
  fi > "$scratch/$t.report"
}
# Each fuzzer is one process on one core: as many at once as there are
# cores, each for its full time; the reports in the targets' order.
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  fuzz_target "$t" &
done
wait || true
status=0
for t in "${targets[@]}"; do
  cat "$scratch/$t.report"
  if [ -f "$scratch/$t.failed" ]; then status=1; fi
done
exit "$status"
