#!/usr/bin/env python3
"""Proves a build against unpacked packages (PSTAR_DEPS_ROOT) used nothing of
the system's own packages: every dependency CMake resolved (CMakeCache), every
header the compiler read (ninja's dependency log) and every library the built
binaries load (ldd, under the LD_LIBRARY_PATH given) lies under the deps root,
the source or build tree, a CUDA directory, or belongs to the toolchain (the C
library, the compiler's runtime and headers, the kernel headers, the NVIDIA
driver). Prints what it checked and each offender; exits 1 when there is one.

  check_isolation.py BUILD_DIR DEPS_ROOT SOURCE_DIR [CUDA_DIR...]
"""
import os
import re
import subprocess
import sys

# Debian/Ubuntu packages of the compiler toolchain and the C library: allowed.
TOOLCHAIN_PACKAGES = re.compile(
    r"^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl-dev|libtirpc-dev|"
    r"libstdc\+\+6|libstdc\+\+-\d+-dev|libgcc-s1|libgcc-\d+-dev|gcc-\d+|g\+\+-\d+|cpp-\d+|libgomp1|"
    r"libquadmath0|libatomic1|libitm1|libasan\d+|liblsan\d+|libtsan\d+|libubsan\d+|libhwasan\d+|libcc1-0)(:\w+)?$")
# Loaded from the system whatever the build: the C library's and the driver's.
SYSTEM_LIBRARIES = re.compile(
    r"^(linux-vdso\.so|ld-linux.*|libc\.so|libm\.so|libmvec\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|"
    r"libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libgomp\.so|libcuda\.so|libnvidia-.*|libcudadebugger\.so)")


def under(path, roots):
    path = os.path.realpath(path)
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def dpkg_owners(paths):
    """Maps each path dpkg knows (as given, or with /usr merged) to its package."""
    owners = {}
    if not paths or subprocess.run(["sh", "-c", "command -v dpkg"], capture_output=True).returncode != 0:
        return owners
    candidates = {}
    for p in paths:
        forms = {p, os.path.realpath(p)}
        for f in list(forms):
            if f.startswith("/usr/"):
                forms.add(f[4:])
            else:
                forms.add("/usr" + f)
        for f in forms:
            candidates.setdefault(f, set()).add(p)
    names = sorted(candidates)
    for i in range(0, len(names), 200):
        out = subprocess.run(["dpkg", "-S", *names[i:i + 200]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pkgs, _, f = line.partition(": ")
            if f in candidates:
                for p in candidates[f]:
                    owners[p] = pkgs.split(",")[0].strip()
    return owners


def cache_paths(build):
    found = []
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.+-]+):(PATH|FILEPATH)=(/.*)$", line.strip())
            if not m:
                continue
            key, _, value = m.groups()
            # The tools (compilers, ar, ccache, pkg-config) are not packages
            # the build links or includes.
            if key.startswith("CMAKE_") or key.endswith(("_PROGRAM", "_EXECUTABLE")) or value.endswith("-NOTFOUND"):
                continue
            for v in value.split(";"):
                if v.startswith("/"):
                    found.append((key, v))
    return found


def compiler_dirs(build):
    dirs = set()
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        text = f.read()
    for var in ("CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES", "CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES"):
        m = re.search(r"^" + var + r":INTERNAL=(.*)$", text, re.M)
        if m:
            dirs.update(os.path.realpath(d) for d in m.group(1).split(";") if d)
    # Older CMake keeps them in the compiler file rather than the cache.
    for root, _, files in os.walk(os.path.join(build, "CMakeFiles")):
        for name in files:
            if name == "CMakeCXXCompiler.cmake":
                with open(os.path.join(root, name)) as f:
                    for line in f:
                        m = re.match(r'set\(CMAKE_CXX_IMPLICIT_(?:INCLUDE|LINK)_DIRECTORIES "(.*)"\)', line.strip())
                        if m:
                            dirs.update(os.path.realpath(d) for d in m.group(1).split(";") if d)
    dirs.add("/usr/include")
    return dirs


def header_deps(build):
    out = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True).stdout
    headers = set()
    for line in out.splitlines():
        if line.startswith("    "):
            h = line.strip()
            if h.startswith("/"):
                headers.add(os.path.normpath(h))
    return headers


def loaded_libraries(build):
    libs = {}
    bindir = os.path.join(build, "bin")
    for name in sorted(os.listdir(bindir)):
        exe = os.path.join(bindir, name)
        if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
            continue
        with open(exe, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts:
                soname, target = parts[0], parts[parts.index("=>") + 1]
                if target == "not":
                    libs.setdefault((soname, "NOT FOUND"), set()).add(name)
                else:
                    libs.setdefault((soname, target), set()).add(name)
    return libs


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    build, deps, source = (os.path.realpath(a) for a in sys.argv[1:4])
    cuda = [os.path.realpath(d) for d in sys.argv[4:] if os.path.isdir(d)]
    private = [deps, source, build] + cuda
    offenders = []

    entries = cache_paths(build)
    # The compiler's own include and library directories (e.g. /usr/include for
    # glibc's libdl) are the toolchain's; what headers were read from them is
    # checked file by file below.
    implicit = compiler_dirs(build)
    outside = [(k, v) for k, v in entries if not under(v, private) and os.path.realpath(v) not in implicit]
    owners = dpkg_owners([v for _, v in outside])
    for k, v in outside:
        if not TOOLCHAIN_PACKAGES.match(owners.get(v, "")):
            offenders.append(f"CMakeCache {k}={v} ({owners.get(v, 'no package')})")
    print(f"check-isolation: {len(entries)} resolved paths in CMakeCache, {len(outside)} outside the deps root, "
          "the trees and CUDA")

    headers = header_deps(build)
    outside = sorted(h for h in headers if not under(h, private))
    owners = dpkg_owners(outside)
    for h in outside:
        if not TOOLCHAIN_PACKAGES.match(owners.get(h, "")):
            offenders.append(f"header {h} ({owners.get(h, 'no package')})")
    print(f"check-isolation: {len(headers)} headers read, {len(outside)} of them the toolchain's or offending")
    if not headers:
        offenders.append("ninja's dependency log lists no headers: nothing was built")

    libs = loaded_libraries(build)
    outside = {}
    for (soname, target), users in sorted(libs.items()):
        if target == "NOT FOUND":
            offenders.append(f"library {soname} not found (needed by {', '.join(sorted(users))})")
        elif not under(target, private) and not SYSTEM_LIBRARIES.match(soname):
            outside[target] = (soname, users)
    for target, (soname, users) in sorted(outside.items()):
        offenders.append(f"library {soname} => {target} (needed by {', '.join(sorted(users))[:80]})")
    print(f"check-isolation: {len(libs)} library resolutions checked")
    for (soname, target), users in sorted(libs.items()):
        if under(target, [deps] + cuda):
            print(f"  {soname} => {target}")

    if offenders:
        print("check-isolation: FAILED: the build used the system's own packages:")
        for o in offenders:
            print("  " + o)
        return 1
    print("check-isolation: passed: nothing came from the system's packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
