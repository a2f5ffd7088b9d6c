"""Work handed to a forked copy of zen's own process, so that a second core does it meanwhile.

Recovery's code stage is Python work over objects read (and cached) from the image; parts of it
do not depend on each other (the system-wide code table needs no closure; rebuilding the model's
code objects needs no listing). A thread cannot run Python beside the main thread, and a fresh
process would have to find the interpreter and census the image again. A forked child starts
with everything zen has read so far, computes one part, and hands back bytes.

What the child may do, and why it is safe: it reads the image (an mmap, a pread file descriptor:
its own copies of both), computes, writes files of its own and its result to an anonymous file,
and leaves with `os._exit` (no atexit handlers, no stdio flushes, no destructors of objects it
shares with the parent). It never prints and never touches a lock another thread of the parent
could have held at the fork (threads it starts itself are its own), so threads running in the
parent (a progress display, a progress relay) do not matter; Python's warning about forking a
threaded process is silenced for that reason. A child runs at a lower priority than the parent
(`background`): the parent's analysis is the longest chain of work.

Results never depend on whether the child ran: when fork is unavailable (not POSIX, or
`ZEN_FORK=0`), when it fails, when the child raises, dies or does not finish within `timeout`,
the parent computes the same function itself. The child's bytes are what the parent would have
computed, since it runs the same code on a copy of the same state.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import struct
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable

from zen.runtime import affinity

CHILD_TIMEOUT = 300.0  # seconds a parent waits for a child's result before computing it itself
_OK, _FAILED = b"\x00", b"\x01"
_DELIVERED = b"\x01"  # on the done pipe: the result file is complete


# Scheduling priorities (nice levels above zen's own) of the work beside the analysis thread, the
# longest chain of work in a recovery: parts of the analysis handed to children come next, bulk
# I/O and hashing after them. The steps are small on purpose: every one of these is waited for
# before the case is complete, and on a machine busy with other work at nice 0 a large step starves
# it. Measured (bench/bench_digest.py, two busy loops on two cores): the tensor files' writer at nice
# 19 made a 3 s recovery of a GPT-2 image take 29 s and a 5 s one of a 3 GB image 90 s (issue 39).
NICE_ANALYSIS_PART = 1
NICE_BULK = 3  # below the analysis and its parts on an idle machine; never starved by other work
try:
    _BASE_NICE = os.getpriority(os.PRIO_PROCESS, 0)
except (AttributeError, OSError):
    _BASE_NICE = 0


def background(level: int = NICE_BULK) -> None:
    """Run the calling thread `level` nice steps below zen's own priority (Linux: per thread;
    elsewhere nothing); the threads it starts can follow (`background_level`)."""
    _state.level = level
    try:  # on Linux, PRIO_PROCESS with 0 (the calling thread) sets one thread's nice
        os.setpriority(os.PRIO_PROCESS, 0, min(19, _BASE_NICE + level))
    except (AttributeError, OSError):
        pass


def background_level() -> int:
    """The level the calling thread was set to by `background` (0: not lowered)."""
    return getattr(_state, "level", 0)


_state = threading.local()


def enabled() -> bool:
    """Fork is used where it exists, more than one core is available and `ZEN_FORK` is not 0."""
    if os.environ.get("ZEN_FORK", "1").strip() in ("0", "no", "false", "off"):
        return False
    if not hasattr(os, "fork"):
        return False
    return cores() >= 2


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


Progress = Callable[[str, int, int], None]


class Forked:
    """`fn()` (returning bytes) computed in a forked child while the caller goes on; `result()`
    returns its bytes, computing them in-process where the child did not deliver.

    With `progress`, `fn` is called as `fn(report)`: in the child, `report(stage, done, total)`
    travels through a pipe to a thread of the parent that calls `progress` (the only work the
    child gives the parent's interpreter); computed in-process, `report` is `progress` itself."""

    def __init__(self, fn: Callable[..., bytes], *, timeout: float | None = CHILD_TIMEOUT, fork: bool | None = None,
                 progress: Progress | None = None, nice: int = NICE_ANALYSIS_PART) -> None:  # fmt: skip
        self.fn = fn
        self.timeout = timeout
        self.progress = progress
        self.pid: int | None = None
        self._owner = os.getpid()  # a copy of this object in another forked child must not kill our child
        self.how = "in-process"  # or "child": how the result was obtained (tests look)
        self._file = None
        self._done: int | None = None  # the read end of the pipe on which the child says its bytes are complete
        self._reader: threading.Thread | None = None
        if not (enabled() if fork is None else fork):
            return
        pipe = done = None
        _reap_delivered()
        affinity.prepare()
        try:
            self._file = tempfile.TemporaryFile()
            done = os.pipe()
            if progress is not None:
                pipe = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
                pid = os.fork()
        except OSError:
            for fd in (pipe or ()) + (done or ()):
                os.close(fd)
            self._close()
            return
        if pid == 0:  # the child: compute, write, say so, leave
            status = 1
            background(nice)
            try:
                os.close(done[0])
                if pipe is not None:
                    os.close(pipe[0])
                    data = _OK + fn(_PipeReport(pipe[1]))
                    os.close(pipe[1])  # (the parent's relay ends here, not when this process is gone)
                else:
                    data = _OK + fn()
                status = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which recomputes
                data = _FAILED + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
            try:
                fd = self._file.fileno()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if status == 0:
                    os.write(done[1], _DELIVERED)
            except BaseException:  # noqa: BLE001
                status = 1
            os._exit(status)
        self.pid = pid
        affinity.confine(pid)  # off this process's core while it works (`affinity`)
        self._done = done[0]
        os.close(done[1])
        _LIVE.add(self)
        if pipe is not None:
            os.close(pipe[1])
            self._reader = threading.Thread(target=_relay, args=(pipe[0], progress), daemon=True, name="zen-progress")
            self._reader.start()

    def result(self) -> bytes:
        """The child's bytes; `fn()` here when there was no child or it did not deliver."""
        data = self._collect()
        if data is not None and data[:1] == _OK:
            self.how = "child"
            return data[1:]
        return self.fn(self.progress) if self.progress is not None else self.fn()

    def __del__(self) -> None:
        # a job dropped without result() or cancel() (an error path): no child left running or unreaped
        try:
            if os.getpid() == self._owner:
                self.cancel()
        except Exception:  # noqa: BLE001 - at interpreter shutdown anything may be gone
            pass

    def cancel(self) -> None:
        """Stop and reap the child (the caller failed and will not ask for the result)."""
        if self.pid is not None:
            _kill(self.pid)
            self.pid = None
        self._close()

    def _collect(self) -> bytes | None:
        """The child's bytes once it says they are complete (`_DELIVERED`), without waiting for it to exit: a
        process leaving tears down its copy of zen's memory (0.02 s of a GPT-2 attribution's end), which it
        does while this one goes on (`_reap_delivered`). None if it exits, dies or runs out of time first."""
        if self.pid is None:
            self._close()
            return None
        pid, self.pid = self.pid, None
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        delivered = False
        try:
            delivered = self._await(pid, deadline)
        except BaseException:
            _kill(pid)
            self._close()
            raise
        try:
            if not delivered:
                return None
            self._file.seek(0)
            return self._file.read()
        finally:
            self._close()

    def _await(self, pid: int, deadline: float | None) -> bool:
        """Whether the child delivered; it is reaped here, or left to `_reap_delivered` once it has.
        While this process waits, its children may use its core too (`affinity.widen`)."""
        affinity.widen([pid, *_live_pids()])
        try:
            return self._poll(pid, deadline)
        finally:
            affinity.narrow(_live_pids())  # (not `pid`: it may be reaped by now)

    def _poll(self, pid: int, deadline: float | None) -> bool:
        poller = select.poll()
        poller.register(self._done, select.POLLIN | select.POLLHUP)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                _kill(pid)
                return False
            if poller.poll(50 if left is None else max(1, min(50, int(left * 1000)))):
                if os.read(self._done, 1) == _DELIVERED:
                    _DELIVERED_PIDS.add(pid)
                    return True
                _wait(pid)  # the pipe closed without the byte: the child is leaving, or gone
                return False
            try:
                gone, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler of an embedding program)
                gone = pid
            if gone:  # (its byte, had it sent one, would have been read above: it was written before it left)
                return bool(poller.poll(0)) and os.read(self._done, 1) == _DELIVERED

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._done is not None:
            os.close(self._done)
            self._done = None
        if self._reader is not None:  # the child closed its end before delivering, or has exited, or was killed
            self._reader.join()
            self._reader = None


