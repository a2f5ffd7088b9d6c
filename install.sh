#!/usr/bin/env bash
# Install zen and everything its demo and tests need into ./.venv.
# torch is installed first and pinned (torch==2.13.0, CPU build): letting pip resolve a bare
# `torch` would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else "zen needs Python 3.11+ (tested on 3.11; 3.12 ran the GPU checks)")'

# pip, quiet: its own warnings about package-index locations configured on this machine but absent are noise here;
# everything else it says (errors included) is shown
pipq() {
  local log rc=0
  log=$(mktemp)
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" >"$log" 2>&1 || rc=$?
  grep -v "^WARNING: Location '.*' is ignored" "$log" >&2 || true
  rm -f "$log"
  return $rc
}

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
echo "installing pip, torch 2.13.0 (CPU), zen and its test tools into .venv (a few minutes the first time)"
pipq --upgrade pip
pipq "torch==2.13.0"
pipq -e '.[test,quant]'  # also builds zen's compiled core (src/zen/native/_core.c) where a C compiler is found
.venv/bin/python -c 'import zen.native as n; n.core is None and print(n.why)'
# zen's own bytecode, written once here: an editable install leaves it to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (containers, CI) every `zen` process compiled its ~80-290 modules from source again
# (0.1 s of each command on 2 cores). Python checks each file against its source, so an edited module is still
# compiled afresh, only not cached.
.venv/bin/python -m compileall -q -j 0 src/zen >/dev/null
# Whole-machine image tests boot a QEMU guest (tools/guestvm); compressed AVML images need libsnappy.
# Installed when this runs as root on Debian/Ubuntu; without them those tests skip, zen itself works.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "installing qemu-system-x86, busybox-static and libsnappy (apt) for the whole-machine image tests"
  (timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
      qemu-system-x86 busybox-static libsnappy1v5 >/dev/null) \
    || echo "qemu/busybox could not be installed: the full-system image tests will be skipped"
fi
echo
echo "installed: $(.venv/bin/zen version) with $(.venv/bin/python --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
echo "  in $(pwd)/.venv ($(du -sh .venv | cut -f1)); activate with '. .venv/bin/activate' or call .venv/bin/zen"
echo "  optional: tools/tf-venv.sh builds the TensorFlow environment the Keras tests use (~1.6 GB in ~/.cache/zen)"
