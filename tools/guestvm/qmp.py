"""A tiny synchronous QMP client (QEMU's JSON control protocol over a unix socket).

Only what the fixtures need: the greeting, ``qmp_capabilities``, and commands whose ``return``
(or ``error``) is awaited with a deadline while asynchronous events (``{"event": ...}``) that
arrive in between are collected, not mistaken for the reply.  No dependency on ``qemu.qmp``.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from .cache import GuestError


class QMPError(GuestError):
    """QEMU answered a command with ``{"error": ...}`` or the socket failed."""


class QMP:
    """One QMP session; ``command()`` is serialised (QMP replies in order)."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise QMPError(f"no QMP socket at {path} after {timeout}s") from None
                time.sleep(0.1)
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        self._id = 0
        greeting = self._read(deadline)
        if "QMP" not in greeting:
            raise QMPError(f"unexpected QMP greeting {greeting}")
        self.command("qmp_capabilities")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QMPError("timed out waiting for QEMU's QMP reply")
            self.sock.settimeout(min(left, 5.0))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise QMPError("QEMU closed the QMP socket (did it exit?)")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def command(self, name: str, timeout: float = 60.0, **args: Any) -> Any:
        """Run one command and return its ``return`` value; raise QMPError on ``error``."""
        self._id += 1
        msg: dict[str, Any] = {"execute": name, "id": self._id}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if "event" in reply:
                self.events.append(reply)
                continue
            if reply.get("id") != self._id:
                continue
            if "error" in reply:
                err = reply["error"]
                raise QMPError(f"QMP {name} failed: {err.get('class')}: {err.get('desc')}")
            return reply.get("return")

    def hmp(self, line: str, timeout: float = 60.0) -> str:
        """A human-monitor command (for things QMP lacks, like ``info mtree``)."""
        return str(self.command("human-monitor-command", timeout=timeout, **{"command-line": line}))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
