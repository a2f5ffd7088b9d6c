"""Leaving the `zen` command without tearing the interpreter down object by object.

Why: a command's last act was freeing, one by one, every object it had made, then a last collection.
Leaving without it, `zen attribute` of a transformers case (a million objects from its pr.json) went
from 1.91 to 1.64 s and `zen recover` of a GPT-2 image from 3.11 to 2.88 s (medians, runs alternated,
this project's 2-core machine; bench/results/perf.md). None of it is visible to the user: the exit status, the output (flushed
here), the case files (closed by their writers before the command returns), the atexit handlers (run
here) and the threads a normal exit waits for (joined here, in the same order) are as before; only the
memory is handed back by the operating system instead.

Under a profiler, a tracer or a monitoring tool (coverage), which write their results at the
ordinary exit, the command exits the ordinary way. An exception other than SystemExit is not caught
here: `zen.cli.main` has already turned every error into a message and an exit status, except with
ZEN_DEBUG=1, where the traceback is the point and the interpreter ends the ordinary way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

_leaving = False  # set by run_and_leave: this process ends by os._exit, which frees nothing object by object
_abandoned: list = []  # what `abandon` holds for that exit (one object at most)


def abandon(obj: object) -> bool:
    """Hold `obj` for the process's exit instead of freeing it now, where the process leaves by os._exit (the `zen`
    command); True then, and the caller drops its reference knowing nothing is freed. Elsewhere (zen as a library,
    the tests) False: the caller frees it as before.

    Why: the code stage's runtime holds about a million small objects (decoded instructions, records, namespaces),
    made with the cyclic collector off; freeing them one by one took ~0.1 s of `zen recover`'s last, single-core
    phase, work the exit skips anyway. They are moved out of the collector's sight (`gc.freeze`: the collector,
    back on, would otherwise walk them all in its first pass). One object at most is held: a process recovering
    several models (`--model all`, a library build) frees each runtime when it abandons the next, as before, and
    the collector sees everything again (`gc.unfreeze`) before the new one is frozen."""
    if not _leaving:
        return False
    import gc

    if _abandoned:
        gc.unfreeze()
    _abandoned[:] = [obj]
    gc.freeze()
    return True


def run_and_leave(command: Callable[[], object]) -> NoReturn:
    """Run `command` (which ends by raising SystemExit, or returns for status 0) and exit the process."""
    global _leaving
    _leaving = True
    try:
        command()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if _observed():
        sys.exit(code)  # a profiler or coverage tool writes its results at the ordinary exit
    status = _status(code)
    _shut_down()
    os._exit(status)


def _observed() -> bool:
    """A profiler (`python -m cProfile`), a tracer or a monitoring tool (coverage on 3.12+) is attached."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


def _status(code: object) -> int:
    """The exit status Python itself would give `sys.exit(code)`: None is 0, an int is itself, anything
    else is printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except (OSError, ValueError):
        pass
    return 1


def _shut_down() -> None:
    """What the interpreter does at exit before it frees objects: wait for non-daemon threads (and the
    callbacks that stop thread pools), run the atexit handlers, flush the standard streams."""
    shutdown = getattr(threading, "_shutdown", None)  # the interpreter's own first step at exit (3.8-3.14)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`zen ... | head`): nothing more can reach it
            pass
