"""The Base Model Library (ZEN §IV-B a): fingerprints of known base models in SQL.

One row per base model: its name (the ground truth), metadata (source image hash, versions, date,
who added it), and its MR, PR (model-specific code only) and UR as compressed JSON. Every code
object's de-specialised bytecode hash and normalised-listing hash is also stored in an indexed
table, so Algorithm 1's candidate selection ("which bases share any function with this model?") is
one indexed query, not a scan of every entry.

Attribution compares a query with every candidate entry; what it needs of an entry that does not depend on the
query (layer and tensor multisets, hyper-parameters, the module graph's Laplacian spectrum, the code views) is
computed once, at `add`, and kept in the `invariants` table (zen.attribute.invariants says what and why):
decoding an entry's MR and PR JSON and recomputing its spectrum per query cost 0.1-0.7 s per real entry.

`Library` is the SQLite store (a file: the default) and holds every query, written in the SQL that SQLite and
PostgreSQL share; `zen.library.postgres.PostgresLibrary` (a team's database) changes only how it connects, how a
write transaction is taken and the placeholder style. Both run the schema and migrations of `zen.library.schema`.
A write (add, replace, remove, import, token change) is one transaction that holds the library's write lock
(SQLite: BEGIN IMMEDIATE in WAL mode with a busy timeout; PostgreSQL: a transaction-scoped advisory lock), so
concurrent writers queue instead of losing or half-writing entries, and every write leaves a row in the `audit`
table in the same transaction: who, what, when and the fingerprint's digests.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import json
import os
import socket
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from zen.library import postings
from zen.library.errors import Conflict, LibraryError, NotFound  # noqa: F401 - the library's errors, as before
from zen.library.names import check_name
from zen.library.schema import SCHEMA_VERSION, render
from zen.represent.jsontext import loads
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "Library", "LibraryError", "Entry", "InvariantRow"]

MIGRATIONS: list[list[str]] = render("sqlite")  # statements bringing a SQLite file from version N to N+1 (index N)


class InvariantRow(NamedTuple):
    """An entry's stored attribution invariants (blobs as zen.attribute.invariants packs them);
    `version` is None when the entry has none (see `Library.mr_invariants`)."""

    name: str
    summary: dict
    version: int | None
    mr: bytes | None
    spectrum: bytes | None


def default_library_path() -> Path:
    env = os.environ.get("ZEN_LIBRARY")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "zen" / "library.sqlite"


def default_who() -> str:
    """Who a write made on this machine is recorded as (the audit's `who`, an entry's `added_by`):
    the operating-system user and host; a server records its token's name instead."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _pack(obj: dict) -> bytes:
    return zlib.compress(_json_bytes(obj), 6)


