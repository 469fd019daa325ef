#!/usr/bin/env bash
# Prepares, on this (Debian 12) machine, what scripts/gpu-session.sh needs on a
# GPU host that has a compiler, the CUDA toolkit, cmake and ninja but none of
# the Debian libraries pstar links, and no network: the .deb files listed in
# scripts/gpu/packages.txt, downloaded into gpu-deps/ (ignored by git; carry it
# to the GPU host with the working tree) with a MANIFEST of their checksums.
#
#   scripts/gpu-prepare.sh [DIR]      (default: <source>/gpu-deps)
#
# Safe to run again: files already there with the right version are kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/gpu-deps}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

mapfile -t packages < <(sed 's/#.*//' "$root/scripts/gpu/packages.txt" | tr ' ' '\n' | sed '/^$/d')
command -v apt-get >/dev/null || { echo "gpu-prepare: needs apt-get (a Debian 12 machine)" >&2; exit 2; }

# The exact versions this machine's apt would install; the lists are fetched
# once if apt knows none of them yet.
versions() {
  local p v
  for p in "${packages[@]}"; do
    v="$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')"
    [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
    echo "$p=$v"
  done
}
if ! wanted="$(versions)"; then
  echo "gpu-prepare: updating the package lists"
  apt-get update -q >/dev/null
  wanted="$(versions)" || { echo "gpu-prepare: a package in scripts/gpu/packages.txt has no candidate version" >&2; exit 1; }
fi

# A .deb of exactly version $2 of package $1 in apt's own cache (where an
# install of the same package on this machine left it), or nothing.
cached_deb() {
  local f
  for f in /var/cache/apt/archives/"${1}_"*.deb; do
    [ -f "$f" ] && [ "$(dpkg-deb -f "$f" Package 2>/dev/null)" = "$1" ] &&
      [ "$(dpkg-deb -f "$f" Version 2>/dev/null)" = "$2" ] && { echo "$f"; return 0; }
  done
  return 0
}
# Only what is not already there, then nothing else: stale versions go. A
# copy in apt's cache is taken before the network is asked.
fetch_missing() {
  local p v file cached fetch=()
  while IFS='=' read -r p v; do
    file="$(ls "$out/${p}_"*.deb 2>/dev/null | head -1 || true)"
    if [ -z "$file" ] || [ "$(dpkg-deb -f "$file" Version 2>/dev/null)" != "$v" ]; then
      rm -f "$out/${p}_"*.deb
      cached="$(cached_deb "$p" "$v")"
      if [ -n "$cached" ] && cp "$cached" "$out/"; then continue; fi
      fetch+=("$p=$v")
    fi
  done <<< "$wanted"
  if [ "${#fetch[@]}" -gt 0 ]; then
    # apt's sandbox user may not write here: download as this user. Its
    # output is kept for the error below.
    (cd "$out" && apt-get download -q -o APT::Sandbox::User=root "${fetch[@]}" >>"$out/apt-download.log" 2>&1) ||
      echo "gpu-prepare: apt-get download failed (see $out/apt-download.log)" >&2
  fi
}
# The packages of $wanted that are not there as exactly one file of exactly
# that version.
missing() {
  local p v files
  while IFS='=' read -r p v; do
    files=("$out/${p}_"*.deb)
    if [ "${#files[@]}" -ne 1 ] || [ ! -f "${files[0]}" ] || [ "$(dpkg-deb -f "${files[0]}" Version 2>/dev/null)" != "$v" ]; then
      echo "$p=$v"
    fi
  done <<< "$wanted"
}
rm -f "$out/apt-download.log"
fetch_missing
# A file can be missing after a fetch that apt called done (a mirror or
# proxy dropping one request, or a mirror in the middle of a sync failing
# the file's checksum) or because the package lists changed under this run
# (a periodic apt update): take the versions again, from fresh lists after
# the first retry, and fetch what is missing, up to three more times, the
# last a minute on (a mirror's sync is over in minutes).
for pause in 2 15 60; do
  [ -n "$(missing)" ] || break
  sleep "$pause"
  [ "$pause" = 2 ] || apt-get update -q >/dev/null 2>&1 || true
  wanted="$(versions)" || { echo "gpu-prepare: a package in scripts/gpu/packages.txt has no candidate version" >&2; exit 1; }
  fetch_missing
done
# Whether $1 is in scripts/gpu/packages.txt. (Not `printf | grep -q`: grep
# may exit at its match while printf still writes a line, and under
# pipefail printf's SIGPIPE would call a listed package unlisted.)
listed() {
  local q
  for q in "${packages[@]}"; do [ "$q" = "$1" ] && return 0; done
  return 1
}
for f in "$out"/*.deb; do
  [ -f "$f" ] || continue
  p="$(dpkg-deb -f "$f" Package)"
  listed "$p" || rm -f "$f"  # no longer listed
done
absent="$(missing)"
if [ -n "$absent" ]; then
  echo "gpu-prepare: not downloaded into $out after 4 attempts: $(echo $absent)" >&2
  [ -f "$out/apt-download.log" ] && tail -n 20 "$out/apt-download.log" >&2
  exit 1
fi
rm -f "$out/apt-download.log"
count="$(ls "$out"/*.deb | wc -l)"
[ "$count" -eq "${#packages[@]}" ] || { echo "gpu-prepare: $count .deb files for ${#packages[@]} packages" >&2; exit 1; }
(cd "$out" && sha256sum ./*.deb | sed 's| \./| |' > MANIFEST)
echo "gpu-prepare: $count packages in $out ($(du -sh "$out" | cut -f1)); carry it with the working tree"
