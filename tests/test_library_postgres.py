"""The library in PostgreSQL (issue 32), on a real PostgreSQL server and real recovered cases.

One schema definition for both engines (same tables, columns, indexes after migration); writers in
8 processes at once lose, duplicate and half-write nothing; bad URLs and databases are one-line
errors. (Same attribution as SQLite and over HTTP: tests/test_library_service.py.)
"""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest
from conftest import recovered, zen
from library_checks import problems

from zen.attribute.invariants import packed
from zen.library.postgres import PostgresLibrary, redact
from zen.library.schema import SCHEMA_VERSION, STEPS, render
from zen.library.store import MIGRATIONS, Library, LibraryError
from zen.runtime import childproc


def _convnet_case(family_images, workdir):
    image, target = family_images["convnet"]
    return recovered(image, target, "convnet", workdir)[0]


def _sqlite_shape(path) -> tuple[dict, set]:
    db = sqlite3.connect(path)
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    cols = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in tables}
    idx = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='index' AND name NOT LIKE 'sqlite_%'")}
    db.close()
    return cols, idx


def test_one_schema_for_both_engines(pg_cluster, tmp_path):
    """Migrated from nothing, SQLite and PostgreSQL hold the same tables, columns and indexes; the
    SQLite rendering is the SQL every earlier zen ran (steps before 5 unchanged)."""
    with Library(tmp_path / "s.sqlite", invariants=packed) as lib:
        assert lib.schema_version() == SCHEMA_VERSION == len(STEPS)
    cols, idx = _sqlite_shape(tmp_path / "s.sqlite")
    url = pg_cluster.create_db("shape")
    with PostgresLibrary(url, invariants=packed) as lib:
        assert lib.schema_version() == SCHEMA_VERSION
        rows = lib.query("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema='public'").fetchall()
        pg_cols: dict[str, set] = {}
        for t, c in rows:
            pg_cols.setdefault(t, set()).add(c)
        q = (
            "SELECT indexname FROM pg_indexes WHERE schemaname='public' "
            "AND indexname NOT LIKE '%_pkey' AND indexname NOT LIKE '%_key'"
        )
        pg_idx = {n for (n,) in lib.query(q).fetchall()}
    assert pg_cols == cols and pg_idx == idx
    assert {"audit", "tokens"} <= set(cols) and "added_by" in cols["models"]
    assert MIGRATIONS == render("sqlite") and "BLOB" in MIGRATIONS[0][1] and "BYTEA" in render("postgresql")[0][1]
    assert MIGRATIONS[3][1].endswith(") WITHOUT ROWID") and "WITHOUT ROWID" not in " ".join(render("postgresql")[3])


def test_postgres_library_like_sqlite(pg_cluster, family_images, workdir, tmp_path):
    """Add through the CLI, list, show, search, attribute, remove: the same answers as a SQLite file."""
    case = _convnet_case(family_images, workdir)
    fork = recovered(*family_images["convnet"], "convnet_se", workdir)[0]
    url = pg_cluster.create_db("cli")
    lite = tmp_path / "lite.sqlite"
    for lib in (url, lite):
        zen("library", "add", case, "--name", "convnet", "--library", lib, "--notes", "base")
        zen("library", "add", fork, "--name", "convnet_se", "--library", lib)
    out = {}
    for lib in (url, lite):
        listed = json.loads(zen("library", "list", "--library", lib, "--json").stdout)
        shown = json.loads(zen("library", "show", "convnet", "--library", lib, "--json").stdout)
        found = json.loads(zen("library", "search", "--name", "SE", "--architecture", "convnet", "--library", lib,
                               "--json").stdout)  # fmt: skip
        att = json.loads(zen("attribute", fork, "--library", lib, "--json").stdout)
        for row in listed + [shown]:
            row.pop("created")
        out[str(lib)] = (listed, shown, [r["name"] for r in found], att)
    assert out[url] == out[str(lite)]
    assert out[url][2] == ["convnet_se"] and out[url][3]["attributed"] == "convnet_se"
    zen("library", "remove", "convnet_se", "--library", url)
    with PostgresLibrary(url, invariants=packed) as lib:
        assert [r["name"] for r in lib.list()] == ["convnet"] and problems(lib) == []
        assert [a["action"] for a in lib.audit_log()] == ["remove", "add", "add"]
        assert lib.query("SELECT COUNT(*) FROM code_bodies").fetchone()[0] > 0


WRITER = """
import sys
from zen.library.bundle import Bundle
from zen.attribute.invariants import packed
from zen.library.postgres import PostgresLibrary
url, case, prefix, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fp = Bundle.from_case(case).fingerprint()
with PostgresLibrary(url, invariants=packed) as lib:
    for i in range(n):
        lib.add_fingerprint(f"{prefix}-{i}", fp)
        lib.add_fingerprint("contested", fp, replace=True)
print("done", flush=True)
"""


def test_eight_processes_write_at_once(pg_cluster, family_images, workdir):
    """8 processes (each its own connection, migrating a fresh database at the same moment) add 5
    entries each and all replace one contested entry 5 times: nothing lost, duplicated or half-written."""
    case = _convnet_case(family_images, workdir)
    url = pg_cluster.create_db("writers")
    procs = []
    with childproc.scratch_cwd() as cwd:
        for w in range(8):
            argv = childproc.code_argv(WRITER, [url, str(case), f"w{w}", "5"])
            procs.append(subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 and o.strip() == "done" for p, (o, _) in zip(procs, results)), [e[-500:] for _, e in results]
    with PostgresLibrary(url, invariants=packed) as lib:
        names = [r["name"] for r in lib.list()]
        assert sorted(names) == sorted([f"w{w}-{i}" for w in range(8) for i in range(5)] + ["contested"])
        assert problems(lib) == []
        actions = [a["action"] for a in lib.audit_log(name="contested", limit=1000)]
        assert len(actions) == 40 and actions.count("add") == 1 and actions.count("replace") == 39
        assert lib.query("SELECT COUNT(*) FROM audit").fetchone()[0] == 80
        assert lib.schema_version() == SCHEMA_VERSION


def test_postgres_errors_are_one_line(pg_cluster, tmp_path):
    unreachable = "postgresql://zen:secret@127.0.0.1:1/nothing"
    res = zen("library", "list", "--library", unreachable, check=False)
    assert res.returncode == 2 and "cannot connect to the library database" in res.stderr and "Traceback" not in res.stderr
    assert "secret" not in res.stderr and redact(unreachable) == "postgresql://zen:***@127.0.0.1:1/nothing"
    empty = pg_cluster.create_db("empty")
    res = zen("library", "list", "--library", empty, check=False)
    assert res.returncode == 2 and "no base model library" in res.stderr
    with PostgresLibrary(empty, invariants=packed) as lib:  # created now (a write command creates it)
        lib.query("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(LibraryError, match="newer than this zen"):
        PostgresLibrary(empty, invariants=packed)