def _json_bytes(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def _unpack(blob: bytes) -> dict:
    return loads(zlib.decompress(blob))  # orjson where it reads the same values as json (a stored PR: 0.13 -> 0.07 s)


def _text(s: str | None) -> str | None:
    """Text as both engines store it: valid UTF-8 without NUL. A lone surrogate (an undecodable byte
    carried from an image) becomes its escape, which inside JSON text reads back as the same code
    point (zen.represent.textio); SQLite's and PostgreSQL's drivers refuse the raw character."""
    return None if s is None else s.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Entry:
    """A base model as stored in the library."""

    id: int
    name: str
    created: str
    source_sha256: str | None
    python: str | None
    torch: str | None
    root_class: str | None
    summary: dict
    notes: str
    _mr: bytes
    _pr: bytes
    _ur: bytes

    # Unpacked once per entry (`zen report` read the base's PR 4 times, 0.25 s each): callers only read these records
    @functools.cached_property
    def mr(self) -> ModelMR:
        return ModelMR.from_json(_unpack(self._mr))

    @functools.cached_property
    def pr(self) -> ProgrammaticRepresentation:
        return ProgrammaticRepresentation.from_json(_unpack(self._pr))

    @functools.cached_property
    def ur(self) -> UnifiedRepresentation:
        return UnifiedRepresentation.from_json(_unpack(self._ur))

    def export(self) -> dict[str, Any]:
        return {"name": self.name, "created": self.created, "source_sha256": self.source_sha256, "python": self.python,
                "torch": self.torch, "root_class": self.root_class, "summary": self.summary, "notes": self.notes,
                "mr": _unpack(self._mr), "pr": _unpack(self._pr), "ur": _unpack(self._ur)}  # fmt: skip


class Library:
    """A base-model library file (SQLite); use as a context manager or call `close()`.

    Every query is written in SQL that PostgreSQL runs too (`?` placeholders, translated there);
    `query`, `query_many`, `transaction` and `snapshot` are all a backend changes."""

    kind = "sqlite"
    remote = False
    TEXT_AGG = "group_concat"  # the aggregate joining text values with a separator (PostgreSQL: string_agg)
    HEX_AGG = "group_concat(CASE WHEN {ok} THEN hex(models) END, ' ')"  # postings as one text (zen.library.postings)

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True, any_thread: bool = False,
                 invariants: Callable | None = None) -> None:  # fmt: skip
        """`any_thread`: the connection may be used by any one thread at a time (a server's pool). `invariants(mr, pr)`
        packs an entry's attribution invariants (attribution's own function, given by the caller: the library
        stores them, attribution owns what they are). A library opened without it reads, lists and removes but
        refuses to add: an entry stored without its invariants would be slower to match and fail `problems`
        checks, silently (the demo's library once was)."""
        self.invariants_fn = invariants
        self.path = Path(path) if path is not None else default_library_path()
        if not self.path.exists():
            if not create:
                raise LibraryError(f"no base model library at {self.path}", "add a model with `zen library add CASE --name NAME`")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=not any_thread)
            self.db.execute("PRAGMA busy_timeout = 60000")
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate(create)
        except sqlite3.DatabaseError as exc:
            raise LibraryError(f"{self.path} is not a usable zen library: {exc}") from None

    # -- what a backend provides ------------------------------------------------------------------
    def query(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """Run one statement; returns a cursor (iterable, fetchone, fetchall)."""
        return self.db.execute(sql, tuple(params))

    def query_many(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            self.db.executemany(sql, rows)

    def max_params(self) -> int:
        """The most parameters one statement may bind (SQLite's compile-time limit: 999 before 3.32)."""
        return self.db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 1

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A write transaction holding the library's write lock: writers queue, none is lost."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that see one state of the library (attribution reads an entry several times;
        a concurrent remove must not make it see half an entry)."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    def _has_meta(self) -> bool:
        return self.query("SELECT name FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is not None

    # -- schema ---------------------------------------------------------------------------------
    def schema_version(self) -> int:
        if not self._has_meta():
            return 0
        row = self.query("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self, create: bool = True) -> None:
        with self.transaction():
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise LibraryError(f"{self.path} has schema {current}, newer than this zen ({SCHEMA_VERSION})",
                                   "upgrade zen to read this library")  # fmt: skip
            if current == 0 and not create:
                raise LibraryError(f"no base model library at {self.path}", "add a model with `zen library add CASE --name NAME`")
            for version in range(current, SCHEMA_VERSION):
                for stmt in render(self.kind)[version]:
                    if stmt.startswith("_"):
                        getattr(self, stmt)()
                    else:
                        self.query(stmt)
                self.query("INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
                           "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (str(version + 1),))  # fmt: skip

    def _backfill_invariants(self) -> None:
        """Compute the invariants of entries stored without them (a migration step; inside its
        transaction), when the opener gave the function. An entry whose MR/PR cannot be decoded is left without:
        attribution then decodes it per query, and reports the same problem it always did."""
        if self.invariants_fn is None:
            return
        todo = self.query("SELECT id, mr, pr FROM models WHERE id NOT IN (SELECT model_id FROM invariants)").fetchall()
        for mid, mr, pr in todo:
            try:
                packed = self.invariants_fn(ModelMR.from_json(_unpack(mr)), ProgrammaticRepresentation.from_json(_unpack(pr)))
            except (ValueError, TypeError, KeyError, zlib.error):
                continue
            self._store_invariants(mid, packed)

    def _build_postings(self) -> None:
        postings.build(self)  # a migration step (schema 6): the postings of the entries already stored

    def _store_invariants(self, mid: int, packed: tuple) -> None:
        row, bodies = packed
        self.query("INSERT INTO invariants(model_id, version, mr, spectrum, views) VALUES (?,?,?,?,?)", (mid, *row))
        self.query_many("INSERT INTO code_bodies(key, text, attrs) VALUES (?,?,?) ON CONFLICT DO NOTHING",
                        [(k, t, _text(a)) for k, t, a in bodies])  # fmt: skip
        self.query_many("INSERT INTO code_body_refs(model_id, body) VALUES (?,?) ON CONFLICT DO NOTHING",
                        [(mid, b[0]) for b in bodies])  # fmt: skip

    def _delete(self, mid: int) -> None:
        """Delete one entry (its hashes, invariants and references cascade) and the code bodies no
        other entry refers to."""
        bodies = [b for (b,) in self.query("SELECT body FROM code_body_refs WHERE model_id=?", (mid,)).fetchall()]
        postings.post(self, mid, postings.model_hashes(self, mid), add=False)
        self.query("DELETE FROM models WHERE id=?", (mid,))
        for i in range(0, len(bodies), 500):
            part = bodies[i : i + 500]
            self.query(f"DELETE FROM code_bodies WHERE key IN ({','.join('?' * len(part))}) AND NOT EXISTS "
                       f"(SELECT 1 FROM code_body_refs r WHERE r.body = code_bodies.key)", part)  # fmt: skip

    def record_audit(self, who: str, action: str, name: str, digests: dict | None = None, detail: str = "") -> None:
        """One audit row; called inside the write transaction it records, so both commit or neither."""
        self.query("INSERT INTO audit(at, who, action, name, digests, detail) VALUES (?,?,?,?,?,?)",
                   (_utc_now(), _text(who), action, name, json.dumps(digests or {}, sort_keys=True), _text(detail)))  # fmt: skip

    def code_bodies(self, keys: list[str]) -> dict[str, tuple[bytes, str]]:
        """Stored code bodies by key: {key: (zlib-compressed listing text, attribute-set JSON)}."""
        out: dict[str, tuple[bytes, str]] = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            q = f"SELECT key, text, attrs FROM code_bodies WHERE key IN ({','.join('?' * len(part))})"
            out.update((k, (bytes(t), a)) for k, t, a in self.query(q, part).fetchall())
        return out

    def entry_bodies(self, names: list[str]) -> dict[str, tuple[bytes, str]]:
        """Every code body the named entries refer to, as `code_bodies` gives them, in one query."""
        q = ("SELECT key, text, attrs FROM code_bodies WHERE key IN (SELECT r.body FROM code_body_refs r JOIN models m "
             f"ON m.id = r.model_id WHERE m.name IN ({','.join('?' * len(names))}))")  # fmt: skip
        return {k: (bytes(t), a) for k, t, a in self.query(q, names).fetchall()} if names else {}

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Library:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- entries --------------------------------------------------------------------------------
    def add(self, name: str, mr: ModelMR, pr: ProgrammaticRepresentation, ur: UnifiedRepresentation, *,
            source_sha256: str | None = None, python: str | None = None, torch: str | None = None,
            notes: str = "", replace: bool = False, created: str | None = None, code: bytes | None = None,
            who: str | None = None, digests: dict | None = None, action: str = "add") -> int:  # fmt: skip
        """Store a base model under `name`; returns its id. `who` (default: this machine's user) is
        recorded as the entry's `added_by` and in the audit row, with `digests` (the case files'
        sha256, for an entry added from a case) and the sha256 of the JSON stored."""
        check_name(name)
        who = _text(who or default_who())
        pr_json = pr.to_json()
        pr_json["system_codes"] = []  # the system-wide table is evidence, not fingerprint: not stored
        summary = {"modules": len(mr.modules), "tensors": len(mr.tensors), "code_objects": len(pr.codes),
                   "classes": len(pr.classes), "layer_types": len(mr.layer_types),
                   "parameter_elements": _int(mr.summary.get("parameter_elements")), "framework": mr.framework}  # fmt: skip
        created = created or _utc_now()
        if self.invariants_fn is None:
            raise TypeError("Library.add needs the library opened with invariants= (zen.attribute.invariants.packed)")
        packed = self.invariants_fn(mr, pr)  # before the transaction: the lock is short
        stored = {k: _json_bytes(v) for k, v in (("mr", mr.to_json()), ("pr", pr_json), ("ur", ur.to_json()))}
        record = {**(digests or {}), "stored": {k: hashlib.sha256(v).hexdigest() for k, v in stored.items()}}
        if source_sha256:
            record.setdefault("evidence", source_sha256)
        blobs = {k: zlib.compress(v, 6) for k, v in stored.items()}
        with self.transaction():
            exists = self.query("SELECT id FROM models WHERE name=?", (name,)).fetchone()
            if exists and not replace:
                raise Conflict(f"the library already has a model named {name!r}", "use --replace or another name")
            if exists:
                self._delete(exists[0])
            mid = self.query(
                "INSERT INTO models(name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes, code,"
                " added_by) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
                (name, _text(created), _text(source_sha256), _text(python), _text(torch), _text(mr.root.cls), json.dumps(summary),
                 blobs["mr"], blobs["pr"], blobs["ur"], _text(notes), zlib.compress(code, 6) if code else None, who),
            ).fetchone()[0]  # fmt: skip
            rows = [(mid, "bytecode", c.bytecode_sha256, c.address) for c in pr.codes]
            rows += [(mid, "listing", c.listing_sha256, c.address) for c in pr.codes]
            self.query_many("INSERT INTO code_hashes(model_id, kind, hash, code) VALUES (?,?,?,?)", rows)
            postings.post(self, mid, [c.listing_sha256 for c in pr.codes], add=True)
            self._store_invariants(mid, packed)
            self.record_audit(who, "replace" if exists else action, name, record)
        return mid

    def add_case(self, case_dir: Path, name: str, *, replace: bool = False, notes: str = "", who: str | None = None) -> int:
        """Add a case's fingerprint; the files are read once, checked against the manifest's digests
        and parsed by the same bounded readers a server uses for an upload (zen.library.bundle)."""
        from zen.library.bundle import Bundle

        return self.add_fingerprint(name, Bundle.from_case(case_dir).fingerprint(), replace=replace, notes=notes, who=who)

    def add_fingerprint(self, name: str, fp: Any, *, replace: bool = False, notes: str = "", who: str | None = None) -> int:
        """Add a checked `zen.library.bundle.Fingerprint`."""
        return self.add(name, fp.mr, fp.pr, fp.ur, source_sha256=fp.source_sha256, python=fp.python, torch=fp.torch,
                        notes=notes, replace=replace, code=fp.code, who=who, digests=fp.digests)  # fmt: skip

    def code(self, name: str) -> bytes | None:
        """The base's rebuilt code objects (a case's code.marshal) when they were stored."""
        row = self.query("SELECT code FROM models WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no model named {name!r} in {self.path}")
        return zlib.decompress(row[0]) if row[0] else None

    def _entry(self, row) -> Entry:
        (mid, name, created, sha, python, torch, root, summary, mr, pr, ur, notes) = row
        return Entry(mid, name, created, sha, python, torch, root, json.loads(summary), notes, bytes(mr), bytes(pr), bytes(ur))

    _COLUMNS = "id, name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes"

    def get(self, name: str) -> Entry:
        row = self.query(f"SELECT {self._COLUMNS} FROM models WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no model named {name!r} in {self.path}", "`zen library list` shows the names")
        return self._entry(row)

    def entries(self, names: Iterable[str] | None = None) -> list[Entry]:
        if names is None:
            rows = self.query(f"SELECT {self._COLUMNS} FROM models ORDER BY name").fetchall()
        else:
            wanted = list(names)
            rows = []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                q = f"SELECT {self._COLUMNS} FROM models WHERE name IN ({','.join('?' * len(part))})"
                rows += self.query(q, part).fetchall()
            rows.sort(key=lambda r: r[1])
        return [self._entry(r) for r in rows]

    def list(self) -> list[dict]:
        rows = self.query("SELECT name, created, python, torch, root_class, summary, notes, added_by FROM models").fetchall()
        out = [{"name": n, "created": c, "python": p, "torch": t, "root_class": r, "summary": json.loads(s), "notes": no,
                "added_by": by} for n, c, p, t, r, s, no, by in rows]  # fmt: skip
        out.sort(key=lambda r: r["name"])  # in Python: SQLite and PostgreSQL collate text differently
        return out

    def search(self, **filters: str | None) -> list[dict]:
        """Entries matching every filter given (zen.library.search); the same rows on every backend."""
        from zen.library.search import matching

        return matching(self.list(), **filters)

    def show(self, name: str) -> dict[str, Any]:
        """One entry as `zen library show --json` prints it: metadata, layer types, model code modules."""
        e = self.get(name)
        mr, pr = e.mr, e.pr
        row = self.query("SELECT added_by FROM models WHERE name=?", (name,)).fetchone()
        return {"name": e.name, "created": e.created, "source_sha256": e.source_sha256, "python": e.python,
                "torch": e.torch, "root_class": e.root_class, "notes": e.notes, "summary": e.summary,
                "added_by": row[0] if row else "", "layer_types": mr.layer_types, "modules": pr.modules,
                "classes": sorted(c.name for c in pr.classes), "code_objects": len(pr.codes)}  # fmt: skip

    def mr_invariants(self, names: Iterable[str] | None = None) -> list[InvariantRow]:
        """Summary and stored MR invariants of the named entries (all when None), sorted by name:
        one query, no MR/PR JSON decoded."""
        cols = ("SELECT m.name, m.summary, i.version, i.mr, i.spectrum FROM models m "
                "LEFT JOIN invariants i ON i.model_id = m.id")  # fmt: skip
        if names is None:
            rows = self.query(cols).fetchall()
        else:
            wanted, rows = list(names), []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                rows += self.query(f"{cols} WHERE m.name IN ({','.join('?' * len(part))})", part).fetchall()
        rows.sort(key=lambda r: r[0])
        return [InvariantRow(n, json.loads(s), v, _opt_bytes(mr), _opt_bytes(sp)) for n, s, v, mr, sp in rows]

    def views_blob(self, name: str) -> tuple[int, bytes] | None:
        """(invariants version, packed code views) of one entry, or None when it has none stored."""
        row = self.query("SELECT i.version, i.views FROM invariants i JOIN models m ON m.id = i.model_id "
                         "WHERE m.name=?", (name,)).fetchone()  # fmt: skip
        return (row[0], bytes(row[1])) if row else None

    def remove(self, name: str, *, who: str | None = None) -> None:
        with self.transaction():
            row = self.query("SELECT id, source_sha256 FROM models WHERE name=?", (name,)).fetchone()
            if row is not None:
                self._delete(row[0])
                self.record_audit(who or default_who(), "remove", name, {"evidence": row[1]} if row[1] else {})
        if row is None:
            raise NotFound(f"no model named {name!r} in {self.path}")

    def __len__(self) -> int:
        return self.query("SELECT COUNT(*) FROM models").fetchone()[0]

    def audit_log(self, *, name: str | None = None, limit: int = 100) -> list[dict]:
        """The latest writes, newest first (all, or those of one entry name)."""
        where, params = ("WHERE name=?", [name]) if name is not None else ("", [])
        rows = self.query(f"SELECT id, at, who, action, name, digests, detail FROM audit {where} ORDER BY id DESC LIMIT ?",
                          [*params, max(0, int(limit))]).fetchall()  # fmt: skip
        return [{"at": at, "who": who, "action": a, "name": n, "digests": json.loads(d), "detail": det}
                for _, at, who, a, n, d, det in rows]  # fmt: skip

    # -- candidate selection (Algorithm 1, lines 3-7) -----------------------------------------
    def sharing(self, kind: str, hashes: Iterable[str]) -> dict[str, int]:
        """Library model name -> number of the given (distinct) hashes it also has. Listing hashes, what
        candidate selection counts, are read from their postings (`zen.library.postings`: one row per hash);
        other kinds from the stored rows (`postings.counts_by_rows`, the postings' reference in the tests)."""
        found = postings.counts(self, hashes) if kind == "listing" else postings.counts_by_rows(self, kind, hashes)
        names = dict(self.query("SELECT id, name FROM models").fetchall()) if found else {}
        return {names[mid]: n for mid, n in found.items() if mid in names}

    # -- sharing libraries ------------------------------------------------------------------------
    def export(self, path: Path, names: Iterable[str] | None = None) -> int:
        from zen.library.exchange import export_file

        return export_file(self, path, names)

    def export_data(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        from zen.library.exchange import export_data

        return export_data(self, names)

    def import_(self, path: Path, *, replace: bool = False, who: str | None = None) -> list[str]:
        """Add the models of an export file (checked as untrusted input: zen.library.exchange)."""
        from zen.library.exchange import import_file

        return import_file(self, path, replace=replace, who=who)


def _int(v: Any) -> int | None:
    return v if type(v) is int else None  # a summary comes from a case file: listings format it as a number


def _opt_bytes(v: Any) -> bytes | None:
    return None if v is None else bytes(v)
