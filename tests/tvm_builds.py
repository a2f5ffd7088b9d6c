"""The decompiler tests' session fixtures, on both cores: TVM libraries built by two children and `zen decompile`
run two at a time.

Why: these fixtures ran one command after another (CI on 2026-11-29: 251 s and 126 s of setup) while the
machine's other core idled; each TVM build is single-threaded (user time = wall time) and independent of the
others, and a decompilation does not depend on what runs beside it (tests/test_same_answer_under_load.py). Run one
or two at a time, the 13 packages of tests/test_decompile.py's libraries were the same files (the manifests'
timings aside) and `--json` printed the same; two at a time took 91 s where one at a time took 174 s.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TVM_MODELS = Path(__file__).resolve().parent / "targets" / "tvm_models.py"
JOBS = 2


def build_libraries(out: Path, specs: list[str], jobs: int = JOBS, timeout: float = 900) -> None:
    """`tests/targets/tvm_models.py OUT SPEC...` split between `jobs` children (round robin, so the heavier models
    listed first do not all land in one); asserts each child succeeded, with the end of its stderr."""
    groups = [specs[i::jobs] for i in range(jobs) if specs[i::jobs]]
    procs = [subprocess.Popen([sys.executable, str(TVM_MODELS), str(out), *g], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for g in groups]  # fmt: skip
    errors = []
    for g, p in zip(groups, procs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append(f"building {g} failed ({p.returncode}):\n{err[-3000:]}")
    assert not errors, "\n".join(errors)


def run_each(run: Callable[..., subprocess.CompletedProcess], argvs: list[list], jobs: int = JOBS) -> list:
    """`run(*argv)` for every argv, `jobs` at a time (each a `zen` child process); results in argv order."""
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        return list(ex.map(lambda a: run(*a), argvs))
