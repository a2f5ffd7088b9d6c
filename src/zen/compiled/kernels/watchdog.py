"""A bound on each call of a library's code in the children that run it (probing, the equivalence check).

A TVM library is evidence, and its kernels are its own machine code: a damaged or crafted one can loop or block
forever inside one call (bench/fuzz_cli.py found a mutated ResNet library whose kernel waited on a futex for good).
The children's overall safety limit (`--timeout`, 30 minutes by default) then held `zen decompile` for half an
hour before it said anything. A single call of a kernel takes milliseconds, so each is given a share of that limit
(`CALL_SHARE`): past it, faulthandler's watchdog thread, which needs neither the GIL nor the stuck thread, writes
the Python stack and ends the child; the parent reads which call it was from the child's last `announce` line and
stops with an error naming it (TimeLimitExceeded, exit 7). The limit never changes an answer: a call either
returns within it, as every sound library's does, or the decompilation stops.

Stdlib only: it runs in the TVM interpreter's child.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
from collections.abc import Iterator

CALL_SHARE = 10  # one call of the library's code may take this fraction of --timeout
MARK = "zen-call: "  # a line the child writes before the calls it makes, naming what it runs
FIRED = "Timeout ("  # how faulthandler's dump begins


def call_limit(timeout: float | None) -> float | None:
    """Seconds one call may take under the children's overall `timeout`."""
    return None if not timeout else max(1.0, timeout / CALL_SHARE)


def announce(what: str) -> None:
    """Name what the next calls run, for the parent's message if one of them never returns."""
    print(MARK + what.replace("\n", " ")[:200], file=sys.stderr, flush=True)


@contextlib.contextmanager
def watched(seconds: float | None) -> Iterator[None]:
    """End this process (exit 1, the stack on stderr) if the block is still running after `seconds`."""
    if not seconds:
        yield
        return
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def last_call(stderr: str) -> str | None:
    """What the child announced last (None: it called none of the library's code)."""
    named = [line[len(MARK) :] for line in stderr.splitlines() if line.startswith(MARK)]
    return named[-1] if named else None


def hung_call(stderr: str) -> str | None:
    """What the child was running when the watchdog ended it (from its `announce` lines); None if it did not."""
    if FIRED not in stderr:
        return None
    return last_call(stderr) or "a call of the library's code"


def crashed_call(returncode: int, stderr: str) -> str | None:
    """'kernel K (call N), SIGSEGV' when a signal ended the child while it ran the library's code; else None."""
    import signal

    what = last_call(stderr) if returncode < 0 else None
    if what is None:
        return None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"{what}, {name}"
