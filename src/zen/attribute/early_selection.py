"""Candidate selection (Algorithm 1, lines 3-7) started while `zen attribute` checks the case.

Selection is one indexed query: the library entries sharing a code listing with the query, with
counts (`Library.sharing`). Against 1,000 transformers entries it takes ~0.25 s, nearly all of it
inside SQLite, which releases the GIL; checking the case (manifest, every file's hash, pr.json
parsed and validated) takes ~0.6 s of Python. So a thread runs the query meanwhile (issue 34,
target 1).

The query's listing hashes are not known before pr.json is checked, so the thread takes them from
pr.json's bytes with one pattern (`"listing_sha256":"<64 hex>"`). They are a guess, used only if
they equal the checked case's own set (`result`); otherwise, or if the thread failed, attribution
runs the query itself. Nothing in the answer depends on the guess.

The thread uses the command's own connection while the command does not (it is opened for use by
one thread at a time, `any_thread`), inside the read transaction that the whole attribution runs
in (`Library.snapshot`, begun before the thread starts): a SQLite read transaction takes its
snapshot at its first read, which is this query, so every later read sees the same library.
SQLite libraries only: a PostgreSQL or remote library runs the query in turn, as before.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

LISTING_KEY = re.compile(rb'"listing_sha256":\s*"([0-9a-f]{64})"')
NEEDLE = b'"listing_sha256":'
HEX64 = re.compile(rb"[0-9a-f]{64}")
MOST_KEYS = 1 << 22  # code records looked at by offset (a transformers model has ~4,500); past it, the pattern
MAX_PR_BYTES = 256 << 20  # a larger pr.json (transformers: ~23 MB) is left to the check: no second copy of it in memory


class EarlySharing:
    """`library.sharing("listing", hashes in pr.json)` in a thread, from construction on."""

    def __init__(self, library, pr_path: Path) -> None:
        self.keys: set[str] | None = None
        self.value: dict[str, int] | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(library, Path(pr_path)), daemon=True, name="zen-sharing")
        self._thread.start()

    def _run(self, library, path: Path) -> None:
        try:
            data = _regular_file(path)
            if data is None:
                return
            self.keys = listing_keys(data)
            self.value = library.sharing("listing", self.keys)
        except Exception as exc:  # noqa: BLE001 - attribution runs the query itself, and reports what fails then
            self.error = f"{type(exc).__name__}: {exc}"

    def wait(self) -> None:
        """Until the thread is done (before anything else uses the library's connection)."""
        self._thread.join()

    def result(self, keys: set[str]) -> dict[str, int] | None:
        """The counts, if they were computed for exactly `keys` (the checked case's hashes)."""
        self.wait()
        return self.value if self.value is not None and self.keys == keys else None


def listing_keys(data: bytes) -> set[str]:
    """The hashes `LISTING_KEY` finds in pr.json's bytes. The pattern holds the GIL over the whole text (24 ms of a
    transformers pr.json, which the case check's parse in the other thread waited out); with the compiled core the
    key's offsets come from a search that releases it, and only each hit is looked at here. Anything but the usual
    `"listing_sha256":"<64 hex>"` (spaces, other digits) leaves the answer to the pattern."""
    from zen import native

    if native.core is None:
        return _by_pattern(data)
    keys, n = set(), len(NEEDLE)
    hits = native.core.find_all(data, NEEDLE, 0, len(data), MOST_KEYS)
    if len(hits) >= MOST_KEYS:
        return _by_pattern(data)
    for i in hits:
        key = data[i + n + 1 : i + n + 65]
        if data[i + n : i + n + 1] != b'"' or data[i + n + 65 : i + n + 66] != b'"' or not HEX64.fullmatch(key):
            return _by_pattern(data)
        keys.add(key.decode("ascii"))
    return keys


def _by_pattern(data: bytes) -> set[str]:
    return {m.decode("ascii") for m in LISTING_KEY.findall(data)}


def _regular_file(path: Path) -> bytes | None:
    """The file's bytes if it is a regular file of at most MAX_PR_BYTES, else None. Read before the
    case is checked, so as untrusted as any evidence: opened without blocking (a FIFO planted as
    pr.json would hold an ordinary open, and the command waiting for this thread, forever), only
    after its path names a regular file, and judged again by the descriptor's own type and size."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PR_BYTES:
        return None  # a device, FIFO or directory is never opened (opening some has effects)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PR_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_PR_BYTES + 1)
        return data if len(data) <= MAX_PR_BYTES else None
    finally:
        os.close(fd)
