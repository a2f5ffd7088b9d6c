"""The Base Model Library (ZEN §IV-B a): fingerprints of known base models in SQLite.

One row per base model: its name (the ground truth), metadata (source image hash, versions, date),
and its MR, PR (model-specific code only) and UR as compressed JSON. Every code object's
de-specialised bytecode hash and normalised-listing hash is also stored in an indexed table, so
Algorithm 1's candidate selection ("which bases share any function with this model?") is one
indexed query, not a scan of every entry.

Attribution compares a query with every candidate entry; what it needs of an entry that does
not depend on the query (layer and tensor multisets, hyper-parameters, the module graph's Laplacian
spectrum, the code views) is computed once here, at `add`, and kept in the `invariants` table
(zen.attribute.invariants says what and why): decoding an entry's MR and PR JSON and recomputing
its spectrum per query cost 0.1-0.7 s per real entry.

The database runs in WAL mode with a busy timeout; each `add` is one IMMEDIATE transaction, so
several processes can add concurrently without losing entries. The schema is versioned and
migrated forward on open (`MIGRATIONS`; a step is SQL text, or a method name for data migrations).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from zen.errors import ZenError
from zen.represent import textio
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation

SCHEMA_VERSION = 4
# Statements that bring a database from version N-1 to N (index N-1). Version 1 is the original
# layout; version 2 added free-text notes and a per-model index for fast removal; version 3 the
# base's rebuilt code objects (compressed code.marshal), so `zen diff` can decompile both sides;
# version 4 the per-entry attribution invariants (computed for existing entries by the
# `_backfill_invariants` step), the code bodies they refer to (each distinct listing + attribute
# set once, with who refers to it), and a covering index, so counting shared code per model reads
# the index alone (at 10,000 entries of transformers models that is millions of rows).
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE models (
            id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created TEXT NOT NULL, source_sha256 TEXT,
            python TEXT, torch TEXT, root_class TEXT, summary TEXT NOT NULL,
            mr BLOB NOT NULL, pr BLOB NOT NULL, ur BLOB NOT NULL)""",
        """CREATE TABLE code_hashes (
            model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
            kind TEXT NOT NULL, hash TEXT NOT NULL, code TEXT NOT NULL)""",
        "CREATE INDEX code_hashes_lookup ON code_hashes(kind, hash)",
    ],
    [
        "ALTER TABLE models ADD COLUMN notes TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX code_hashes_model ON code_hashes(model_id)",
    ],
    ["ALTER TABLE models ADD COLUMN code BLOB"],
    [
        """CREATE TABLE invariants (
            model_id INTEGER PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
            version INTEGER NOT NULL, mr BLOB NOT NULL, spectrum BLOB NOT NULL, views BLOB NOT NULL)""",
        """CREATE TABLE code_bodies (key TEXT PRIMARY KEY, text BLOB NOT NULL, attrs TEXT NOT NULL) WITHOUT ROWID""",
        """CREATE TABLE code_body_refs (
            model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE, body TEXT NOT NULL,
            PRIMARY KEY (model_id, body)) WITHOUT ROWID""",
        "CREATE INDEX code_body_refs_body ON code_body_refs(body)",
        "CREATE INDEX code_hashes_cover ON code_hashes(kind, hash, model_id)",
        "DROP INDEX code_hashes_lookup",
        "_backfill_invariants",
    ],
]


class InvariantRow(NamedTuple):
    """An entry's stored attribution invariants (blobs as zen.attribute.invariants packs them);
    `version` is None when the entry has none (see `Library.mr_invariants`)."""

    name: str
    summary: dict
    version: int | None
    mr: bytes | None
    spectrum: bytes | None


class LibraryError(ZenError):
    pass


def default_library_path() -> Path:
    env = os.environ.get("ZEN_LIBRARY")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "zen" / "library.sqlite"


def _pack(obj: dict) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace"), 6)


def _unpack(blob: bytes) -> dict:
    return json.loads(zlib.decompress(blob))


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

    @property
    def mr(self) -> ModelMR:
        return ModelMR.from_json(_unpack(self._mr))

    @property
    def pr(self) -> ProgrammaticRepresentation:
        return ProgrammaticRepresentation.from_json(_unpack(self._pr))

    @property
    def ur(self) -> UnifiedRepresentation:
        return UnifiedRepresentation.from_json(_unpack(self._ur))

    def export(self) -> dict[str, Any]:
        return {"name": self.name, "created": self.created, "source_sha256": self.source_sha256, "python": self.python,
                "torch": self.torch, "root_class": self.root_class, "summary": self.summary, "notes": self.notes,
                "mr": _unpack(self._mr), "pr": _unpack(self._pr), "ur": _unpack(self._ur)}  # fmt: skip


