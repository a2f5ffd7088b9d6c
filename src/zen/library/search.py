"""Searching library entries by name, framework, architecture, who added them and when.

The filters run in Python over the listing rows every backend returns (`Library.list`), not in
SQL: SQLite's LIKE folds ASCII case only and PostgreSQL's folds none, and collations differ, so
SQL filters would give a team's PostgreSQL library and an investigator's SQLite copy of it
different answers. A listing row is small (no MR/PR), so 10,000 entries filter in milliseconds.
"""

from __future__ import annotations

from typing import Any

FILTERS = ("name", "framework", "architecture", "added_by", "since", "until")


def _has(value: Any, part: str | None) -> bool:
    return part is None or part.casefold() in str(value or "").casefold()


def matching(rows: list[dict], *, name: str | None = None, framework: str | None = None,
             architecture: str | None = None, added_by: str | None = None, since: str | None = None,
             until: str | None = None) -> list[dict]:  # fmt: skip
    """Rows whose name, root class (architecture) and adder contain the given text (case-folded),
    whose framework is the one given, added at or after `since` and before `until` (ISO 8601 UTC
    timestamps or dates, compared as text: `2025-01-31` selects the whole day for `since`)."""
    out = []
    for r in rows:
        fw = (r.get("summary") or {}).get("framework") or "pytorch"  # entries older than the field are PyTorch's
        if not (_has(r["name"], name) and _has(r.get("root_class"), architecture) and _has(r.get("added_by"), added_by)):
            continue
        if framework is not None and fw.casefold() != framework.casefold():
            continue
        if since is not None and (r.get("created") or "") < since:
            continue
        if until is not None and (r.get("created") or "") >= until:
            continue
        out.append(r)
    return out
