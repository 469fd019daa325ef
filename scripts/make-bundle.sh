#!/usr/bin/env bash
# Makes a relocatable bundle of a build for a GPU host that has only the NVIDIA
# driver (and perhaps a CUDA toolkit): the pstar binaries, the GPU-relevant
# test binaries, every shared library they need beyond glibc and the driver,
# the source-tree files the tests read, and run-gpu-tests.sh. See
# docs/gpu-bundle.md.
#
#   scripts/make-bundle.sh BUILD_DIR OUT_DIR [--tar] [--no-cuda-libs] [--list]
#
#   --tar           also write OUT_DIR.tar.gz
#   --no-cuda-libs  leave the CUDA runtime libraries (cudart, cuBLAS, cuBLASLt,
#                   NCCL) to the host's toolkit instead of bundling them
#   --list          print where each library would come from and exit
set -euo pipefail

usage() {
  sed -n '8,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

tar_it=0
cuda_libs=1
list_only=0
positional=()
for arg in "$@"; do
  case "$arg" in
    --tar) tar_it=1 ;;
    --no-cuda-libs) cuda_libs=0 ;;
    --list) list_only=1 ;;
    -h | --help) usage ;;
    -*) echo "make-bundle: unknown option $arg" >&2; usage ;;
    *) positional+=("$arg") ;;
  esac
done
[ "${#positional[@]}" -eq 2 ] || usage
build="$(cd "${positional[0]}" && pwd)"
out="${positional[1]}"

fail() {
  echo "make-bundle: $*" >&2
  exit 1
}

[ -x "$build/bin/pstar" ] || fail "$build/bin/pstar not found: build the project first"
cache="$build/CMakeCache.txt"
cache_value() {  # the value of CMake cache entry $1, or empty
  [ -f "$cache" ] && sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -1
  return 0
}
source_dir="$(cache_value CMAKE_HOME_DIRECTORY)"
[ -n "$source_dir" ] && [ -d "$source_dir" ] || source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# --- What goes in ------------------------------------------------------------
binaries=("$build/bin/pstar")
[ -x "$build/bin/pstar-operator" ] && binaries+=("$build/bin/pstar-operator")
# GPU tests first; the CPU suites too, since they exercise the same binary's
# code paths on the GPU host's CPU and libraries.
test_names=(cuda_backend_test kernels_cuda_test gpu_training_test gpu_test profiler_test worker_test kernels_cpu_test integration_test)
tests=()
for t in "${test_names[@]}"; do
  for dir in "$build/bin" "$build/tests"; do
    if [ -x "$dir/$t" ] && [ -f "$dir/$t" ]; then
      tests+=("$dir/$t")
      break
    fi
  done
done

