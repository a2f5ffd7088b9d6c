"""Which library `--library` names: a SQLite file, a PostgreSQL database or a `zen serve`.

    PATH (or nothing)           a SQLite file (default: $ZEN_LIBRARY, else ~/.local/share/zen/library.sqlite)
    postgresql://USER@HOST/DB   a team's PostgreSQL database, read and written directly (psycopg 3)
    https://HOST[:PORT]         a `zen serve` (httpx); the token from $ZEN_LIBRARY_TOKEN
    http://HOST[:PORT]          the same without TLS (loopback, or behind a TLS-terminating proxy)

Every command that takes `--library` opens it here and gets an object with the same methods and
the same results; `$ZEN_LIBRARY` may hold any of the four forms.
"""

from __future__ import annotations

import os
from pathlib import Path

from zen.library.store import Library, default_library_path

REMOTE_SCHEMES = ("http://", "https://")


def default_library_spec() -> str:
    return os.environ.get("ZEN_LIBRARY") or str(default_library_path())


def describe(spec: str | os.PathLike | None) -> str:
    """What kind of library a spec names: "sqlite", "postgresql" or "http"."""
    from zen.library.postgres import is_postgres

    s = str(spec) if spec is not None else default_library_spec()
    return "postgresql" if is_postgres(s) else "http" if s.startswith(REMOTE_SCHEMES) else "sqlite"


def open_library(spec: str | os.PathLike | None = None, *, create: bool = True, any_thread: bool = False,
                 invariants=None):  # fmt: skip
    """The library `spec` names (None: the default), opened; a context manager.

    `create` (SQLite, PostgreSQL): make the library when there is none yet; commands that only
    read pass False and get a clear error instead of an empty library. `any_thread`: the
    connection will be used by one thread at a time, not always the same (zen.serve.stores)."""
    s = str(spec) if spec is not None else default_library_spec()
    kind = describe(s)
    if kind == "postgresql":
        from zen.library.postgres import PostgresLibrary

        return PostgresLibrary(s, create=create, invariants=invariants)
    if kind == "http":
        from zen.library.remote import RemoteLibrary

        return RemoteLibrary(s)
    return Library(Path(s), create=create, any_thread=any_thread, invariants=invariants)
