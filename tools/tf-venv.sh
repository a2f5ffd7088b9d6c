#!/usr/bin/env bash
# A virtual environment with TensorFlow (CPU) and Keras 3, for the Keras target processes of the tests and for
# `zen profile tf --python ...`. zen itself never imports TensorFlow (analysis reads memory only), so TF stays out of
# zen's own .venv: this is opt-in and lives outside the repository.
#
#   tools/tf-venv.sh                    -> prints the environment's python
#
# Idempotent: an environment whose marker file exists is reused. The pins are the versions whose tensor/variable
# layout ships as src/zen/frontends/keras/profiles/tf-2.21-x86_64.json (tensorflow-cpu 2.21.0: ~274 MB wheel,
# ~1.6 GB installed). Interpreter: ZEN_TF_BASE_PYTHON, else python3.11 (CPython 3.11, the version zen reads best).
# Location: ZEN_TF_VENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/zen/tf-venv.
set -euo pipefail

venv="${ZEN_TF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zen/tf-venv}"
marker="$venv/.zen-tf-ok"
if [ -x "$venv/bin/python" ] && [ -f "$marker" ]; then echo "$venv/bin/python"; exit 0; fi

base="${ZEN_TF_BASE_PYTHON:-python3.11}"
command -v "$base" >/dev/null 2>&1 || { echo "error: $base not found (set ZEN_TF_BASE_PYTHON)" >&2; exit 1; }
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$base" -m venv "$venv"
echo "installing tensorflow-cpu==2.21.0 keras==3.15.1 into $venv (~1.6 GB) ..." >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "tensorflow-cpu==2.21.0" "keras==3.15.1" >&2
# The check imports both exactly as a target process does (TF logs go to stderr, silenced).
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" - <<'EOF'
import tensorflow as tf, keras
assert tf.__version__ == "2.21.0", tf.__version__
assert keras.__version__ == "3.15.1", keras.__version__
assert keras.backend.backend() == "tensorflow", keras.backend.backend()
EOF
touch "$marker"
echo "$venv/bin/python"
