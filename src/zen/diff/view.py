"""The human view of a diff (`zen diff`): per-object changes and unified diffs.

For each changed function: what changed (arguments, locals, names, constants, defaults) and a
unified diff of decompiled source when both sides decompile (depyf, in a child process bounded by
work: zen.diff.decompile), else of the version-normalised listings every case carries. Added
functions are shown whole. Nothing here runs recovered code.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from zen.diff.decompile import DECOMPILE_CALLS, TIMEOUT, decompile_many
from zen.diff.differ import DiffResult


@dataclass
class FunctionView:
    op: str  # "changed" or "added"
    target: str  # where the patch puts it: module:qualname
    recovered: str  # the recovered function: module:qualname
    score: float | None
    changes: dict[str, Any] = field(default_factory=dict)
    shown_as: str = "listing"  # "source" (decompiled) or "listing"
    unified: list[str] = field(default_factory=list)
    note: str | None = None  # why a listing where source was asked for, when a limit decided it

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "note" or v is not None}


def _diff(a: list[str], b: list[str], a_name: str, b_name: str) -> list[str]:
    return list(difflib.unified_diff(a, b, a_name, b_name, lineterm="", n=3))


def function_views(d: DiffResult, rec_code: dict[str, Any], base_code: dict[str, Any] | None, *, decompile: bool = True,
                   timeout: float = TIMEOUT, max_calls: int = DECOMPILE_CALLS) -> list[FunctionView]:  # fmt: skip
    """One view per changed or added function. Source or listing follows from the code and `max_calls`
    alone (the decompiler's work limit); `timeout` is only a safety net (an error when it runs out)."""
    wanted: dict[str, Any] = {}
    if decompile:
        for f in d.changed:
            if base_code and f.base is not None and f.base.address in base_code and f.recovered.address in rec_code:
                wanted["r" + f.recovered.address] = rec_code[f.recovered.address]
                wanted["b" + f.base.address] = base_code[f.base.address]
        for f in d.added + d.added_class_methods:
            if f.recovered.address in rec_code:
                wanted["r" + f.recovered.address] = rec_code[f.recovered.address]
    got = decompile_many(wanted, timeout, max_calls) if wanted else None
    src = got.sources if got else {}
    stopped = got.stopped if got else set()

    def note(*keys: str) -> str | None:
        hit = [k for k in keys if k in stopped]
        return f"depyf stopped at decompile_calls={max_calls:,}: shown as a listing" if hit else None

    out = []
    for f in d.changed:
        target = f"{f.target_module}:{f.target_qualname}"
        rec = f"{f.recovered.module}:{f.recovered.qualname}"
        v = FunctionView("changed", target, rec, round(f.score, 3) if f.score is not None else None, f.changes)
        a, b = src.get("b" + f.base.address), src.get("r" + f.recovered.address)
        if a is not None and b is not None:
            v.shown_as, v.unified = "source", _diff(a.splitlines(), b.splitlines(), f"base/{target}", f"recovered/{rec}")
        else:
            v.unified = _diff(f.base.listing, f.recovered.listing, f"base/{target}", f"recovered/{rec}")
            v.note = note("b" + f.base.address, "r" + f.recovered.address)
        out.append(v)
    for f in d.added + d.added_class_methods:
        target = f"{f.target_module}:{f.target_qualname}"
        rec = f"{f.recovered.module}:{f.recovered.qualname}"
        v = FunctionView("added", target, rec, None)
        s = src.get("r" + f.recovered.address)
        lines = s.splitlines() if s is not None else f.recovered.listing
        v.shown_as = "source" if s is not None else "listing"
        v.note = None if s is not None else note("r" + f.recovered.address)
        v.unified = _diff([], lines, "/dev/null", f"recovered/{rec}")
        out.append(v)
    return out


def change_summary(changes: dict[str, Any]) -> str:
    """One line: `names +foo -bar; consts +'x'; argcount 2->3`."""
    parts = []
    for k, v in changes.items():
        if k == "listing":
            parts.append(f"bytecode ({v['base_lines']}->{v['recovered_lines']} instructions)")
        elif "added" in v:
            items = [f"+{x}" for x in v["added"]] + [f"-{x}" for x in v["removed"]]
            parts.append(f"{k} {' '.join(items[:12])}{' ...' if len(items) > 12 else ''}")
        else:
            parts.append(f"{k} {v['base']}->{v['recovered']}")
    return "; ".join(parts)
