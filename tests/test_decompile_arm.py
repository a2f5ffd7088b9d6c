"""`zen decompile` of a TVM library compiled for aarch64, on this x86 machine (issue 53).

A child compiles a small CNN with TVM for aarch64-linux-gnu (LLVM's AArch64 target, linked by Debian's cross gcc)
and writes ground truth, the TVM outputs coming from the library itself run under emulation. zen reads the
library statically, probes its kernels through the emulated TVM runtime (zen.compiled.emulation: Debian arm64
Python, PyPI's aarch64 TVM, qemu-user), rebuilds the PyTorch package and checks it against the executable run
the same way. Skipped, saying why, where the cross compiler or the emulated environment cannot be had.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
MACHINE = "EM_AARCH64"

pytest.importorskip("tvm")


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def _decompile(lib: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zen", "decompile", str(lib), "-o", str(out)], capture_output=True,
                          text=True, env=_env(**env), timeout=900)  # fmt: skip


@pytest.fixture(scope="session")
def arm_library(tmp_path_factory) -> Path:
    """cnn_aarch64.so and its ground truth, in a temporary directory."""
    from zen.compiled import emulation
    from zen.runtime.errors import ZenError

    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("no aarch64 cross compiler to build the test library (apt-get install gcc-aarch64-linux-gnu)")
    if not emulation.ready(MACHINE):
        try:
            emulation.build("aarch64", log=lambda _line: None)
        except (ZenError, OSError) as exc:
            pytest.skip(f"the emulated aarch64 environment cannot be built here: {exc}")
    out = tmp_path_factory.mktemp("arm_libs")
    proc = subprocess.run([sys.executable, str(HERE / "targets" / "tvm_models.py"), str(out), "cnn@aarch64"],
                          capture_output=True, text=True, env=_env(), timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_an_aarch64_library_is_decompiled_through_the_emulated_runtime(arm_library, tmp_path):
    """Operators probed through the emulated runtime, weights bit-exact, the rebuilt model equivalent to the
    executable run under emulation, and the manifest naming both architectures."""
    from safetensors.numpy import load_file

    res = _decompile(arm_library / "cnn_aarch64.so", tmp_path / "pkg")
    assert res.returncode == 0, res.stderr[-2000:]
    m = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    ex = m["executable"]
    assert (ex["architecture"], ex["host_architecture"], ex["emulated"]) == ("aarch64", "x86_64", True)
    assert {"conv2d", "max_pool2d", "matmul"} <= set(m["operators"]) and not m["problems"]
    assert m["equivalence"]["max_abs_diff"] < 1e-5, m["equivalence"]
    truth = json.loads((arm_library / "cnn_aarch64.json").read_text())
    got = set()
    for a in load_file(str(tmp_path / "pkg" / "weights.safetensors")).values():
        got.add(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
        if a.ndim == 2:
            got.add(hashlib.sha256(np.ascontiguousarray(a.T).tobytes()).hexdigest())
    missing = [k for k, h in truth["param_sha256"].items() if h not in got and not k.endswith("num_batches_tracked")]
    assert not missing


def test_without_the_emulated_runtime_the_static_package_is_written_and_named(arm_library, tmp_path):
    """No emulated environment (an empty cache): graph, bytecode and manifest are written, exit 5, and the problem
    names the architecture and the command that builds the runtime. An architecture zen cannot emulate at all (the
    same library relabelled RISC-V) is read statically too, and said to be beyond zen."""
    res = _decompile(arm_library / "cnn_aarch64.so", tmp_path / "out", XDG_CACHE_HOME=str(tmp_path / "empty-cache"))
    assert res.returncode == 5, res.stderr[-2000:]
    said = " ".join(res.stderr.split())
    assert "compiled for aarch64" in said and "python -m zen.compiled.emulation build aarch64" in said, said
    assert (tmp_path / "out" / "graph.json").is_file() and not (tmp_path / "out" / "model.py").exists()
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["executable"]["architecture"] == "aarch64" and m["graph"]["kernel_calls"] > 0
    riscv = bytearray((arm_library / "cnn_aarch64.so").read_bytes())
    riscv[18:20] = (243).to_bytes(2, "little")  # EM_RISCV
    (tmp_path / "riscv.so").write_bytes(riscv)
    res = _decompile(tmp_path / "riscv.so", tmp_path / "out-riscv")
    assert res.returncode == 5 and "does not exist in zen" in " ".join(res.stderr.split()), res.stderr[-2000:]
    assert json.loads((tmp_path / "out-riscv" / "manifest.json").read_text())["executable"]["architecture"] == "EM_RISCV"
