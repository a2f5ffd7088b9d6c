#!/usr/bin/env bash
# A virtual environment of another CPython with a pinned torch, for deploying the evaluation models
# under another Python than zen's own (bench/cross_version.py, tests/test_cross_version.py).
#
#   tools/torch-venv.sh 3.8|3.9|3.10|3.12|3.13|3.14     -> prints the environment's python
#
# Base interpreter: 3.13 and 3.14 are built by tools/build-python.sh (the only minors it builds);
# the others come from pyenv (the newest installed patch release of that minor), or from
# ZEN_BASE_PYTHON when set (any CPython of that minor).
# torch is pinned per Python, never resolved freely: 2.13.0 (the version zen's torch layout profile
# torch-2.13 was calibrated for) wherever a cp wheel of it exists, i.e. 3.10 and later; 2.4.1 for 3.8
# and 3.9, the last release with cp38/cp39 wheels (layout profile torch-2.4). The registry serves
# only the CUDA builds of these, so pip also installs NVIDIA's runtime packages (2.5-4.5 GB; nothing
# uses a GPU, torch runs on CPU without one).
# Cache: ${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}/<version>-torch
set -euo pipefail

usage() { echo "usage: $0 3.8|3.9|3.10|3.12|3.13|3.14" >&2; exit 2; }
[ $# -ge 1 ] || usage
minor="$1"
case "$minor" in
  3.8|3.9) torch_pin="2.4.1" ;;
  3.10|3.12|3.13|3.14) torch_pin="2.13.0" ;;
  3.11) echo "error: 3.11 is zen's own Python: use the repository's .venv" >&2; exit 2 ;;
  *) echo "error: version must be one of 3.8 3.9 3.10 3.12 3.13 3.14, got '$minor'" >&2; usage ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
cache="${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}"
venv="$cache/$minor-torch"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.zen-torch-ok" ]; then echo "$venv/bin/python"; exit 0; fi

base_python() {
  # The interpreter the environment is made from; fails with a message naming what to install.
  if [ -n "${ZEN_BASE_PYTHON:-}" ]; then echo "$ZEN_BASE_PYTHON"; return 0; fi
  case "$minor" in 3.13|3.14) "$here/build-python.sh" "$minor" shared | tail -1; return 0 ;; esac
  local root exe
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  exe="$(ls -d "$root/versions/$minor".[0-9]* 2>/dev/null | grep -E "/$minor\.[0-9]+$" | sort -V | tail -1)"
  if [ -z "$exe" ] || [ ! -x "$exe/bin/python$minor" ]; then
    echo "error: no CPython $minor found under $root/versions; install one (pyenv install $minor)" \
         "or set ZEN_BASE_PYTHON to a CPython $minor" >&2
    return 1
  fi
  echo "$exe/bin/python$minor"
}

base="$(base_python)"
got="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
[ "$got" = "$minor" ] || { echo "error: $base is Python '${got:-?}', not $minor" >&2; exit 1; }

mkdir -p "$cache"
exec 9>"$cache/.torch-venv-$minor.lock"
if command -v flock >/dev/null; then flock 9; fi
if [ -x "$venv/bin/python" ] && [ -f "$venv/.zen-torch-ok" ]; then echo "$venv/bin/python"; exit 0; fi
# Built beside the final place and moved there only once torch imports: an existing environment
# (or a link to one made by hand) is replaced only by one that works.
tmp="$cache/.$minor-torch.building"
rm -rf "$tmp"
if "$base" -c 'import ensurepip' 2>/dev/null; then
  "$base" -m venv "$tmp"
  pip=("$tmp/bin/python" -m pip)
else
  # tools/build-python.sh's builds have no ensurepip: pip is driven from outside with `pip --python`.
  "$base" -m venv --without-pip "$tmp"
  pip_host="${ZEN_PIP_PYTHON:-python3}"
  "$pip_host" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' 2>/dev/null || {
    echo "error: $pip_host has no pip >= 22.3 (needed for 'pip --python'); set ZEN_PIP_PYTHON to one that has" >&2
    exit 1; }
  pip=("$pip_host" -m pip --python "$tmp/bin/python")
fi
echo "installing torch==$torch_pin (CUDA build with its NVIDIA packages, several GB) for $("$base" -V) into $venv ..." >&2
"${pip[@]}" install -q --disable-pip-version-check "torch==$torch_pin" safetensors numpy >&2
"$tmp/bin/python" -c "import torch, safetensors; assert torch.__version__.split('+')[0] == '$torch_pin', torch.__version__
torch.manual_seed(0); assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).shape == (1, 2)"
# venv's scripts carry the path they were made at: make it again in place (keeps site-packages).
rm -rf "$venv"
mv "$tmp" "$venv"
"$base" -m venv --upgrade --without-pip "$venv" >/dev/null
"$venv/bin/python" -c 'import torch' >/dev/null
touch "$venv/.zen-torch-ok"
echo "$venv/bin/python"
