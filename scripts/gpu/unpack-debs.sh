#!/usr/bin/env bash
# Unpacks the .deb files of DEBS_DIR into ROOT (never into /), as a private
# Debian file tree for PSTAR_DEPS_ROOT: /lib is merged into /usr/lib as on a
# merged-/usr system, so the -dev packages' relative links resolve. Checks the
# files against DEBS_DIR/MANIFEST first; skips the work when ROOT already
# holds this MANIFEST's packages.
#
#   scripts/gpu/unpack-debs.sh DEBS_DIR ROOT
set -euo pipefail
[ "$#" -eq 2 ] || { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
debs="$(cd "$1" && pwd)"
root="$2"
case "$(realpath -m "$root")" in
  / | /usr | /usr/*) echo "unpack-debs: refusing to unpack into $root" >&2; exit 2 ;;
esac
[ -f "$debs/MANIFEST" ] || { echo "unpack-debs: $debs/MANIFEST missing: run scripts/gpu-prepare.sh" >&2; exit 2; }
(cd "$debs" && sha256sum --quiet -c MANIFEST) || { echo "unpack-debs: a .deb in $debs does not match its MANIFEST" >&2; exit 1; }
if [ -f "$root/.manifest" ] && cmp -s "$root/.manifest" "$debs/MANIFEST"; then
  echo "unpack-debs: $root is current"
  exit 0
fi
rm -rf "$root"
mkdir -p "$root"
extract() {  # DEB DIR: dpkg-deb where there is one, else ar and tar
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$2")
    rm -rf "$tmp"
  fi
}
while read -r _ name; do extract "$debs/$name" "$root"; done < "$debs/MANIFEST"
for top in lib lib64 bin sbin; do
  if [ -d "$root/$top" ] && [ ! -L "$root/$top" ]; then
    mkdir -p "$root/usr/$top"
    cp -a "$root/$top/." "$root/usr/$top/"
    rm -rf "${root:?}/$top"
  fi
done
# Absolute links (zlib1g-dev's libz.so -> /lib/...) would reach the host's
# own files: each is pointed at the same path inside ROOT, relatively.
root="$(cd "$root" && pwd)"
while IFS= read -r link; do
  target="$(readlink "$link")"
  case "$target" in
    /etc/alternatives/*) continue ;;
    /lib/* | /lib64/* | /bin/* | /sbin/*) target="/usr$target" ;;
  esac
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
done < <(find "$root" -type l -lname '/*' ! -path "$root/usr/share/doc/*")
# Links into /etc/alternatives (the BLAS switch) mean nothing here; anything
# else dangling is a package missing from scripts/gpu/packages.txt.
dangling="$(find "$root" -xtype l ! -lname '/etc/alternatives/*' ! -path "$root/usr/share/doc/*" | sed "s|^$root||" || true)"
if [ -n "$dangling" ]; then
  echo "unpack-debs: links that point nowhere (a package missing from scripts/gpu/packages.txt?):" >&2
  echo "$dangling" >&2
  exit 1
fi
cp "$debs/MANIFEST" "$root/.manifest"
echo "unpack-debs: $(wc -l < "$debs/MANIFEST") packages in $root ($(du -sh "$root" | cut -f1))"