# Provided by every Linux host (glibc) or by the NVIDIA driver: never bundled.
category() {  # soname path -> glibc | driver | cuda | bundle
  local name="$1" path="$2"
  case "$name" in
    linux-vdso.so* | linux-gate.so* | ld-linux*.so* | */ld-linux*.so* | libc.so.* | libm.so.* | libmvec.so.* | \
      libpthread.so.* | libdl.so.* | librt.so.* | libutil.so.* | libresolv.so.* | libnsl.so.* | libanl.so.* | \
      libthread_db.so.* | libBrokenLocale.so.* | libnss_*.so.* | libc_malloc_debug.so.*)
      echo glibc ;;
    libcuda.so* | libnvidia-*.so* | libcudadebugger.so* | libnvcuvid.so* | libnvoptix.so*)
      echo driver ;;
    libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libnvrtc*.so* | libnvJitLink.so* | \
      libcusparse.so* | libcurand.so* | libcufft.so* | libcusolver.so* | libcudnn*.so* | libnvToolsExt.so* | \
      libnvtx*.so*)
      echo cuda ;;
    *)
      case "$path" in
        /usr/local/cuda*/* | /opt/nvidia/*) echo cuda ;;
        *) echo bundle ;;
      esac ;;
  esac
}

# Every library the binaries load (ldd gives the whole closure): soname -> path.
declare -A lib_path=()
declare -a lib_order=()
missing=()
for elf in "${binaries[@]}" "${tests[@]}"; do
  while read -r name path; do
    if [ "$path" = "not" ]; then
      missing+=("$(basename "$elf"): $name")
      continue
    fi
    if [ -z "${lib_path[$name]+x}" ]; then
      lib_path[$name]="$path"
      lib_order+=("$name")
    fi
  done < <(ldd "$elf" | awk '$2 == "=>" { print $1, $3; next } NF >= 1 { print $1, $1 }')
done
[ "${#missing[@]}" -eq 0 ] || fail "unresolved libraries in the build: ${missing[*]}"

if [ "$list_only" -eq 1 ]; then
  for name in "${lib_order[@]}"; do
    c="$(category "$name" "${lib_path[$name]}")"
    case "$c" in
      bundle) where=bundle ;;
      cuda) if [ "$cuda_libs" -eq 1 ]; then where=bundle; else where=host; fi ;;
      *) where=host ;;
    esac
    printf '%-8s %-8s %-40s %s\n' "$where" "$c" "$name" "${lib_path[$name]}"
  done
  exit 0
fi

# --- Lay it out --------------------------------------------------------------
if [ -e "$out" ]; then
  if [ -f "$out/BUNDLE.txt" ]; then
    rm -rf "$out"  # a previous bundle: replaced whole
  elif [ -n "$(ls -A "$out")" ]; then
    fail "$out exists and is not empty (nor an earlier bundle)"
  fi
fi
mkdir -p "$out/bin" "$out/lib" "$out/source/tests"
out="$(cd "$out" && pwd)"

for b in "${binaries[@]}"; do cp "$b" "$out/bin/"; done
if [ "${#tests[@]}" -gt 0 ]; then
  mkdir -p "$out/tests"
  for t in "${tests[@]}"; do cp "$t" "$out/tests/"; done
fi

bundled=()
for name in "${lib_order[@]}"; do
  c="$(category "$name" "${lib_path[$name]}")"
  if [ "$c" = bundle ] || { [ "$c" = cuda ] && [ "$cuda_libs" -eq 1 ]; }; then
    cp -L "${lib_path[$name]}" "$out/lib/$name"
    chmod u+w,a+r "$out/lib/$name"
    bundled+=("$name")
  fi
done

# What the tests read from the source tree at run time (test::SourceDir()).
cp -r "$source_dir/examples" "$out/source/examples"
cp -r "$source_dir/tests/fixtures" "$out/source/tests/fixtures"

# --- Make it find its libraries ----------------------------------------------
# RUNPATH $ORIGIN/../lib on the binaries; $ORIGIN on each bundled library that
# needs another bundled one (RUNPATH is not inherited by dependencies).
is_bundled() {
  local n
  for n in "${bundled[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}
runpath='$ORIGIN/../lib'
# Without bundled CUDA libraries, fall back to the usual toolkit location.
[ "$cuda_libs" -eq 0 ] && runpath="$runpath:/usr/local/cuda/lib64"
if command -v patchelf >/dev/null 2>&1; then
  linking="RUNPATH ($runpath), set with patchelf"
  for f in "$out/bin"/* "$out/tests"/*; do
    [ -f "$f" ] || continue
    patchelf --set-rpath "$runpath" "$f"
  done
  for name in "${bundled[@]}"; do
    needs_bundled=0
    for dep in $(patchelf --print-needed "$out/lib/$name"); do
      if is_bundled "$dep"; then needs_bundled=1; break; fi
    done
    if [ "$needs_bundled" -eq 1 ] && [ "$(patchelf --print-rpath "$out/lib/$name")" != '$ORIGIN' ]; then
      patchelf --set-rpath '$ORIGIN' "$out/lib/$name"
    fi
  done
else
  echo "make-bundle: patchelf not found (scripts/install-deps.sh installs it): writing wrapper scripts" >&2
  linking="wrapper scripts setting LD_LIBRARY_PATH (no patchelf)"
  for dir in "$out/bin" "$out/tests"; do
    [ -d "$dir" ] || continue
    mkdir -p "$dir/.real"
    for f in "$dir"/*; do
      [ -f "$f" ] || continue
      name="$(basename "$f")"
      mv "$f" "$dir/.real/$name"
      cat > "$f" <<EOF
#!/bin/sh
# Runs .real/$name with the bundle's libraries first on the search path.
here="\$(cd "\$(dirname "\$0")" && pwd)"
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/.real/$name" "\$@"
EOF
      chmod +x "$f"
    done
  done
fi

# --- The test runner ---------------------------------------------------------
cat > "$out/run-gpu-tests.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the bundled test binaries on this host and writes, into RESULTS_DIR,
# one gtest XML report and one log per binary, environment.txt and
# summary.txt. Exits 0 when every binary passed.
#
#   ./run-gpu-tests.sh RESULTS_DIR [TEST_BINARY...] [-- GTEST_ARGS...]
#
# TEST_BINARY names files in tests/ (all of them by default, GPU tests first).
# Tests that need /usr/bin/python3 with PyTorch, or /usr/bin/promtool, are
# left out where those are missing, unless GTEST_ARGS carry a --gtest_filter
# of their own.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "$#" -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
mkdir -p "$1" && results="$(cd "$1" && pwd)"
shift
names=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
gtest_args=("$@")
if [ "${#names[@]}" -eq 0 ]; then
  for t in cuda_backend_test kernels_cuda_test gpu_training_test gpu_test profiler_test worker_test kernels_cpu_test integration_test; do
    [ -e "$here/tests/$t" ] && names+=("$t")
  done
fi
# (The ${a[@]+"${a[@]}"} form keeps bash before 4.4 quiet about empty arrays.)

# Tests find the source-tree files and the pstar binary here, not where the
# bundle was built.
export PSTAR_SOURCE_DIR="$here/source"
export PSTAR_BINARY="$here/bin/pstar"

# Too old a glibc fails every binary at load time: say so first.
have_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
need_glibc="$(sed -n 's/^needs glibc >= //p' "$here/BUNDLE.txt")"
if [ -n "$have_glibc" ] && [ -n "$need_glibc" ] && [ "$need_glibc" != unknown ] &&
  [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1)" != "$need_glibc" ]; then
  echo "run-gpu-tests: warning: this host has glibc $have_glibc; the bundle needs $need_glibc or newer" >&2
fi

# Tests whose outside tools this host lacks are left out, and the reason noted.
excluded=""
notes=""
if ! /usr/bin/python3 -c 'import numpy, torch' >/dev/null 2>&1; then
  excluded="$excluded:GptTorchMatch.*:Export.PyTorchReadsTheHuggingFaceLayoutAndGetsPstarsLogits"
  notes="${notes}left out: the PyTorch comparisons (no /usr/bin/python3 with numpy and torch)
"
fi
if [ ! -x /usr/bin/promtool ]; then
  excluded="$excluded:WorkerMetrics.ExpositionPassesPromtool:Metrics.ServesLiveChunkSeriesDuringTraining"
  notes="${notes}left out: the promtool checks (no /usr/bin/promtool)
"
fi
filter=()
has_filter=0
for a in ${gtest_args[@]+"${gtest_args[@]}"}; do case "$a" in --gtest_filter=*) has_filter=1 ;; esac; done
if [ "$has_filter" -eq 0 ] && [ -n "$excluded" ]; then
  filter=("--gtest_filter=-${excluded#:}")
fi
[ "$has_filter" -eq 1 ] && notes="filter: given on the command line
"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n) $(uname -srm)"
  echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null)"
  printf '%s' "$notes"
  echo
  echo "--- pstar info"
  "$here/bin/pstar" info 2>&1
  echo
  echo "--- nvidia-smi"
  nvidia-smi 2>&1 || echo "(nvidia-smi not available)"
  echo
  echo "--- bundle"
  cat "$here/BUNDLE.txt"
} > "$results/environment.txt"

status=0
: > "$results/summary.txt"
mkdir -p "$results/work"
for name in ${names[@]+"${names[@]}"}; do
  bin="$here/tests/$name"
  if [ ! -e "$bin" ]; then
    echo "$name: MISSING" | tee -a "$results/summary.txt"
    status=1
    continue
  fi
  (cd "$results/work" && timeout "${PSTAR_TEST_TIMEOUT:-3600}" "$bin" --gtest_output="xml:$results/$name.xml" \
    ${filter[@]+"${filter[@]}"} ${gtest_args[@]+"${gtest_args[@]}"}) > "$results/$name.log" 2>&1
  rc=$?
  counts="$(sed -n 's/^\[  \(PASSED\|SKIPPED\|FAILED\)  *\] \([0-9]*\) tests\{0,1\}[.,].*/\1 \2/p' "$results/$name.log" |
    tr '\n' ' ')"
  if [ "$rc" -eq 0 ]; then verdict=PASSED; else verdict="FAILED (exit $rc)"; status=1; fi
  echo "$name: $verdict ${counts:+| $counts}" | tee -a "$results/summary.txt"
