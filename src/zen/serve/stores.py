"""One library connection per server thread.

The API's handlers run on a small pool of threads (FastAPI runs blocking handlers there). A
sqlite3 connection may only be used by the thread that opened it, and a psycopg connection runs
one transaction at a time, so each thread opens its own connection on first use and keeps it: no
connection is shared, and attribution's snapshot transaction on one thread never sees another
thread's half-done add. A PostgreSQL connection found broken (the database restarted, the
network dropped) is replaced on the next request instead of failing every later one.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from zen.library.backends import open_library


class StorePool:
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[Any] = []

    def get(self) -> Any:
        lib = getattr(self._local, "lib", None)
        if lib is not None and getattr(getattr(lib, "db", None), "broken", False):
            self.discard()
            lib = None
        if lib is None:
            lib = open_library(self.spec, create=False)
            self._local.lib = lib
            with self._lock:
                self._open.append(lib)
        return lib

    def discard(self) -> None:
        lib = getattr(self._local, "lib", None)
        self._local.lib = None
        if lib is not None:
            with self._lock:
                self._open = [x for x in self._open if x is not lib]
            with contextlib.suppress(Exception):
                lib.close()

    def close_all(self) -> None:
        with self._lock:
            libs, self._open = self._open, []
        for lib in libs:
            with contextlib.suppress(Exception):  # a sqlite3 connection refuses to be closed from another thread
                lib.close()
