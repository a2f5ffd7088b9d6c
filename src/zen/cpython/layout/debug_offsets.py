"""Reader for `_Py_DebugOffsets`: the offsets table CPython 3.13+ keeps at the start of `_PyRuntime`.

Why read it when a calibrated profile already has the offsets: the table is written by the very
interpreter that ran in the image, so it is the best evidence there is for the fields it covers
(runtime, interpreter, thread and frame state, code objects, the common builtin types). A
profile calibrated on another build of the same minor version can differ (a patch release, a
distribution patch, a debug build); cross-checking says so, and the image's own table wins for
the fields it covers. It does not cover dict keys, inline values, functions or most of the code
object: those stay measured by calibration.

The field order of each version's table is data (`data/debug_offsets.json`), not code. Every
value read from the image is bounded: a corrupt table is reported and ignored, never applied.
"""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from zen.cpython.layout.profile import Profile
from zen.memory.space import AddressSpace
from zen.runtime.errors import MemoryReadError

COOKIE = b"xdebugpy"
MAX_OFFSET = 1 << 22  # no CPython struct is anywhere near 4 MiB; larger values mean a corrupt table


@lru_cache(maxsize=1)
def _layouts() -> dict:
    text = resources.files("zen.cpython.layout").joinpath("data", "debug_offsets.json").read_text()
    return json.loads(text)


def supported_minors() -> list[str]:
    """Minor versions whose table layout is known (an image of one of them must carry a table)."""
    return sorted(_layouts()["layouts"])


@dataclass
class DebugOffsets:
    """The table as read from one image."""

    address: int
    minor: str
    hexversion: int
    free_threaded: bool
    fields: dict[str, int]  # "section.field" -> value (offsets and sizes)
    problems: list[str] = field(default_factory=list)


@dataclass
class CrossCheck:
    """How a layout profile compares with the image's own table."""

    checked: list[str] = field(default_factory=list)  # profile fields the table covers
    mismatches: list[dict] = field(default_factory=list)  # {"field", "profile", "image"}

    def to_json(self) -> dict:
        return {"checked": len(self.checked), "mismatches": list(self.mismatches)}


def read_debug_offsets(space: AddressSpace, runtime: int, minor: str) -> DebugOffsets | None:
    """The table at `runtime` (the start of `_PyRuntime`), or None when the image has none.

    None also when the version has no known table layout; a table whose values are implausible
    is returned with `problems` filled in, so the caller can report it and not use it."""
    layout = _layouts()["layouts"].get(minor)
    if layout is None:
        return None
    names = list(layout["header"])
    for section, fields in layout["sections"]:
        names += [f"{section}.{f}" for f in fields]
    try:
        raw = space.read(runtime, 8 + 8 * len(names))
    except MemoryReadError:
        return None
    if raw[:8] != COOKIE:
        return None
    values = struct.unpack_from(f"<{len(names)}Q", raw, 8)
    table = dict(zip(names, values))
    hexversion = table.pop("version")
    free = table.pop("free_threaded")
    out = DebugOffsets(runtime, minor, hexversion, bool(free), table)
    found_minor = f"{hexversion >> 24}.{(hexversion >> 16) & 0xFF}"
    if found_minor != minor:
        out.problems.append(f"table says Python {found_minor}, the image's interpreter is {minor}")
    if free not in (0, 1):
        out.problems.append(f"free_threaded flag is {free}")
    bad = [k for k, v in table.items() if v >= MAX_OFFSET and not k.startswith("debugger_support.")]
    if bad:
        out.problems.append(f"{len(bad)} implausible offsets (e.g. {bad[0]} = {table[bad[0]]:#x})")
    return out


def cross_check(table: DebugOffsets, profile: Profile) -> CrossCheck:
    """Compare every profile field the table covers."""
    res = CrossCheck()
    for key, target in sorted(_layouts()["profile_fields"].items()):
        if key not in table.fields:
            continue
        sname, fname = target.split(".")
        st = profile.structs.get(sname)
        if st is None or not st.has(fname):
            continue
        res.checked.append(target)
        mine = st.fields()[fname][0]
        if mine != table.fields[key]:
            res.mismatches.append({"field": target, "table": key, "profile": mine, "image": table.fields[key]})
    return res


def apply(profile: Profile, table: DebugOffsets, check: CrossCheck) -> Profile:
    """A copy of `profile` in which the image's table wins for every mismatched field."""
    if not check.mismatches:
        return profile
    out = copy.deepcopy(profile)
    for m in check.mismatches:
        sname, fname = m["field"].split(".")
        st = out.structs[sname]
        ftype = st._fields[fname][1]
        st._fields[fname] = (m["image"], ftype)
        setattr(st, fname, m["image"])
        st.__dict__.pop("_readers", None)
    out.source = f"{profile.source} + _Py_DebugOffsets of the image"
    return out
