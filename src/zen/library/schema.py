"""The library's schema and its migrations: one definition for SQLite and PostgreSQL.

A library is the same data whether it lives in a SQLite file (one investigator) or a PostgreSQL
database (a team): the same tables, the same columns, migrated forward by the same steps. The steps
are written once, in the SQL both engines accept, with three tokens where their dialects differ:

    {pk}      an auto-numbered integer key  SQLite: INTEGER PRIMARY KEY   PostgreSQL: BIGSERIAL PRIMARY KEY
    {blob}    bytes                         SQLite: BLOB                  PostgreSQL: BYTEA
    {norowid} a table clustered on its key  SQLite: WITHOUT ROWID         PostgreSQL: (nothing; a heap)

A step that starts with "_" names a data migration: a method of the store, run inside the same
transaction (see `Library._migrate`). Rendered for SQLite, steps 1-4 are byte for byte the SQL that
created every SQLite library before PostgreSQL was supported, so old files migrate as they always did.

Version history: 1 the original layout; 2 free-text notes and a per-model index for fast removal;
3 the base's rebuilt code objects (compressed code.marshal), so `zen diff` can decompile both sides;
4 the per-entry attribution invariants (computed for existing entries by `_backfill_invariants`),
the code bodies they refer to (each distinct listing + attribute set once, with who refers to it),
and a covering index, so counting shared code per model reads the index alone; 5 who added each
entry, the audit table (every write: who, what, when, the fingerprint's digests) and the access
tokens of `zen serve` (their sha256 only, never the token), so a team's server and its curators'
direct connections share one record of who changed the library; 6 each listing hash's entries as one posting
(a sorted array of model ids), so counting the code a query shares with every entry reads one row per hash of the
query, not one per (hash, entry) pair (`Library.sharing`: a transformers query against 1,000 entries read 0.9 M
index rows, 0.45-0.63 s; now ~4,000 postings), built from the rows already stored (`_build_postings`).
"""

from __future__ import annotations

SCHEMA_VERSION = 6

STEPS: list[list[str]] = [
    [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE models (
            id {pk}, name TEXT NOT NULL UNIQUE, created TEXT NOT NULL, source_sha256 TEXT,
            python TEXT, torch TEXT, root_class TEXT, summary TEXT NOT NULL,
            mr {blob} NOT NULL, pr {blob} NOT NULL, ur {blob} NOT NULL)""",
        """CREATE TABLE code_hashes (
            model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
            kind TEXT NOT NULL, hash TEXT NOT NULL, code TEXT NOT NULL)""",
        "CREATE INDEX code_hashes_lookup ON code_hashes(kind, hash)",
    ],
    [
        "ALTER TABLE models ADD COLUMN notes TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX code_hashes_model ON code_hashes(model_id)",
    ],
    ["ALTER TABLE models ADD COLUMN code {blob}"],
    [
        """CREATE TABLE invariants (
            model_id INTEGER PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
            version INTEGER NOT NULL, mr {blob} NOT NULL, spectrum {blob} NOT NULL, views {blob} NOT NULL)""",
        """CREATE TABLE code_bodies (key TEXT PRIMARY KEY, text {blob} NOT NULL, attrs TEXT NOT NULL){norowid}""",
        """CREATE TABLE code_body_refs (
            model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE, body TEXT NOT NULL,
            PRIMARY KEY (model_id, body)){norowid}""",
        "CREATE INDEX code_body_refs_body ON code_body_refs(body)",
        "CREATE INDEX code_hashes_cover ON code_hashes(kind, hash, model_id)",
        "DROP INDEX code_hashes_lookup",
        "_backfill_invariants",
    ],
    [
        "ALTER TABLE models ADD COLUMN added_by TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE audit (
            id {pk}, at TEXT NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL, name TEXT NOT NULL,
            digests TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX audit_name ON audit(name)",
        """CREATE TABLE tokens (
            id {pk}, name TEXT NOT NULL UNIQUE, hash TEXT NOT NULL UNIQUE, scopes TEXT NOT NULL, created TEXT NOT NULL)""",
    ],
    [
        "CREATE TABLE listing_postings (hash TEXT PRIMARY KEY, models {blob} NOT NULL){norowid}",
        "_build_postings",
    ],
]

DIALECTS: dict[str, dict[str, str]] = {
    "sqlite": {"pk": "INTEGER PRIMARY KEY", "blob": "BLOB", "norowid": " WITHOUT ROWID"},
    "postgresql": {"pk": "BIGSERIAL PRIMARY KEY", "blob": "BYTEA", "norowid": ""},
}


def render(dialect: str) -> list[list[str]]:
    """Every step's statements in one dialect (data-migration names unchanged)."""
    tokens = DIALECTS[dialect]
    return [[s if s.startswith("_") else s.format(**tokens) for s in step] for step in STEPS]
