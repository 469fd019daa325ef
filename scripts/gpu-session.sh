#!/usr/bin/env bash
# The GPU session in one command: on a GPU host with a compiler, the CUDA
# toolkit, cmake and ninja (no Debian packages, no network), builds the worker
# side of pstar against the .deb files scripts/gpu-prepare.sh left in gpu-deps/
# (unpacked into a private prefix, never into /), proves the build used none
# of the host's own packages, and runs one pass of GPU work. Writes into OUTDIR
# a one-page summary.txt and logs.tar.gz holding every log.
#
#   scripts/gpu-session.sh OUTDIR [PASS...] [--dry-run]
#
# PASSes run in the order given, after one build (default: --quick):
#   --quick   (default) every CUDA kernel and backend test, a 2-step GPT-2
#             124M run in fp32, bf16 and fp16 (the test and the pstar
#             binary) and a profiled bf16 run, then kernel tests at small
#             shapes under compute-sanitizer (memcheck, synccheck,
#             racecheck): about 3 minutes on an H100 host with 16 cores,
#             the build (1 minute) included
#   --check   the quick pass without the sanitizer
#   --sanitize  the sanitizer pass alone
#   --full    the quick pass's tests, then every other GPU test binary, each
#             bounded in time, then the sanitizer pass
#   --tune    the kernel tuner (bench/cuda_tuning_bench): every candidate of
#             every KernelTuning knob timed at GPT-2 124M's shapes and checked
#             against the default; the winners' rows for
#             kernels/cuda/tuning_table.inc go into the summary and into
#             this host's copy of the table, and the build is brought up to
#             date, so the passes after it run the winners (about a minute)
#   --llama   the Llama family on the GPU: its kernels' and grouped-query
#             attention's GPU tests, its training tests against the CPU
#             backend, then Llama 3.2 1B in GPU memory, bf16, seq 2048 against
#             PyTorch eager and torch.compile running the same architecture
#             (bench part llama-step), then compute-sanitizer on its kernels'
#             tests (last: what a deadline cuts first); about 8 minutes with
#             the build on an H200 host
#   --bench PART...  GPU benchmarks (bench/run-gpu-benchmarks.sh); PARTs as
#             there, default "env transfer in-memory adam"; see
#             bench/README.md for the slices that each fit in one 10-minute
#             command
#   For example, one call for the step: --check --tune --bench env step attention
#   --dry-run everything but the GPU work (the CI check of this script): the
#             host check, the unpack, the build, the isolation proof and the
#             test binaries' start-up; no PSTAR_EXPECT_GPU
#
# Environment: DEPS_DIR (default <source>/gpu-deps), WORK_DIR (default
# <source>/build-gpu: the prefix and the build, kept between calls on a warm
# host), JOBS (default: every core), DEADLINE_S (default 560: no new step
# starts after this many seconds, so one call ends within 10 minutes),
# BUILD_LIMIT_S (default 480: the build step's bound), PYTHON (the python3
# with PyTorch, for the benchmarks).
set -uo pipefail
started=$SECONDS
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { sed -n '2,49p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ "$#" -ge 1 ] || usage
case "$1" in -h | --help | -*) usage ;; esac
mkdir -p "$1" && out="$(cd "$1" && pwd)"
shift
passes=() dry_run=0 parts=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick | --check | --sanitize | --full | --tune | --llama | --bench) passes+=("${1#--}") ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage ;;
    -*) echo "gpu-session: unknown option $1" >&2; usage ;;
    *)
      [ "${#passes[@]}" -gt 0 ] && [ "${passes[${#passes[@]}-1]}" = bench ] ||
        { echo "gpu-session: $1: parts go after --bench" >&2; usage; }
      parts+=("$1")
      ;;
  esac
  shift
done
[ "${#passes[@]}" -gt 0 ] || passes=(quick)
deps_dir="${DEPS_DIR:-$root/gpu-deps}"
work="${WORK_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
deadline="${DEADLINE_S:-560}"
build_limit="${BUILD_LIMIT_S:-480}"
for limit in "$deadline" "$build_limit"; do
  case "$limit" in
    '' | *[!0-9]*) echo "gpu-session: DEADLINE_S and BUILD_LIMIT_S take whole seconds, not '$limit'" >&2; exit 2 ;;
  esac
