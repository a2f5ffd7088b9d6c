"""Which cores zen's forked children may run on: all but one, which stays the analysis's own.

A recovery's analysis (the parent process) is its longest chain of work; its parts handed to forked
children (the tensor files' writer, the system code table, the image digest, code records) run at
a slightly lower priority (`forking.NICE_*`). On two cores that is not enough: with three runnable
processes the scheduler time-slices the parent with a child about as often as not (nice 1 weighs
820 against the parent's 1024). Measured on a GPT-2 recovery (`/proc/self/schedstat`): the parent
waited 0.31-0.56 s for a core, 0.14-0.29 s of it during the closure walk alone. Larger nice steps
would starve the children on a busy machine (issue 39), so instead the children are kept off one
core: the parent always finds it free (the scheduler balances the parent there, since the children
cannot follow), while the children share the others at their usual priority.

Work is never lost to it: whenever the parent waits for a child (`widen`, then `narrow`), every live child may
run on every core again, so that a parent with nothing to do does not leave its core idle. On one
core, or where affinity cannot be set (not Linux), nothing changes. Results never depend on it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_sets: tuple[frozenset[int], frozenset[int]] | None = None  # (every core allowed, the children's), found once


def _cpu_sets() -> tuple[frozenset[int], frozenset[int]] | None:
    """(the cores zen may use, those its children may use), or None when there is no core to keep.
    Found once in the first process that forks, so that a child knows the whole set too."""
    global _sets
    if _sets is None:
        try:
            allowed = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = frozenset()
        _sets = (allowed, allowed - {min(allowed)}) if len(allowed) >= 2 else (allowed, allowed)
    allowed, children = _sets
    return _sets if children and children != allowed else None


def prepare() -> None:
    """Called by the parent before it forks: the sets are found in the parent (a child, once
    confined, would see only its own)."""
    _cpu_sets()


def confine(pid: int) -> None:
    """By the parent, right after the fork: the child `pid` keeps off the parent's core (set by the
    parent, not by the child itself, so that a wait that follows at once cannot be undone by it)."""
    sets = _cpu_sets()
    if sets is not None:
        _set(pid, sets[1])


def widen(pids: Iterable[int]) -> None:
    """While the parent waits: the children `pids` (every thread of each) may use every core."""
    sets = _cpu_sets()
    for pid in pids if sets is not None else ():
        _set_threads(pid, sets[0])  # type: ignore[index]


def narrow(pids: Iterable[int]) -> None:
    """The parent works again: the children `pids` (not reaped: a reaped pid may be another process's
    by now) keep off its core."""
    sets = _cpu_sets()
    for pid in pids if sets is not None else ():
        _set_threads(pid, sets[1])  # type: ignore[index]


def _set_threads(pid: int, cpus: frozenset[int]) -> None:
    """Affinity is per thread: a child's own threads (the tensor writer's hashing pool) follow."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")[:64]]
    except (OSError, ValueError):
        tids = [pid]
    for tid in tids:
        _set(tid, cpus)


def _set(tid: int, cpus: frozenset[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except (AttributeError, OSError, ValueError):  # gone, not permitted, or no such call here
        pass
