"""What "no entry half-written" means, checked on a library's tables (any SQL backend).

An entry is whole when its models row decodes (MR, PR, UR), it has exactly two code hashes per code
object (bytecode and listing), its invariants row, references to code bodies that exist, and the
audit row of the write that made it; nothing may refer to an entry that is not there. Every listing hash's
posting (schema 6) holds exactly the entries that store it, sorted, each once.
"""

from __future__ import annotations

import json
import zlib

import numpy as np


def problems(lib) -> list[str]:
    out = []
    audited = {n for (n,) in lib.query("SELECT name FROM audit WHERE action IN ('add', 'replace', 'import')").fetchall()}
    for mid, name, summary, mr, pr, ur in lib.query("SELECT id, name, summary, mr, pr, ur FROM models").fetchall():
        n = json.loads(summary)["code_objects"]
        for what, blob in (("mr", mr), ("pr", pr), ("ur", ur)):
            try:
                json.loads(zlib.decompress(bytes(blob)))
            except (zlib.error, ValueError) as exc:
                out.append(f"{name}: {what} does not decode ({exc})")
        hashes = lib.query("SELECT COUNT(*) FROM code_hashes WHERE model_id=?", (mid,)).fetchone()[0]
        if hashes != 2 * n:
            out.append(f"{name}: {hashes} code hashes for {n} code objects")
        if lib.query("SELECT COUNT(*) FROM invariants WHERE model_id=?", (mid,)).fetchone()[0] != 1:
            out.append(f"{name}: no invariants")
        if n and not lib.query("SELECT COUNT(*) FROM code_body_refs WHERE model_id=?", (mid,)).fetchone()[0]:
            out.append(f"{name}: no code body references")
        if name not in audited:
            out.append(f"{name}: no audit row")
    for table in ("code_hashes", "invariants", "code_body_refs"):
        orphans = lib.query(f"SELECT COUNT(*) FROM {table} WHERE model_id NOT IN (SELECT id FROM models)").fetchone()[0]
        if orphans:
            out.append(f"{orphans} {table} rows of no entry")
    dangling = lib.query("SELECT COUNT(*) FROM code_body_refs r WHERE NOT EXISTS "
                         "(SELECT 1 FROM code_bodies b WHERE b.key = r.body)").fetchone()[0]  # fmt: skip
    if dangling:
        out.append(f"{dangling} code body references to missing bodies")
    return out + posting_problems(lib)


def posting_problems(lib) -> list[str]:
    """Where `listing_postings` differs from the postings the stored rows make."""
    want: dict[str, set] = {}
    for h, m in lib.query("SELECT hash, model_id FROM code_hashes WHERE kind='listing'").fetchall():
        want.setdefault(h, set()).add(m)
    got = {h: np.frombuffer(bytes(b), dtype="<u4").tolist() for h, b in lib.query("SELECT hash, models FROM listing_postings")}
    out = [f"posting of {h[:12]}: {got.get(h)} for entries {sorted(ms)}" for h, ms in want.items() if got.get(h) != sorted(ms)]
    return out + [f"posting of {h[:12]} of no stored row: {ids}" for h, ids in got.items() if h not in want]
