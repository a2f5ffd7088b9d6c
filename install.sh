#!/usr/bin/env bash
# Install zen and everything its demo and tests need into ./.venv.
# torch is installed first and pinned (torch==2.13.0, CPU build): letting pip resolve a bare
# `torch` would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else "zen needs Python 3.11+")'
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e '.[test]'
# Whole-machine image tests boot a QEMU guest (tools/guestvm); compressed AVML images need libsnappy.
# Installed when this runs as root on Debian/Ubuntu; without them those tests skip, zen itself works.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  (timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
      qemu-system-x86 busybox-static libsnappy1v5 >/dev/null) \
    || echo "qemu/busybox could not be installed: the full-system image tests will be skipped"
fi
.venv/bin/zen version
echo "installed: activate with '. .venv/bin/activate' or call .venv/bin/zen"
