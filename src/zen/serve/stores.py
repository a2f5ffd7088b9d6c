"""The server's library connections: a pool, each connection leased to one request at a time.

The API's blocking work runs on a small pool of worker threads, which come and go (AnyIO retires
a thread idle for 10 s). Connections stay: a request leases one, uses it alone (a sqlite3
connection and a psycopg connection each run one transaction at a time, so attribution's
snapshot on one request never sees another request's half-done add) and returns it. A kept
connection keeps its page cache warm (SQLite's is per connection, given 64 MiB here) and its
migration check done; one per worker thread would be opened anew, cold, for most requests of an
investigator who attributes a case every few minutes. A PostgreSQL connection found broken (the
database restarted, the network dropped) is closed instead of returned.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

from zen.library.backends import open_library

SQLITE_CACHE_KIB = 65536


class StorePool:
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._lock = threading.Lock()
        self._all: list[Any] = []

    def _open(self) -> Any:
        from zen.attribute.invariants import packed

        lib = open_library(self.spec, create=False, any_thread=True, invariants=packed)
        if lib.kind == "sqlite":
            lib.query(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
        with self._lock:
            self._all.append(lib)
        return lib

    @contextlib.contextmanager
    def lease(self) -> Iterator[Any]:
        try:
            lib = self._idle.get_nowait()
        except queue.Empty:
            lib = self._open()
        try:
            yield lib
        finally:
            if getattr(getattr(lib, "db", None), "broken", False):
                self._close(lib)
            else:
                self._idle.put(lib)

    def _close(self, lib: Any) -> None:
        with self._lock:
            self._all = [x for x in self._all if x is not lib]
        with contextlib.suppress(Exception):
            lib.close()

    def close_all(self) -> None:
        with self._lock:
            libs, self._all = self._all, []
        for lib in libs:
            with contextlib.suppress(Exception):
                lib.close()
