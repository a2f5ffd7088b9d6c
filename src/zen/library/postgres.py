"""The library in PostgreSQL: one database a team's investigators and curators share.

`--library postgresql://USER@HOST/DB` (any libpq connection URL; the password from the URL,
`PGPASSWORD` or `~/.pgpass`) opens it with psycopg 3. Everything but the connection is
`zen.library.store.Library`: the same queries (its `?` placeholders become psycopg's `%s`), the
same schema and migrations (zen.library.schema rendered for PostgreSQL), the same invariants
stored at add, so attribution reads a PostgreSQL library with the same few indexed queries.

Concurrency. The connection runs in autocommit; a write is one transaction that first takes a
transaction-scoped advisory lock (`pg_advisory_xact_lock`), the counterpart of SQLite's BEGIN
IMMEDIATE: writers from any number of processes and machines queue, an add's rows (entry, code
hashes, invariants, code bodies, audit) commit together or not at all, and a writer that dies
(a killed server, a dropped connection) is rolled back by the server. Migrations take the same
lock, so several zens opening a fresh database at once migrate it once. Reads that must agree
with each other (attribution) run in one REPEATABLE READ transaction.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from zen.library.store import Library, LibraryError

WRITE_LOCK = 0x7A656E4C4942  # "zenLIB": the advisory lock key every writer of a zen library takes
SCHEMES = ("postgresql://", "postgres://")


def is_postgres(spec: str | os.PathLike | None) -> bool:
    return isinstance(spec, str) and spec.startswith(SCHEMES)


def redact(url: str) -> str:
    """The URL without its password (for messages and the audit)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class PostgresLibrary(Library):
    """A base-model library in a PostgreSQL database."""

    kind = "postgresql"
    TEXT_AGG = "string_agg"
    HEX_AGG = "string_agg(CASE WHEN {ok} THEN encode(models, 'hex') END, ' ')"

    def __init__(self, url: str, *, create: bool = True, connect_timeout: int = 15, any_thread: bool = True,
                 invariants=None) -> None:  # fmt: skip
        self.invariants_fn = invariants  # see Library
        try:
            import psycopg
        except ImportError:
            raise LibraryError("a postgresql:// library needs psycopg 3", "pip install 'zen-forensics[service]'") from None
        self.url, self.path = url, redact(url)  # type: ignore[assignment]
        try:
            self.db = psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout)
        except (psycopg.Error, ValueError) as exc:
            raise LibraryError(f"cannot connect to the library database {self.path}: {_first_line(exc)}",
                               "check the URL, that PostgreSQL runs there and that this user may connect") from None  # fmt: skip
        try:
            self._migrate(create)
        except psycopg.Error as exc:
            self.db.close()
            raise LibraryError(f"{self.path} is not a usable zen library: {_first_line(exc)}") from None
        except BaseException:
            self.db.close()
            raise

    def query(self, sql: str, params: Iterable[Any] = ()) -> Any:
        params = tuple(params)  # without parameters the text goes as it is (a literal % stays one)
        return self.db.execute(sql.replace("?", "%s"), params) if params else self.db.execute(sql)

    def max_params(self) -> int:
        return 65535  # the protocol's limit (a 16-bit count)

    def query_many(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            with self.db.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), rows)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        if self.db.info.transaction_status != 0:  # already inside a transaction (psycopg's IDLE is 0)
            yield
            return
        with self.db.transaction():
            self.db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield

    def _has_meta(self) -> bool:
        return self.query("SELECT to_regclass('meta') IS NOT NULL").fetchone()[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
