"""Work handed to a forked copy of zen's own process, so that a second core does it meanwhile.

Recovery's code stage is Python work over objects read (and cached) from the image; parts of it
do not depend on each other (the system-wide code table needs no closure; rebuilding the model's
code objects needs no listing). A thread cannot run Python beside the main thread, and a fresh
process would have to find the interpreter and census the image again. A forked child starts
with everything zen has read so far, computes one part, and hands back bytes.

What the child may do, and why it is safe: it reads the image (an mmap, a pread file descriptor:
its own copies of both), computes, writes its result to an anonymous file, and leaves with
`os._exit` (no atexit handlers, no stdio flushes, no destructors of objects it shares with the
parent). It never prints, never starts threads and never touches a lock another thread of the
parent could have held at the fork, so threads running in the parent (the image hasher, the
tensor writer) do not matter; Python's warning about forking a threaded process is silenced for
that reason.

Results never depend on whether the child ran: when fork is unavailable (not POSIX, or
`ZEN_FORK=0`), when it fails, when the child raises, dies or does not finish within `timeout`,
the parent computes the same function itself. The child's bytes are what the parent would have
computed, since it runs the same code on a copy of the same state.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import warnings
from collections.abc import Callable

CHILD_TIMEOUT = 300.0  # seconds a parent waits for a child's result before computing it itself
_OK, _FAILED = b"\x00", b"\x01"


def enabled() -> bool:
    """Fork is used where it exists, more than one core is available and `ZEN_FORK` is not 0."""
    if os.environ.get("ZEN_FORK", "1").strip() in ("0", "no", "false", "off"):
        return False
    if not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores >= 2


class Forked:
    """`fn()` (returning bytes) computed in a forked child while the caller goes on; `result()`
    returns its bytes, computing them in-process where the child did not deliver."""

    def __init__(self, fn: Callable[[], bytes], *, timeout: float = CHILD_TIMEOUT, fork: bool | None = None) -> None:
        self.fn = fn
        self.timeout = timeout
        self.pid: int | None = None
        self.how = "in-process"  # or "child": how the result was obtained (for the manifest's timings)
        self._file = None
        if not (enabled() if fork is None else fork):
            return
        try:
            self._file = tempfile.TemporaryFile()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
                pid = os.fork()
        except OSError:
            self._close()
            return
        if pid == 0:  # the child: compute, write, leave
            status = 1
            try:
                data = _OK + fn()
                status = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which recomputes
                data = _FAILED + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
            try:
                fd = self._file.fileno()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:  # noqa: BLE001
                status = 1
            os._exit(status)
        self.pid = pid

    def result(self) -> bytes:
        """The child's bytes; `fn()` here when there was no child or it did not deliver."""
        data = self._collect()
        if data is not None and data[:1] == _OK:
            self.how = "child"
            return data[1:]
        return self.fn()

    def cancel(self) -> None:
        """Stop and reap the child (the caller failed and will not ask for the result)."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (OSError, ChildProcessError):
                pass
            self.pid = None
        self._close()

    def _collect(self) -> bytes | None:
        if self.pid is None:
            self._close()
            return None
        pid, self.pid = self.pid, None
        deadline = time.monotonic() + self.timeout
        status = None
        try:
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return None
                time.sleep(0.002)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler of an embedding program)
            status = None
        except BaseException:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (OSError, ChildProcessError):
                pass
            self._close()
            raise
        try:
            if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
                return None
            self._file.seek(0)
            return self._file.read()
        finally:
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
