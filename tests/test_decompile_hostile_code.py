"""A TVM library whose kernel code loops forever or crashes (zen.compiled.kernels.watchdog).

bench/fuzz_cli.py (tvm kind, seed 50, input 302: a page of a ResNet library's code mutated) once held `zen
decompile` until the harness's 300-s limit: the kernel crashed, and the crash handler TVM installs deadlocked on
a futex instead of ending the child; the children's safety limit (30 minutes by default) was all that bounded it.
Here the first kernel's machine code is replaced by an endless loop (`jmp .`) and by an invalid instruction (`ud2`):
each must stop zen with an error naming that kernel, the loop within its share of --timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
KERNEL = "fused_conv2d_add"  # the CNN's first kernel call: probed first

pytest.importorskip("tvm")


def _zen(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "zen", *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tvm_hostile")
    proc = subprocess.run([sys.executable, str(HERE / "targets" / "tvm_models.py"), str(out), "cnn"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "cnn.so"


def _patched(lib: Path, dst: Path, code: bytes) -> Path:
    """`lib` with the first bytes of KERNEL's compute function replaced by `code`."""
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as fh:
        elf = ELFFile(fh)
        sym = next(s for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name == f"{KERNEL}_compute_")
        sec = next(s for s in elf.iter_sections() if s["sh_type"] == "SHT_PROGBITS" and s["sh_flags"] & 4
                   and s["sh_addr"] <= sym["st_value"] < s["sh_addr"] + s["sh_size"])  # fmt: skip
        at = sec["sh_offset"] + sym["st_value"] - sec["sh_addr"]
    shutil.copy(lib, dst)
    with open(dst, "r+b") as fh:
        fh.seek(at)
        fh.write(code)
    return dst


def test_a_kernel_that_never_returns_is_named_within_its_share_of_the_limit(cnn, tmp_path):
    lib = _patched(cnn, tmp_path / "loop.so", b"\xeb\xfe")  # jmp . (x86-64)
    res = _zen("decompile", str(lib), "-o", str(tmp_path / "out"), "--timeout", "120")
    assert res.returncode == 7, res.stderr
    said = " ".join(res.stderr.split())
    # the kernel's own limit (a tenth of --timeout) stopped it, not the children's overall one
    assert f"kernel {KERNEL} (call 0) did not return within 12 s when probed" in said, said
    assert "safety limit" not in said and "Traceback" not in said


def test_a_kernel_that_crashes_is_named(cnn, tmp_path):
    lib = _patched(cnn, tmp_path / "ill.so", b"\x0f\x0b")  # ud2
    res = _zen("decompile", str(lib), "-o", str(tmp_path / "out"))
    assert res.returncode == 2, res.stderr
    said = " ".join(res.stderr.split())
    assert f"crashed when probed (kernel {KERNEL} (call 0), SIGILL)" in said, said
    assert "Traceback" not in said


def test_the_watchdog_reads_what_the_child_said():
    """The parent's side without TVM: a child stuck in C holding the GIL (a catastrophic regex) past its limit,
    and one ended by a signal, each after announcing what it runs."""
    from zen.compiled.kernels.watchdog import crashed_call, hung_call

    pre = "from zen.compiled.kernels.watchdog import announce, watched; announce('kernel k (call 7)'); "
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    stuck = subprocess.run([sys.executable, "-c", pre + "import re\nwith watched(1.0): re.match(r'(a+)+$', 'a' * 64 + 'b')"],
                           capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert stuck.returncode == 1 and hung_call(stuck.stderr) == "kernel k (call 7)", stuck.stderr
    killed = subprocess.run([sys.executable, "-c", pre + "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert crashed_call(killed.returncode, killed.stderr) == "kernel k (call 7), SIGSEGV"
    assert hung_call(killed.stderr) is None and crashed_call(0, stuck.stderr) is None
