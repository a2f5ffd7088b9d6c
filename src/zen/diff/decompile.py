"""Decompile code objects to Python source with depyf, in a separate process, bounded by work.

Decompilation never runs the code, but a decompiler can loop or crash on unusual bytecode (depyf has
hung forever on a real function), so it runs in an isolated child process (`python -I`,
`zen.diff.decompile`; see zen.runtime.childproc) fed marshalled code objects on stdin and answering JSON on
stdout. depyf is optional (`pip install 'zen-forensics[decompile]'`); without it callers show
normalised listings.

Whether a function is shown as source or as a listing is part of what `zen diff` and `zen report`
answer, so it must not depend on how busy the machine is. Each function's decompilation is bounded
by the Python calls depyf makes (`decompile_calls`, counted by a trace hook: the same count on any
machine at any load); past it, or where depyf fails, that function is shown as a listing and the
view says why. The child as a whole has a wall-clock safety net (`timeout`) whose expiry stops the
command with an error naming it (TimeLimitExceeded), never a silent switch to listings. depyf writes
a `global` statement's names from a set, in an order that follows the child's hash seed (random in
an isolated child): they are sorted here, so the source is the same on every run.
"""

from __future__ import annotations

import json
import marshal
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from zen.runtime import childproc
from zen.runtime.errors import TimeLimitExceeded

# Python calls depyf may make for one function: torch.nn's largest (F.multi_head_attention_forward, 5.4 KB of
# bytecode) takes 1.7M, about 1.5 s traced; 20M is about what the former 10-second deadline allowed a quiet machine
DECOMPILE_CALLS = 20_000_000
TIMEOUT = 600.0  # seconds: the safety net of the whole child (`zen diff --timeout`)


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("depyf") is not None


@dataclass
class Decompiled:
    """What depyf gave: source per key, and the keys whose decompilation stopped at the work limit."""

    sources: dict[str, str] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    limit: int = DECOMPILE_CALLS


def decompile_many(codes: dict[str, Any], timeout: float = TIMEOUT, max_calls: int = DECOMPILE_CALLS) -> Decompiled:
    """key -> source for the code objects depyf could decompile within `max_calls` (others are absent)."""
    res = Decompiled(limit=max_calls)
    if not codes or not available():
        return res
    try:
        proc = childproc.run(childproc.module_argv("zen.diff.decompile", [str(max_calls)], with_pythonpath=False),
                             input=marshal.dumps(codes), capture_output=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise TimeLimitExceeded(
            f"decompiling {len(codes)} functions with depyf did not finish within the safety limit of {timeout:.0f} s",
            "raise it with --timeout SECONDS, or show listings with --listing",
        ) from None
    if proc.returncode != 0:
        return res
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return res
    if not isinstance(out, dict):
        return res
    res.sources = {k: v for k, v in (out.get("sources") or {}).items() if isinstance(v, str)}
    res.stopped = {k for k in out.get("stopped") or [] if isinstance(k, str)}
    return res


_GLOBAL = re.compile(r"^(\s*global )([A-Za-z_][A-Za-z0-9_]*(?:, [A-Za-z_][A-Za-z0-9_]*)+)$", re.MULTILINE)


def normalise(source: str) -> str:
    """depyf's source with each `global` statement's names sorted (depyf takes them from a set)."""
    return _GLOBAL.sub(lambda m: m.group(1) + ", ".join(sorted(m.group(2).split(", "))), source)


class _Spent(BaseException):
    """Raised into depyf by the call counter; a BaseException, so that depyf's `except Exception` lets it by."""


class _Counter:
    """sys.settrace hook counting the Python calls made (a 'call' event per frame, no line tracing)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.calls, self.spent = limit, 0, False

    def __call__(self, frame, event, arg):
        self.calls += 1
        if self.calls > self.limit:
            self.spent = True
            raise _Spent
        return None  # no per-line tracing inside the frame


def _worker() -> None:
    import depyf

    limit = int(sys.argv[1]) if len(sys.argv) > 1 else DECOMPILE_CALLS
    codes = marshal.loads(sys.stdin.buffer.read())
    sources: dict[str, str | None] = {}
    stopped: list[str] = []
    for key, code in codes.items():
        counter = _Counter(limit)
        sys.settrace(counter)
        try:
            sources[key] = normalise(depyf.decompile(code))
        except BaseException:  # noqa: BLE001 - one undecompilable (or endless) function must not lose the others
            sources[key] = None
        finally:
            sys.settrace(None)
        if counter.spent:
            sources[key] = None
            stopped.append(key)
    sys.stdout.write(json.dumps({"sources": sources, "stopped": stopped}))


if __name__ == "__main__":
    _worker()
