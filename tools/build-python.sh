#!/usr/bin/env bash
# Build a CPython 3.13 or 3.14 from the source package Debian's registry serves, into a local cache,
# so that tests and benches can run target processes under interpreters other than zen's own.
#
#   tools/build-python.sh 3.13|3.14 [shared|static]      -> prints the interpreter's path
#
# Why from Debian's source package: it is the one source of CPython this machine's registries reach
# (python.org is not reachable), and its .orig tarball is the unmodified upstream release, which is
# what a deployed system runs. Debian's own patches are not applied: zen must read upstream layouts.
# "shared" is --enable-shared (libpython3.X.so, like distribution builds); "static" links libpython
# into the executable (like python.org/pyenv default and container images' python:3.X).
#
# Cache: ${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}/<version>-<kind>/bin/python3.X
# Re-running with a finished build only prints the path. Nothing is written inside the repository.
set -euo pipefail

usage() { echo "usage: $0 3.13|3.14 [shared|static]" >&2; exit 2; }
[ $# -ge 1 ] || usage
minor="$1"; kind="${2:-shared}"
case "$minor" in 3.13|3.14) ;; *) echo "error: version must be 3.13 or 3.14, got '$minor'" >&2; usage ;; esac
case "$kind" in shared|static) ;; *) echo "error: kind must be shared or static, got '$kind'" >&2; usage ;; esac

cache="${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}"
prefix="$cache/$minor-$kind"
exe="$prefix/bin/python$minor"
if [ -x "$exe" ] && [ -f "$prefix/.zen-build-ok" ]; then echo "$exe"; exit 0; fi

src="$cache/src"; mkdir -p "$src"
# One build at a time per cache (tests may ask for a build while another run is making it).
exec 9>"$cache/.build.lock"
if command -v flock >/dev/null; then flock 9; fi
if [ -x "$exe" ] && [ -f "$prefix/.zen-build-ok" ]; then echo "$exe"; exit 0; fi
pkg="python$minor"

# Releases whose .orig tarball was seen on deb.debian.org, with its sha256: used when the index
# no longer lists a version whose files the mirror still serves (the mirror keeps fewer than it lists).
declare -A PINNED=(
  [3.13]="3.13.15 1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76"
  [3.14]="3.14.7 3b48dac8fb59f62eaa67ac83c1eb12bda1b7a08406dd286e252c11a66be27f81"
)

have_tarball() { ls "$src/${pkg}_"*.orig.tar.xz 2>/dev/null | sort -V | tail -1; }

fetch_from_index() {
  # apt-get source --download-only checks the index's checksums; needs a deb-src entry.
  command -v apt-get >/dev/null || return 1
  if ! apt-cache showsrc "$pkg" >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || return 1
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || return 1
    # A deb-src entry of our own, only for this download: removed again on exit.
    src_list=/etc/apt/sources.list.d/zen-python-src.sources
    trap 'rm -f "$src_list"' EXIT
    cat > "$src_list" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    timeout 600 apt-get update -qq -o Dir::Etc::sourcelist="$src_list" -o Dir::Etc::sourceparts=- >/dev/null 2>&1 || return 1
  fi
  local v
  for v in $(apt-cache showsrc "$pkg" 2>/dev/null | awk '/^Version:/ {print $2}' | sort -Vr); do
    (cd "$src" && timeout 600 apt-get source -qq --download-only "$pkg=$v" >/dev/null 2>&1) && return 0
  done
  return 1
}

fetch_pinned() {
  local ver sum url
  read -r ver sum <<<"${PINNED[$minor]}"
  url="http://deb.debian.org/debian/pool/main/p/$pkg/${pkg}_${ver}.orig.tar.xz"
  command -v curl >/dev/null || { echo "error: curl is needed to download $url" >&2; return 1; }
  curl -sSf --retry 3 --max-time 900 -o "$src/${pkg}_${ver}.orig.tar.xz.part" "$url" || { rm -f "$src/"*.part; return 1; }
  echo "$sum  $src/${pkg}_${ver}.orig.tar.xz.part" | sha256sum -c --quiet - || { rm -f "$src/"*.part; return 1; }
  mv "$src/${pkg}_${ver}.orig.tar.xz.part" "$src/${pkg}_${ver}.orig.tar.xz"
}

tarball="$(have_tarball || true)"
if [ -z "$tarball" ]; then
  echo "fetching $pkg source from Debian's registry..." >&2
  fetch_from_index || fetch_pinned || {
    echo "error: no $pkg source could be downloaded (no deb-src entry for trixie/sid and the pinned" \
      "release ${PINNED[$minor]%% *} is gone from deb.debian.org); put a ${pkg}_X.Y.Z.orig.tar.xz in $src" >&2
    exit 1
  }
  tarball="$(have_tarball)"
fi

build="$cache/build/$minor-$kind"
rm -rf "$build" "$prefix"; mkdir -p "$build"
echo "building $(basename "$tarball") ($kind) into $prefix ..." >&2
tar -xJf "$tarball" -C "$build" --strip-components=1

conf=(--prefix="$prefix" --without-ensurepip --disable-test-modules)
if [ "$kind" = shared ]; then
  conf+=(--enable-shared LDFLAGS="-Wl,-rpath,$prefix/lib")
fi
jobs="$(nproc 2>/dev/null || echo 2)"
(
  cd "$build"
  ./configure "${conf[@]}" >"$build/configure.log" 2>&1 || { tail -20 "$build/configure.log" >&2; exit 1; }
  make -j"$jobs" >"$build/make.log" 2>&1 || { tail -30 "$build/make.log" >&2; exit 1; }
  make altinstall >"$build/install.log" 2>&1 || { tail -20 "$build/install.log" >&2; exit 1; }
)
"$exe" -c 'import sys, opcode, dis, marshal; assert sys.version_info[:2] == tuple(map(int, "'"$minor"'".split(".")))'
touch "$prefix/.zen-build-ok"
rm -rf "$build"
echo "$exe"
