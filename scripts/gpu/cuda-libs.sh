# shellcheck shell=bash
# One search for the CUDA libraries pstar needs at build and run time,
# sourced by scripts/gpu-session.sh: the CUDA toolkit next to nvcc, then the
# nvidia-* Python wheels of every python3 on the host (NCCL, cuBLAS and cuDNN
# ship that way beside PyTorch). Sets
#   CUDA_LIB_DIRS        directories to put on LD_LIBRARY_PATH
#   CUDA_CMAKE_ARGS      what CMake needs for libraries outside the toolkit
#   CUDA_LIBS_REPORT     one line per library: the file it resolved to
# and returns 1 (after the report) when a library cannot be found.

# The toolkit directory of the nvcc given (or found). nvcc may be a wrapper
# script (e.g. /usr/local/bin/nvcc exec'ing the real one), so it is asked
# where its toolkit is, as CMake does; the directory above the resolved
# binary is the fallback. Prints nothing when there is no nvcc.
cuda_toolkit_root() {
  local nvcc="${1:-}" top
  [ -n "$nvcc" ] || nvcc="$(command -v nvcc || true)"
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  [ -n "$nvcc" ] || return 0
  top="$("$nvcc" --dryrun -x cu -E /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)"
  [ -n "$top" ] && [ -x "$top/bin/nvcc" ] || top="$(dirname "$(readlink -f "$nvcc")")/.."
  (cd "$top" && pwd -P)
}

cuda_lib_candidates() {  # directories that may hold CUDA libraries, best first
  local toolkit py d
  toolkit="$(cuda_toolkit_root)"
  if [ -n "$toolkit" ]; then
    for d in "$toolkit/lib64" "$toolkit/lib" "$toolkit/targets/x86_64-linux/lib"; do [ -d "$d" ] && echo "$d"; done
  fi
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -n "$d" ] && [ -d "$d/lib64" ] && (cd "$d/lib64" && pwd -P)
  done
  for py in ${PYTHON:-} /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - 2>/dev/null <<'PY' || true
import glob, os
try:
    import nvidia
    for base in nvidia.__path__:
        for lib in sorted(glob.glob(os.path.join(base, "*", "lib"))) + sorted(glob.glob(os.path.join(base, "*", "*", "lib"))):
            print(lib)
except Exception:
    pass
PY
  done
}

# The first file named NAME (a glob) in the candidate directories.
find_cuda_file() {
  local pattern="$1" d f
  for d in "${CUDA_CANDIDATES[@]}"; do
    for f in "$d"/$pattern; do
      [ -e "$f" ] && { echo "$f"; return 0; }
    done
  done
  return 1
}

find_cuda_libs() {
  mapfile -t CUDA_CANDIDATES < <(cuda_lib_candidates | awk '!seen[$0]++')
  CUDA_LIB_DIRS=()
  CUDA_CMAKE_ARGS=()
  CUDA_LIBS_REPORT=""
  local missing=0 name file dir toolkit_dir="${CUDA_CANDIDATES[0]:-}"
  for name in libcudart.so libcublas.so libcublasLt.so libnccl.so; do
    file="$(find_cuda_file "$name" || find_cuda_file "$name.[0-9]*" || true)"
    if [ -z "$file" ]; then
      CUDA_LIBS_REPORT+="  $name: NOT FOUND (searched: ${CUDA_CANDIDATES[*]:-nothing})"$'\n'
      missing=1
      continue
    fi
    CUDA_LIBS_REPORT+="  $name: $(readlink -f "$file")"$'\n'
    dir="$(dirname "$file")"
    case " ${CUDA_LIB_DIRS[*]} " in *" $dir "*) ;; *) CUDA_LIB_DIRS+=("$dir") ;; esac
    # Outside the toolkit, CMake is told where (a wheel has only versioned
    # names, and its headers beside lib/).
    if [ "$dir" != "$toolkit_dir" ] && [ -n "$toolkit_dir" ]; then
      case "$name" in
        libnccl.so) CUDA_CMAKE_ARGS+=("-DPSTAR_NCCL_ROOT=$(dirname "$dir")") ;;
        libcublas.so) CUDA_CMAKE_ARGS+=("-DCUDA_cublas_LIBRARY=$file") ;;
        libcublasLt.so) CUDA_CMAKE_ARGS+=("-DCUDA_cublasLt_LIBRARY=$file") ;;
      esac
      if [ "$name" != libnccl.so ] && [ -d "$(dirname "$dir")/include" ]; then
        CUDA_EXTRA_INCLUDE="$(dirname "$dir")/include"
      fi
    fi
  done
  # cuDNN is optional: the build compiles its attention route where the
  # headers are found and loads libcudnn.so.9 at run time (beside PyTorch
  # as the nvidia-cudnn wheel, headers in its include/); without it the
  # route reports itself unavailable and pstar's kernels run.
  file="$(find_cuda_file libcudnn.so.9 || true)"
  if [ -z "$file" ]; then
    CUDA_LIBS_REPORT+="  libcudnn.so.9: not found (optional: the cuDNN attention route is unavailable)"$'\n'
  else
    CUDA_LIBS_REPORT+="  libcudnn.so.9: $(readlink -f "$file")"$'\n'
    dir="$(dirname "$file")"
    case " ${CUDA_LIB_DIRS[*]} " in *" $dir "*) ;; *) CUDA_LIB_DIRS+=("$dir") ;; esac
    if [ -f "$(dirname "$dir")/include/cudnn_graph.h" ]; then
      CUDA_CMAKE_ARGS+=("-DPSTAR_CUDNN_ROOT=$(dirname "$dir")")
    fi
  fi
  return "$missing"
}