done
echo "results in $results"
exit "$status"
EOF
chmod +x "$out/run-gpu-tests.sh"

# --- The manifest ------------------------------------------------------------
glibc_needed="$(for f in "$out"/bin/* "$out"/bin/.real/* "$out"/tests/* "$out"/tests/.real/* "$out"/lib/*; do
  [ -f "$f" ] && [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && objdump -T "$f" 2>/dev/null
done | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1 || true)"
native="$(cache_value PSTAR_NATIVE_ARCH)"
{
  echo "pstar GPU bundle"
  echo "created: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "source: $source_dir ($(git -C "$source_dir" describe --always --dirty 2>/dev/null || echo 'no git'))"
  echo "build: $build ($(cache_value CMAKE_BUILD_TYPE))"
  echo "pstar info: $("$out/bin/pstar" info 2>&1 | tr '\n' ';')"
  echo "cuda architectures: $(cache_value CMAKE_CUDA_ARCHITECTURES)"
  echo "cpu tuning: $([ "$native" = ON ] && echo '-march=native (runs only on CPUs like the build machine'"'"'s)' || echo 'generic x86-64')"
  echo "needs glibc >= ${glibc_needed:-unknown}"
  echo "cuda runtime libraries: $([ "$cuda_libs" -eq 1 ] && echo bundled || echo 'from the host (--no-cuda-libs)')"
  echo "library lookup: $linking"
  echo "binaries: $(cd "$out" && ls bin | tr '\n' ' ')"
  echo "tests: $([ -d "$out/tests" ] && (cd "$out" && ls tests | tr '\n' ' '))"
  echo "libraries:"
  for name in "${lib_order[@]}"; do
    c="$(category "$name" "${lib_path[$name]}")"
    if is_bundled "$name"; then where="lib/$name"; else where="host ($c)"; fi
    printf '  %-36s %-28s <- %s\n' "$name" "$where" "${lib_path[$name]}"
  done
} > "$out/BUNDLE.txt"

if [ "$native" = ON ]; then
  echo "make-bundle: warning: this build uses -march=native; for other CPUs configure with -DPSTAR_NATIVE_ARCH=OFF" >&2
fi

if [ "$tar_it" -eq 1 ]; then
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
  echo "bundle: $out.tar.gz"
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1))"