class Library:
    """A base-model library file; use as a context manager or call `close()`."""

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        self.path = Path(path) if path is not None else default_library_path()
        if not self.path.exists():
            if not create:
                raise LibraryError(f"no base model library at {self.path}", "add a model with `zen library add CASE --name NAME`")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self.db.execute("PRAGMA busy_timeout = 60000")
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise LibraryError(f"{self.path} is not a usable zen library: {exc}") from None

    # -- schema ---------------------------------------------------------------------------------
    def schema_version(self) -> int:
        has_meta = self.db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if not has_meta:
            return 0
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise LibraryError(f"{self.path} has schema {current}, newer than this zen ({SCHEMA_VERSION})",
                                   "upgrade zen to read this library")  # fmt: skip
            for version in range(current, SCHEMA_VERSION):
                for stmt in MIGRATIONS[version]:
                    if stmt.startswith("_"):
                        getattr(self, stmt)()
                    else:
                        self.db.execute(stmt)
                self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(version + 1),))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _backfill_invariants(self) -> None:
        """Compute the invariants of entries stored without them (a migration step; inside its
        transaction). An entry whose MR/PR cannot be decoded is left without: attribution then
        decodes it per query, and reports the same problem it always did."""
        from zen.attribute.invariants import invariants

        for mid, mr, pr in self.db.execute(
            "SELECT id, mr, pr FROM models WHERE id NOT IN (SELECT model_id FROM invariants)"
        ).fetchall():
            try:
                inv = invariants(ModelMR.from_json(_unpack(mr)), ProgrammaticRepresentation.from_json(_unpack(pr)))
            except (ValueError, TypeError, KeyError, zlib.error):
                continue
            self._store_invariants(mid, inv.pack())

    def _store_invariants(self, mid: int, packed: tuple) -> None:
        row, bodies = packed
        self.db.execute("INSERT INTO invariants(model_id, version, mr, spectrum, views) VALUES (?,?,?,?,?)", (mid, *row))
        self.db.executemany("INSERT OR IGNORE INTO code_bodies(key, text, attrs) VALUES (?,?,?)", bodies)
        self.db.executemany("INSERT OR IGNORE INTO code_body_refs(model_id, body) VALUES (?,?)",
                            [(mid, b[0]) for b in bodies])  # fmt: skip

    def _delete(self, mid: int) -> None:
        """Delete one entry (its hashes, invariants and references cascade) and the code bodies no
        other entry refers to."""
        bodies = [b for (b,) in self.db.execute("SELECT body FROM code_body_refs WHERE model_id=?", (mid,))]
        self.db.execute("DELETE FROM models WHERE id=?", (mid,))
        for i in range(0, len(bodies), 500):
            part = bodies[i : i + 500]
            self.db.execute(f"DELETE FROM code_bodies WHERE key IN ({','.join('?' * len(part))}) AND NOT EXISTS "
                            f"(SELECT 1 FROM code_body_refs r WHERE r.body = code_bodies.key)", part)  # fmt: skip

    def code_bodies(self, keys: list[str]) -> dict[str, tuple[bytes, str]]:
        """Stored code bodies by key: {key: (zlib-compressed listing text, attribute-set JSON)}."""
        out: dict[str, tuple[bytes, str]] = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            q = f"SELECT key, text, attrs FROM code_bodies WHERE key IN ({','.join('?' * len(part))})"
            out.update((k, (t, a)) for k, t, a in self.db.execute(q, part))
        return out

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Library:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- entries --------------------------------------------------------------------------------
    def add(self, name: str, mr: ModelMR, pr: ProgrammaticRepresentation, ur: UnifiedRepresentation, *,
            source_sha256: str | None = None, python: str | None = None, torch: str | None = None,
            notes: str = "", replace: bool = False, created: str | None = None, code: bytes | None = None) -> int:  # fmt: skip
        """Store a base model under `name`; returns its id."""
        if not name or name.strip() != name:
            raise LibraryError(f"invalid model name {name!r}", "use a non-empty name without surrounding spaces")
        pr_json = pr.to_json()
        pr_json["system_codes"] = []  # the system-wide table is evidence, not fingerprint: not stored
        summary = {"modules": len(mr.modules), "tensors": len(mr.tensors), "code_objects": len(pr.codes),
                   "classes": len(pr.classes), "layer_types": len(mr.layer_types),
                   "parameter_elements": mr.summary.get("parameter_elements"), "framework": mr.framework}  # fmt: skip
        created = created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        from zen.attribute.invariants import invariants

        packed = invariants(mr, pr).pack()  # before the transaction: the write lock is held briefly
        self.db.execute("BEGIN IMMEDIATE")
        try:
            exists = self.db.execute("SELECT id FROM models WHERE name=?", (name,)).fetchone()
            if exists and not replace:
                raise LibraryError(f"the library already has a model named {name!r}", "use --replace or another name")
            if exists:
                self._delete(exists[0])
            cur = self.db.execute(
                "INSERT INTO models(name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes, code)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (name, created, source_sha256, python, torch, mr.root.cls, json.dumps(summary),
                 _pack(mr.to_json()), _pack(pr_json), _pack(ur.to_json()), notes, zlib.compress(code, 6) if code else None),
            )  # fmt: skip
            mid = cur.lastrowid
            rows = [(mid, "bytecode", c.bytecode_sha256, c.address) for c in pr.codes]
            rows += [(mid, "listing", c.listing_sha256, c.address) for c in pr.codes]
            self.db.executemany("INSERT INTO code_hashes(model_id, kind, hash, code) VALUES (?,?,?,?)", rows)
            self._store_invariants(mid, packed)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return mid

    def add_case(self, case_dir: Path, name: str, *, replace: bool = False, notes: str = "") -> int:
        from zen.represent import case

        manifest = case.load_manifest(case_dir)
        # a base model's fingerprint is what every later attribution trusts: only an intact case
        case.require_intact(case_dir, manifest, case.ALL_FILES)
        code_file = Path(case_dir) / case.CODE_FILE
        return self.add(name, case.load_mr(case_dir), case.load_pr(case_dir), case.load_ur(case_dir),
                        source_sha256=manifest.get("evidence", {}).get("sha256"),
                        python=manifest.get("python", {}).get("version"), torch=manifest.get("torch", {}).get("version"),
                        notes=notes, replace=replace, code=code_file.read_bytes() if code_file.is_file() else None)  # fmt: skip

    def code(self, name: str) -> bytes | None:
        """The base's rebuilt code objects (a case's code.marshal) when they were stored."""
        row = self.db.execute("SELECT code FROM models WHERE name=?", (name,)).fetchone()
        if row is None:
            raise LibraryError(f"no model named {name!r} in {self.path}")
        return zlib.decompress(row[0]) if row[0] else None

    def _entry(self, row) -> Entry:
        (mid, name, created, sha, python, torch, root, summary, mr, pr, ur, notes) = row
        return Entry(mid, name, created, sha, python, torch, root, json.loads(summary), notes, mr, pr, ur)

    _COLUMNS = "id, name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes"

    def get(self, name: str) -> Entry:
        row = self.db.execute(f"SELECT {self._COLUMNS} FROM models WHERE name=?", (name,)).fetchone()
        if row is None:
            raise LibraryError(f"no model named {name!r} in {self.path}", "`zen library list` shows the names")
        return self._entry(row)

    def entries(self, names: Iterable[str] | None = None) -> list[Entry]:
        if names is None:
            rows = self.db.execute(f"SELECT {self._COLUMNS} FROM models ORDER BY name").fetchall()
        else:
            wanted = list(names)
            rows = []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                q = f"SELECT {self._COLUMNS} FROM models WHERE name IN ({','.join('?' * len(part))}) ORDER BY name"
                rows += self.db.execute(q, part).fetchall()
        return [self._entry(r) for r in rows]

    def list(self) -> list[dict]:
        rows = self.db.execute("SELECT name, created, python, torch, root_class, summary, notes FROM models ORDER BY name")
        return [{"name": n, "created": c, "python": p, "torch": t, "root_class": r, "summary": json.loads(s), "notes": no}
                for n, c, p, t, r, s, no in rows]  # fmt: skip

    def mr_invariants(self, names: Iterable[str] | None = None) -> list[InvariantRow]:
        """Summary and stored MR invariants of the named entries (all when None), sorted by name:
        one query, no MR/PR JSON decoded."""
        cols = ("SELECT m.name, m.summary, i.version, i.mr, i.spectrum FROM models m "
                "LEFT JOIN invariants i ON i.model_id = m.id")  # fmt: skip
        if names is None:
            rows = self.db.execute(f"{cols} ORDER BY m.name").fetchall()
        else:
            wanted, rows = list(names), []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                rows += self.db.execute(f"{cols} WHERE m.name IN ({','.join('?' * len(part))})", part).fetchall()
            rows.sort(key=lambda r: r[0])
        return [InvariantRow(n, json.loads(s), v, mr, sp) for n, s, v, mr, sp in rows]

    def views_blob(self, name: str) -> tuple[int, bytes] | None:
        """(invariants version, packed code views) of one entry, or None when it has none stored."""
        row = self.db.execute("SELECT i.version, i.views FROM invariants i JOIN models m ON m.id = i.model_id "
                              "WHERE m.name=?", (name,)).fetchone()  # fmt: skip
        return (row[0], row[1]) if row else None

    def remove(self, name: str) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT id FROM models WHERE name=?", (name,)).fetchone()
            if row is not None:
                self._delete(row[0])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if row is None:
            raise LibraryError(f"no model named {name!r} in {self.path}")

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM models").fetchone()[0]

    # -- candidate selection (Algorithm 1, lines 3-7) -----------------------------------------
    def sharing(self, kind: str, hashes: Iterable[str]) -> dict[str, int]:
        """Library model name -> number of the given hashes it also has (one indexed query)."""
        hashes = sorted(set(hashes))
        counts: Counter[int] = Counter()
        for i in range(0, len(hashes), 500):
            part = hashes[i : i + 500]
            # Read from the covering index (kind, hash, model_id) alone, in its order: DISTINCT needs no
            # temporary B-tree that way, unlike GROUP BY model_id with COUNT(DISTINCT hash), which
            # sorted every matching row (millions for a transformers query against 10,000 entries).
            # A hash falls in one chunk only, so per-chunk counts add up to distinct counts.
            q = (f"SELECT model_id FROM (SELECT DISTINCT hash, model_id FROM code_hashes "
                 f"WHERE kind=? AND hash IN ({','.join('?' * len(part))}))")  # fmt: skip
            counts.update(mid for (mid,) in self.db.execute(q, [kind, *part]))
        names = dict(self.db.execute("SELECT id, name FROM models"))
        return {names[mid]: n for mid, n in counts.items() if mid in names}

    # -- sharing libraries ------------------------------------------------------------------------
    def export(self, path: Path, names: Iterable[str] | None = None) -> int:
        import base64

        items = [e.export() for e in self.entries(names)]
        for item in items:
            code = self.code(item["name"])
            item["code_marshal"] = base64.b64encode(code).decode() if code else None
        textio.write_json(path, {"format": 1, "kind": "zen-library-export", "models": items})
        return len(items)

    def import_(self, path: Path, *, replace: bool = False) -> list[str]:
        """Add the models of an export file. The file comes from elsewhere: it must be a regular file,
        and every model is checked against the MR/PR/UR schema before anything is added."""
        import base64
        import binascii
        import stat

        from zen.represent.schema import CaseFileError, check_record, parse_json

        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise LibraryError(f"{path} is not a regular file")
        except OSError as exc:
            raise LibraryError(f"cannot read library export {path}: {exc.strerror}") from None
        try:
            data = parse_json(Path(path))
        except CaseFileError as exc:
            raise LibraryError(f"cannot read library export {path}: {exc}") from None
        if type(data) is not dict or data.get("kind") != "zen-library-export" or data.get("format") != 1:
            raise LibraryError(f"{path} is not a zen library export")
        models = data.get("models")
        if type(models) is not list:
            raise LibraryError(f"{path}: `models` is not a list")
        checked = []
        for i, item in enumerate(models):
            where = f"{Path(path).name}: models[{i}]"
            try:
                if type(item) is not dict or type(item.get("name")) is not str or not item["name"]:
                    raise CaseFileError(f"{where}: expected an object with a `name`")
                for key, cls in (("mr", ModelMR), ("pr", ProgrammaticRepresentation), ("ur", UnifiedRepresentation)):
                    check_record(item.get(key), cls, f"{where}.{key}", ("kind", "format"))
                mr, pr, ur = (ModelMR.from_json(item["mr"]), ProgrammaticRepresentation.from_json(item["pr"]),
                              UnifiedRepresentation.from_json(item["ur"]))  # fmt: skip
                blob = item.get("code_marshal")
                code = base64.b64decode(blob, validate=True) if isinstance(blob, str) and blob else None
            except (CaseFileError, ValueError, TypeError, KeyError, binascii.Error) as exc:
                raise LibraryError(f"{path} is not a valid library export: {exc}") from None
            meta = {k: item.get(k) if isinstance(item.get(k), str) else None
                    for k in ("source_sha256", "python", "torch", "created")}  # fmt: skip
            checked.append((item["name"], mr, pr, ur, meta, str(item.get("notes") or ""), code))
        names = []
        for name, mr, pr, ur, meta, notes, code in checked:  # all valid: add them in one go
            self.add(name, mr, pr, ur, source_sha256=meta["source_sha256"], python=meta["python"], torch=meta["torch"],
                     notes=notes, replace=replace, created=meta["created"], code=code)  # fmt: skip
            names.append(name)
        return names
