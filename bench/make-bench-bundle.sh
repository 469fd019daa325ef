#!/usr/bin/env bash
# A GPU bundle (scripts/make-bundle.sh, docs/gpu-bundle.md) with the
# benchmarks in it: the bench/ scripts and the benchmark binaries
# (chunk_transfer_bench, cpu_adam_bench) beside bin/pstar, linked the same
# way, so that on a GPU host
#   tar xzf pstar-bench.tar.gz && pstar-bench/bench/run-gpu-benchmarks.sh RESULTS_DIR
# runs them with nothing else installed but the NVIDIA driver (and, by
# default, the CUDA toolkit: see --with-cuda-libs).
#
#   bench/make-bench-bundle.sh BUILD_DIR OUT_DIR [--tar] [--with-cuda-libs]
#
#   --tar             also write OUT_DIR.tar.gz
#   --with-cuda-libs  bundle cudart, cuBLAS(Lt) and NCCL too (about 800 MiB);
#                     by default they come from the host's CUDA toolkit
#                     (/usr/local/cuda/lib64, or python3's nvidia packages,
#                     which bench/gpu_common.sh looks in when one is missing)
#
# Build the benchmarks first: ninja -C BUILD_DIR pstar chunk_transfer_bench cpu_adam_bench,
# in a build configured with -DPSTAR_NATIVE_ARCH=OFF (portable CPU code).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  sed -n '10,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
tar_it=0 cuda_libs=0 positional=()
for arg in "$@"; do
  case "$arg" in
    --tar) tar_it=1 ;;
    --with-cuda-libs) cuda_libs=1 ;;
    -h | --help) usage ;;
    -*) echo "make-bench-bundle: unknown option $arg" >&2; usage ;;
    *) positional+=("$arg") ;;
  esac
done
[ "${#positional[@]}" -eq 2 ] || usage
build="$(cd "${positional[0]}" && pwd)"
out="${positional[1]}"

bundle_args=()
[ "$cuda_libs" -eq 0 ] && bundle_args+=(--no-cuda-libs)
"$here/../scripts/make-bundle.sh" "$build" "$out" ${bundle_args[@]+"${bundle_args[@]}"}
out="$(cd "$out" && pwd)"

# The scripts, at bench/ in the bundle: they find bin/pstar one level up.
mkdir -p "$out/bench"
cp "$here"/*.sh "$here"/*.py "$here"/README.md "$out/bench/"
[ -f "$here/RESULTS.md" ] && cp "$here/RESULTS.md" "$out/bench/"

# The benchmark binaries, linked like bin/pstar: RUNPATH into lib/ (patchelf),
# or a wrapper script when the bundle was made without patchelf.
# shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell
runpath='$ORIGIN/../lib'
[ "$cuda_libs" -eq 0 ] && runpath="$runpath:/usr/local/cuda/lib64"
is_host_lib() {  # glibc's, the driver's and (unless bundled) the CUDA runtime's libraries stay on the host
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | */ld-linux*.so* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
      libdl.so.* | librt.so.* | libutil.so.* | libresolv.so.* | libcuda.so* | libnvidia-*.so*) return 0 ;;
    libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so*) [ "$cuda_libs" -eq 0 ] ;;
    *) return 1 ;;
  esac
}
added=()
for name in chunk_transfer_bench cpu_adam_bench; do
  src="$build/bin/$name"
  if [ ! -x "$src" ]; then
    echo "make-bench-bundle: $src not built (ninja -C $build $name); the bundle goes without it" >&2
    continue
  fi
  # Libraries the benchmark needs that bin/pstar did not bring.
  while read -r lib path; do
    if [ -z "$path" ] || [ "$path" = not ]; then continue; fi
    is_host_lib "$lib" && continue
    [ -e "$out/lib/$lib" ] && continue
    cp -L "$path" "$out/lib/$lib"
    chmod u+w,a+r "$out/lib/$lib"
    echo "make-bench-bundle: added lib/$lib for $name"
  done < <(ldd "$src" | awk '$2 == "=>" { print $1, $3 }')
  if [ -d "$out/bin/.real" ]; then
    cp "$src" "$out/bin/.real/$name"
    cat > "$out/bin/$name" <<EOF
#!/bin/sh
# Runs .real/$name with the bundle's libraries first on the search path.
here="\$(cd "\$(dirname "\$0")" && pwd)"
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/.real/$name" "\$@"
EOF
    chmod +x "$out/bin/$name"
  else
    cp "$src" "$out/bin/$name"
    patchelf --set-rpath "$runpath" "$out/bin/$name"
  fi
  added+=("$name")
done
{
  echo "benchmarks: bench/ (run-gpu-benchmarks.sh and the scripts it runs); binaries: ${added[*]:-none}"
} >> "$out/BUNDLE.txt"

if [ "$tar_it" -eq 1 ]; then
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
  echo "bundle: $out.tar.gz ($(du -h "$out.tar.gz" | cut -f1))"
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1)), with bench/ and ${added[*]:-no benchmark binaries}"