done
logs="$out/logs"
rm -rf "$logs" "$out/summary.txt" "$out/logs.tar.gz"
mkdir -p "$logs" "$work"
summary="$out/summary.txt"

say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - (SECONDS - started))); }
finish() {
  say "elapsed: $((SECONDS - started)) s"
  tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
  say "verdict: $1"
  echo "gpu-session: $out/summary.txt, $out/logs.tar.gz"
  [ "$1" = PASSED ]
  exit $?
}
verdict=PASSED
# A step: NAME TIMEOUT COMMAND...; its output in logs/NAME.log, one line in the summary.
step() {
  local name="$1" limit="$2" rc t0=$SECONDS
  shift 2
  if [ "$(left)" -lt 20 ]; then
    say "$name: NOT RUN (out of time: $(left) s left of ${deadline} s)"
    verdict=FAILED
    return 1
  fi
  [ "$limit" -gt "$(left)" ] && limit="$(left)"
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  local counts
  counts="$(sed -n 's/^\[  \(PASSED\|SKIPPED\|FAILED\)  *\] \([0-9]*\) tests\{0,1\}[.,].*/\1 \2/p' "$logs/$name.log" | tr '\n' ' ')"
  if [ "$rc" -eq 0 ]; then
    say "$name: passed ($((SECONDS - t0)) s) ${counts:+| $counts}"
  else
    [ "$rc" -eq 124 ] && rc="timeout after ${limit} s"
    say "$name: FAILED ($rc, $((SECONDS - t0)) s) ${counts:+| $counts}"
    grep -E '^\[  FAILED  \]|pstar: |error' "$logs/$name.log" | head -8 | sed 's/^/    /' | tee -a "$summary"
    verdict=FAILED
  fi
  return 0
}

say "gpu-session: ${passes[*]}$([ "$dry_run" -eq 1 ] && echo ' (dry run)') on $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "source: $(git -C "$root" describe --always --dirty 2>/dev/null || echo 'no git')"

# --- The host ----------------------------------------------------------------
missing=()
for tool in g++ cmake ninja tar; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
# shellcheck source=scripts/gpu/cuda-libs.sh
source "$root/scripts/gpu/cuda-libs.sh"
# The toolkit's own nvcc, not a wrapper on PATH: one stable compiler path for
# CMake's cache, and the toolkit root for the isolation check.
cuda_root="$(cuda_toolkit_root)"
nvcc="${cuda_root:+$cuda_root/bin/nvcc}"
[ -n "$nvcc" ] && [ -x "$nvcc" ] || missing+=(nvcc)
command -v dpkg-deb >/dev/null 2>&1 || command -v ar >/dev/null 2>&1 || missing+=("dpkg-deb or ar")
if [ "${#missing[@]}" -gt 0 ]; then
  say "host: missing ${missing[*]}: cannot build here"
  finish FAILED
fi
say "host: $(g++ --version | head -1); nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'); $(cmake --version | head -1); ninja $(ninja --version); $(nproc) cores"
if ! echo 'int main(){}' | g++ -fopenmp -x c++ - -o "$work/omp-check" 2>"$logs/openmp-check.log"; then
  say "host: g++ cannot build with -fopenmp (libgomp missing?): see logs/openmp-check.log"
  finish FAILED
fi
gpus=0 arch=90
if [ "$dry_run" -eq 0 ]; then
  if ! nvidia-smi > "$logs/nvidia-smi.log" 2>&1; then
    say "host: nvidia-smi failed: no usable GPU (see logs/nvidia-smi.log)"
    finish FAILED
  fi
  gpus="$(nvidia-smi -L | grep -c '^GPU')"
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
  [ -n "$cap" ] && arch="$cap"
  say "gpu: $gpus x $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), sm_$arch"
fi

