#!/usr/bin/env bash
# A virtual environment of CPython 3.13 or 3.14 (built by tools/build-python.sh) with torch==2.13.0,
# for deploying the evaluation models under another Python than zen's own (bench/cross_version.py).
#
#   tools/torch-venv.sh 3.13            -> prints the environment's python
#
# Opt-in and outside the repository: the only torch 2.13.0 wheels for cp313/cp314 on PyPI are the
# CUDA builds, so pip also installs NVIDIA's runtime packages (about 4.5 GB, nothing uses a GPU).
# torch stays pinned to 2.13.0, the version zen's torch layout profile was calibrated for.
# Cache: ${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}/<version>-torch
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 3.13|3.14" >&2; exit 2; }
minor="$1"
case "$minor" in 3.13|3.14) ;; *) echo "error: version must be 3.13 or 3.14, got '$minor'" >&2; exit 2 ;; esac
here="$(cd "$(dirname "$0")" && pwd)"
cache="${ZEN_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/pythons}"
venv="$cache/$minor-torch"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.zen-torch-ok" ]; then echo "$venv/bin/python"; exit 0; fi

base="$("$here/build-python.sh" "$minor" shared | tail -1)"
rm -rf "$venv"
"$base" -m venv --without-pip "$venv"   # the builds have no ensurepip: pip is driven from outside
pip_host="${ZEN_PIP_PYTHON:-python3}"
# `pip --python` (pip >= 22.3) installs into an environment that has no pip of its own.
"$pip_host" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' 2>/dev/null || {
  echo "error: $pip_host has no pip >= 22.3 (needed for 'pip --python'); set ZEN_PIP_PYTHON to one that has" >&2; exit 1; }
echo "installing torch==2.13.0 (CUDA build, ~4.5 GB with its NVIDIA packages) into $venv ..." >&2
"$pip_host" -m pip --python "$venv/bin/python" install -q "torch==2.13.0" safetensors numpy >&2
"$venv/bin/python" -c 'import torch, safetensors; assert torch.__version__.startswith("2.13.0")'
touch "$venv/.zen-torch-ok"
echo "$venv/bin/python"
