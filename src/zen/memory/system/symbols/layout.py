"""The part of a kernel ISF that zen's direct reader uses, cut once per ISF and cached.

Why: a kernel ISF is 10-100 MB of JSON, and loading it costs 0.6-0.9 s per run (xz, then millions of Python objects),
a third of a whole-machine recovery once the kernel structures are read directly (`kernel_walks`). Those reads
need a few dozen types and a handful of symbols. The layout keeps exactly those: the types named here with every
type they embed by value (a pointer's target is not followed, so `task_struct` does not pull in the kernel), and the
symbols named here, as the ISF has them. It is cut from the ISF the first time (keyed by the ISF's sha256 and
LAYOUT_VERSION) and kept beside the symbol cache; Volatility's full table is loaded only if a reader falls back to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zen.memory.system.symbols.lookup import IsfMatch, load_isf_json, symbol_cache_dir

LAYOUT_VERSION = 1
ROOT_TYPES = (
    "task_struct", "list_head", "cred", "kuid_t", "mm_struct", "mm_context_t", "maple_tree", "maple_node",
    "maple_range_64", "maple_arange_64", "maple_alloc", "vm_area_struct", "file", "path", "dentry", "qstr",
    "dentry_operations", "inode", "vfsmount", "mount", "fs_struct", "signal_struct", "nsproxy", "timekeeper",
)  # fmt: skip
SYMBOLS = (
    "init_task", "init_files", "init_mm", "init_top_pgt", "init_level4_pgt", "__pgtable_l5_enabled",
    "pgtable_l5_enabled", "tk_core", "linux_banner",
)  # fmt: skip
MAX_TYPES = 20_000  # a hostile ISF's embedding graph is cut here


def isf_layout(isf: IsfMatch) -> dict:
    """The layout of this ISF: from the cache when it was cut before, else cut now (and cached when possible)."""
    path = layout_path(isf.sha256)
    try:
        doc = json.loads(path.read_text())
        if _usable(doc, isf.sha256):
            return doc
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    doc = cut_layout(load_isf_json(isf.path))
    doc["isf_sha256"] = isf.sha256
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # only a cache: the next run cuts it again
    finally:
        tmp.unlink(missing_ok=True)  # an interrupted write leaves nothing behind
    return doc


def _usable(doc, sha256: str) -> bool:
    """A cached layout is used only when it is this ISF's and has the shape the readers index (a damaged or edited
    cache file is cut again, not trusted)."""
    return (
        isinstance(doc, dict)
        and doc.get("isf_sha256") == sha256
        and isinstance(doc.get("user_types"), dict)
        and isinstance(doc.get("symbols"), dict)
        and all(isinstance(v, dict) for v in doc["symbols"].values())
    )


def layout_path(sha256: str) -> Path:
    return symbol_cache_dir() / "layouts" / f"{sha256[:64]}-v{LAYOUT_VERSION}.json"


def cut_layout(isf: dict) -> dict:
    """The ROOT_TYPES, the types of the SYMBOLS, and every type those embed by value (struct, union, array
    members), with the SYMBOLS themselves."""
    types = isf.get("user_types") if isinstance(isf.get("user_types"), dict) else {}
    symbols = isf.get("symbols") if isinstance(isf.get("symbols"), dict) else {}
    kept_symbols = {n: symbols[n] for n in SYMBOLS if isinstance(symbols.get(n), dict)}
    todo = list(ROOT_TYPES) + [_name(s.get("type")) for s in kept_symbols.values()]
    kept: dict = {}
    while todo and len(kept) < MAX_TYPES:
        name = todo.pop()
        t = types.get(name) if name else None
        if name in kept or not isinstance(t, dict):
            continue
        kept[name] = t
        fields = t.get("fields")
        for f in fields.values() if isinstance(fields, dict) else ():
            todo.extend(_embedded(f.get("type") if isinstance(f, dict) else None))
    return {"metadata": isf.get("metadata"), "user_types": kept, "symbols": kept_symbols}


def _name(t) -> str:
    return t.get("name", "") if isinstance(t, dict) and isinstance(t.get("name"), str) else ""


def _embedded(t) -> list[str]:
    """Names of the user types a member holds by value (an array's element, nested arrays too; not a pointer's)."""
    for _ in range(16):
        if not isinstance(t, dict) or t.get("kind") != "array":
            break
        t = t.get("subtype")
    if isinstance(t, dict) and t.get("kind") in ("struct", "union"):
        return [_name(t)]
    return []