# --- Dependencies: the private prefix and the CUDA libraries --------------------
step unpack 120 bash "$root/scripts/gpu/unpack-debs.sh" "$deps_dir" "$work/deps"
[ "$verdict" = PASSED ] || finish FAILED
deps="$work/deps"
CUDA_EXTRA_INCLUDE=""
if ! find_cuda_libs; then
  say "cuda libraries:"; printf '%s' "$CUDA_LIBS_REPORT" | tee -a "$summary"
  finish FAILED
fi
say "cuda libraries:"; printf '%s' "$CUDA_LIBS_REPORT" | tee -a "$summary"
deps_lib_dirs="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib:$deps/usr/lib/x86_64-linux-gnu/openblas-openmp"
export LD_LIBRARY_PATH="$deps_lib_dirs:$(IFS=:; echo "${CUDA_LIB_DIRS[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# pkg-config (which CMake's FindCURL consults) reads the prefix's .pc files only.
export PKG_CONFIG_LIBDIR="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$deps"

# --- Configure, build, prove the isolation ------------------------------------------
build="$work/build"
cmake_args=(-G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPSTAR_WITH_CUDA=ON -DPSTAR_CUDA_TUNING=ON
  -DPSTAR_BUILD_OPERATOR=OFF -DPSTAR_DEPS_ROOT="$deps" -DCMAKE_CUDA_COMPILER="$nvcc"
  -DCMAKE_CUDA_ARCHITECTURES="$arch" ${CUDA_CMAKE_ARGS[@]+"${CUDA_CMAKE_ARGS[@]}"})
# A dry run proves the build and its isolation, and only starts the test
# binaries: its host C++ at -O0, which compiles faster. The device code and
# the kernels' .cu files keep their flags, and the project's own build
# (scripts/test.sh) compiled the same sources optimized already.
if [ "$dry_run" -eq 1 ]; then
  cmake_args+=(-DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG")
fi
if [ -n "$CUDA_EXTRA_INCLUDE" ]; then
  cmake_args+=(-DCMAKE_CXX_FLAGS="-isystem $CUDA_EXTRA_INCLUDE" -DCMAKE_CUDA_FLAGS="-isystem $CUDA_EXTRA_INCLUDE")
fi
# A build made with another CUDA compiler would make CMake drop its cache and
# configure again without these arguments (finding the system's packages):
# start that build afresh.
if [ -f "$build/CMakeCache.txt" ] && ! grep -qx "CMAKE_CUDA_COMPILER:[A-Z]*=$nvcc" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
step configure 120 cmake "${cmake_args[@]}"
[ "$verdict" = PASSED ] || finish FAILED
step build "$build_limit" cmake --build "$build" --parallel "$jobs" --target gpu_session
[ "$verdict" = PASSED ] || finish FAILED
# The proof that matters is CI's dry run; on a GPU host a failure is reported
# and the GPU work goes on (the build did succeed).
if python3 "$root/scripts/gpu/check_isolation.py" "$build" "$deps" "$root" "$cuda_root" \
  ${CUDA_LIB_DIRS[@]+"${CUDA_LIB_DIRS[@]/%//..}"} > "$logs/isolation.log" 2>&1; then
  say "isolation: passed"
elif [ "$dry_run" -eq 1 ]; then
  say "isolation: FAILED"
  verdict=FAILED
else
  say "isolation: WARNING: the build used some of this host's own files (going on)"
fi
sed -n 's/^check-isolation: //p; /^  [A-Za-z]/p' "$logs/isolation.log" | grep -v ' => ' | sed 's/^ */    /' | head -20 >> "$summary"
[ "$verdict" = PASSED ] || finish FAILED

bin="$build/bin"
export PSTAR_SOURCE_DIR="$root" PSTAR_BINARY="$bin/pstar"
step pstar-info 30 "$bin/pstar" info
sed 's/^/    /' "$logs/pstar-info.log" | head -12 >> "$summary"
if [ "$dry_run" -eq 1 ]; then
  # The test binaries start and skip their GPU cases (no GPU here).
  step kernels-cuda 300 "$bin/kernels_cuda_test" --gtest_brief=1
  step cudnn-plan 60 "$bin/cudnn_plan_test" --gtest_brief=1
  step cuda-backend 120 "$bin/cuda_backend_test" --gtest_brief=1
  step gpu-training 120 "$bin/gpu_training_test" --gtest_brief=1
  step tune 60 "$bin/cuda_tuning_bench" --reps 1
  finish "$verdict"
fi
export PSTAR_EXPECT_GPU="$gpus"

# --- The passes ----------------------------------------------------------------
# pstar itself, GPT-2 124M at its real shapes, 2 steps (a precision is added).
gpt2_run=("$bin/pstar" train --set model.preset=gpt2-124m --set data.source=generated --set train.batch_size=4
  --set train.seq_len=1024 --set train.steps=2 --set train.warmup_steps=1 --set train.log_every=1
  --set runtime.device=cuda)
sanitizer_pass() {
  local tool filter limit
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    say "sanitizer: compute-sanitizer not on PATH: skipped"
    return
  fi
  if ! compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/kernels_cuda_test" \
    --gtest_filter='CudaSumTest.*' > "$logs/sanitizer-probe.log" 2>&1; then
    say "sanitizer: compute-sanitizer refused this device: $(grep -m1 -iE 'error|not supported' "$logs/sanitizer-probe.log")"
    return
  fi
  for tool in memcheck synccheck racecheck; do
    # Small shapes only: the model-shape tests would take the whole call.
    # racecheck is some hundred times slower: the kernels that share memory
    # between threads, in the 16-bit types (the tensor-core attention) and
    # fp32's for the rest.
    filter='-*ModelShapes*:*Deterministic*'
    [ "$tool" = racecheck ] &&
      filter='CudaAttentionTest/bf16.*:CudaAttentionTest/fp16.*:*LayerNorm*:*Classifier*:*Reduce*:*Sum*-*ModelShapes*:*Deterministic*'
    # racecheck ran 95 s of its bound on an H200 (2026-11-28) before the
    # 16-byte kernels' tests were added to its filter.
    limit=150
    [ "$tool" = racecheck ] && limit=240
    step "sanitizer-$tool" "$limit" compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin/kernels_cuda_test" \
      --gtest_filter="$filter" --gtest_brief=1
  done
}
quick_pass() {
  step kernels-cuda 200 "$bin/kernels_cuda_test" --gtest_brief=1
  step cudnn-plan 30 "$bin/cudnn_plan_test" --gtest_brief=1
  step cuda-backend 60 "$bin/cuda_backend_test" --gtest_brief=1
  step gpt2-test 120 "$bin/gpu_training_test" --gtest_filter='GpuTraining.Gpt2SmallTrainsTwoStepsInEveryPrecision'
  # cuDNN's attention in training (chosen through PSTAR_KERNEL_TUNING).
  step cudnn-training 120 "$bin/gpu_training_test" \
    --gtest_filter='GpuTraining.CudnnAttentionTrainsAndRepeatsItsBits:GpuTraining.ABadKernelTuningOverrideIsRefusedInOneLine'
  for p in fp32 bf16 fp16; do step "gpt2-pstar-$p" 90 "${gpt2_run[@]}" --set train.precision="$p"; done
  # Where a bf16 step's time goes (docs/profiling.md), its top lines kept in
  # the summary.
  step gpt2-profile 90 "${gpt2_run[@]}" --set train.precision=bf16 --set train.batch_size=8 \
    --set train.steps=6 --profile
  sed -n '/^profile:/,$p' "$logs/gpt2-profile.log" | head -24 | sed 's/^/    /' >> "$summary"
}
# The Llama family's kernels and grouped-query attention (every form, cuDNN's
# route included), packed examples in every attention kernel, the
# encoder's and classifier's row parts and cross-entropy at 128,256 and
# 151,936 classes; its training tests against the CPU backend; the step
# benchmark; compute-sanitizer on those kernel tests last.
llama_kernels='CudaLlamaKernelsTest*:CudaAttentionTest*Grouped*:CudaAttentionTest*Packed*:CudnnAttentionTest*:CudaClassifierTest*:CudaEncoderTest*'
llama_pass() {
  step llama-kernels 150 "$bin/kernels_cuda_test" --gtest_brief=1 --gtest_filter="$llama_kernels"
  step llama-training 200 "$bin/gpu_training_test" --gtest_brief=1 \
    --gtest_filter='GpuTraining.LlamaFamily*:GpuTraining.PackedExamples*'
  # The bench leaves the sanitizer about two minutes.
  local bench=$(( $(left) - 120 ))
  [ "$bench" -ge 90 ] || bench=90
  step llama-step "$bench" env PSTAR_BUILD_DIR="$build" PART_TIMEOUT=$(( bench - 20 )) \
    bash "$root/bench/run-gpu-benchmarks.sh" "$logs/llama-bench" env llama-step
  [ -f "$logs/llama-bench/summary.txt" ] && sed 's/^/    /' "$logs/llama-bench/summary.txt" >> "$summary"
  if command -v compute-sanitizer >/dev/null 2>&1; then
    local tool
    for tool in memcheck racecheck; do
      step "llama-sanitizer-$tool" 55 compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin/kernels_cuda_test" \
        --gtest_brief=1 --gtest_filter="CudaLlamaKernelsTest/bf16.*:CudaAttentionTest/bf16.Grouped*"
    done
  else
    say "sanitizer: compute-sanitizer not on PATH: skipped"
  fi
}
# The tuner's winners into this host's copy of the table, and the build
# brought up to date (kernels/CMakeLists.txt reads the table), so the passes
# after --tune run them.
apply_tuning_rows() {
  local rows="$logs/tune-rows.inc" table="$root/kernels/cuda/tuning_table.inc"
  sed -n 's/^row: //p' "$logs/tune.log" > "$rows"
  if [ ! -s "$rows" ]; then
    say "tuning: no rows: the passes after it run the defaults"
    return
  fi
  cat "$rows" >> "$table"
  say "tuning: $(wc -l < "$rows") row(s) applied to this host's table; the passes after it run them"
  step rebuild "$build_limit" cmake --build "$build" --parallel "$jobs" --target gpu_session
}
bench_started=0
for pass in "${passes[@]}"; do
  case "$pass" in
    quick)
      quick_pass
      sanitizer_pass
      ;;
    check) quick_pass ;;
    llama) llama_pass ;;
    sanitize) sanitizer_pass ;;
    full)
      quick_pass
      step gpu-training 240 "$bin/gpu_training_test" --gtest_brief=1 \
        --gtest_filter='-GpuTraining.Gpt2SmallTrainsTwoStepsInEveryPrecision'
      step nccl 60 "$bin/gpu_test" --gtest_brief=1
      step profiler 60 "$bin/profiler_test" --gtest_brief=1 --gtest_filter='Profiler.*Gpu*'
      step sync-check 120 env PSTAR_CUDA_SYNC=1 "$bin/gpu_training_test" --gtest_brief=1 \
        --gtest_filter='GpuTraining.MatchesTheCpuBackendInFp32'
      sanitizer_pass
      ;;
    tune)
      step tune 300 "$bin/cuda_tuning_bench"
      grep -E '^(tune|row):' "$logs/tune.log" | sed 's/^/    /' >> "$summary"
      apply_tuning_rows
      ;;
    bench)
      # One bench pass takes every part named after any --bench.
      [ "$bench_started" -eq 0 ] || continue
      bench_started=1
      [ "${#parts[@]}" -gt 0 ] || parts=(env transfer in-memory adam)
      step bench "$(left)" env PSTAR_BUILD_DIR="$build" PART_TIMEOUT=$(( $(left) - 20 )) \
        bash "$root/bench/run-gpu-benchmarks.sh" "$logs/bench" "${parts[@]}"
      [ -f "$logs/bench/summary.txt" ] && sed 's/^/    /' "$logs/bench/summary.txt" >> "$summary"
      ;;
  esac
done
finish "$verdict"
