"""Decompile code objects to Python source with depyf, in a separate process with a time limit.

Decompilation never runs the code, but a decompiler can loop or crash on unusual bytecode, so it
runs in an isolated child process (`python -I`, `zen.diff.decompile`; see zen.childproc) fed marshalled code objects on stdin and
answering JSON on stdout. depyf is optional (`pip install 'zen-forensics[decompile]'`); without it,
or when it fails or times out, callers fall back to normalised listings.
"""

from __future__ import annotations

import json
import marshal
import subprocess
import sys
from typing import Any

from zen import childproc


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("depyf") is not None


def decompile_many(codes: dict[str, Any], timeout: float = 60.0) -> dict[str, str]:
    """key -> source for the code objects depyf could decompile in time (others are absent)."""
    if not codes or not available():
        return {}
    try:
        proc = childproc.run(childproc.module_argv("zen.diff.decompile", with_pythonpath=False), input=marshal.dumps(codes),
                             capture_output=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {}
    if proc.returncode != 0:
        return {}
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return {}
    return {k: v for k, v in out.items() if isinstance(v, str)}


PER_FUNCTION_SECONDS = 10


def _worker() -> None:
    import signal

    import depyf

    def expired(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, expired)  # depyf has hung on real functions: give each a deadline
    codes = marshal.loads(sys.stdin.buffer.read())
    out: dict[str, str | None] = {}
    for key, code in codes.items():
        signal.setitimer(signal.ITIMER_REAL, PER_FUNCTION_SECONDS)
        try:
            out[key] = depyf.decompile(code)
        except BaseException:  # noqa: BLE001 - one undecompilable (or hanging) function must not lose the others
            out[key] = None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    _worker()