_LIVE: weakref.WeakSet[Forked] = weakref.WeakSet()


def _live_pids() -> list[int]:
    """This process's children not yet reaped."""
    me = os.getpid()
    return [j.pid for j in list(_LIVE) if j._owner == me and j.pid is not None]


_DELIVERED_PIDS: set[int] = set()  # children that delivered and may still be leaving, not yet reaped


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _wait(pid)


def _wait(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
        pass


def _reap_delivered() -> None:
    """Reap, without waiting, the children that delivered and have left since (none stays a zombie for long: every
    new job and zen's exit look). One still leaving at zen's exit is left to the system, which reaps it."""
    for pid in list(_DELIVERED_PIDS):
        try:
            gone, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            gone = pid
        if gone:
            _DELIVERED_PIDS.discard(pid)


@atexit.register
def _reap_children() -> None:
    """Children still running when zen exits are stopped and reaped. `zen.runtime.leave` ends the command without
    destroying its objects, so `Forked.__del__` is not what stops them there."""
    for job in list(_LIVE):
        if job._owner == os.getpid():
            job.cancel()
    _reap_delivered()


class _PipeReport:
    """`report(stage, done, total)` in a child: one record on the pipe, at most every 50 ms
    (and always the last one of a stage)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.last = fd, 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.05 and done < total:
            return
        self.last = now
        name = stage.encode("utf-8", "replace")[:255]
        try:
            os.write(self.fd, struct.pack("<B", len(name)) + name + struct.pack("<QQ", done, total))
        except OSError:
            pass


def _relay(fd: int, progress: Progress) -> None:
    """The parent's end of a child's progress pipe: records to `progress`, until the child is gone."""
    buf = b""
    try:
        while chunk := os.read(fd, 4096):
            buf += chunk
            while buf and len(buf) >= 1 + buf[0] + 16:
                n = buf[0]
                stage = buf[1 : 1 + n].decode("utf-8", "replace")
                done, total = struct.unpack_from("<QQ", buf, 1 + n)
                buf = buf[1 + n + 16 :]
                try:
                    progress(stage, done, total)
                except Exception:  # noqa: BLE001 - a display problem must not stop the relay
                    pass
    finally:
        os.close(fd)
