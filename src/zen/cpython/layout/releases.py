"""Patch-release variants of a layout profile: which CPython release an image runs decides the layout.

A shipped profile is calibrated on one release of a minor version (`python.version`). CPython keeps
its ABI within a minor version, but not every internal layout zen reads: 3.13.0 to 3.13.3, for
instance, store a code object's line-instrumentation data as a plain array of two-byte entries,
while later 3.13 releases prefix it with a width byte (CPython GH-127953). Rather than one file per
patch release, a profile lists `variants`: a closed range of releases and the fields that differ
there, with the evidence. Resolution is pure data: the base profile with the matching variant's
overrides applied, plus a sentence saying why that layout was chosen, which `zen info` prints.
"""

from __future__ import annotations

import copy
import re
from typing import Any

_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def release_tuple(version: str) -> tuple[int, int, int] | None:
    """(3, 13, 2) for "3.13.2" or "3.13.2rc1"; None when only a minor version is known."""
    m = _RELEASE.match(version or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _in_range(rel: tuple[int, int, int], variant: dict) -> bool:
    first, last = release_tuple(variant.get("first", "")), release_tuple(variant.get("last", ""))
    return first is not None and last is not None and first <= rel <= last


def _apply(data: dict, variant: dict) -> dict:
    """`data` with a variant's constant and struct-field overrides (a null constant is removed)."""
    out = copy.deepcopy(data)
    for name, value in variant.get("constants", {}).items():
        if value is None:
            out["constants"].pop(name, None)
        else:
            out["constants"][name] = value
    for sname, spec in variant.get("structs", {}).items():
        st = out["structs"].setdefault(sname, {"fields": {}})
        if "size" in spec:
            st["size"] = spec["size"]
        for fname, fspec in spec.get("fields", {}).items():
            if fspec is None:
                st["fields"].pop(fname, None)
            else:
                st["fields"][fname] = fspec
    for key, text in variant.get("provenance", {}).items():
        if text is None:
            out["provenance"].pop(key, None)
        else:
            out["provenance"][key] = text
    return out


def resolve_release(data: dict[str, Any], version: str | None) -> tuple[dict[str, Any], str]:
    """The profile data for CPython `version` and why it was chosen.

    `version` is the image's exact release when known ("3.13.0"), else its minor version. A release
    inside a variant's range gets that variant; any other release of the minor version gets the
    base layout (calibrated on `python.version`), which is also what an unknown patch release gets.
    """
    base_version = data.get("python", {}).get("version", "?")
    variants = data.get("variants", [])
    rel = release_tuple(version or "")
    if rel is None:
        return data, (
            f"calibrated on {base_version}; the image's exact release is unknown, so the layout of {base_version} is assumed"
        )
    for variant in variants:
        if _in_range(rel, variant):
            why = variant.get("why", "layout differs in these releases")
            return _apply(data, variant), f"release {version} is in {variant['first']}-{variant['last']}: {why}"
    if rel == release_tuple(base_version):
        return data, f"calibrated on {base_version}, the image's release"
    ranges = ", ".join(f"{v.get('first')}-{v.get('last')}" for v in variants)
    outside = f" (outside the variant range{'s' if len(variants) > 1 else ''} {ranges})" if variants else ""
    return data, f"calibrated on {base_version}; release {version} has the same layout{outside}"


def variant_between(base: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The overrides that turn `base` into `measured` (structs and constants), as a variant entry.

    Used to record a newly calibrated release that differs from the shipped profile: the result is
    what goes into the profile's `variants` list once its release range and cause are known.
    """
    variant: dict[str, Any] = {"constants": {}, "structs": {}, "provenance": {}}
    bc, mc = base.get("constants", {}), measured.get("constants", {})
    for name in sorted(set(bc) | set(mc)):
        if bc.get(name) != mc.get(name):
            variant["constants"][name] = mc.get(name)
    bs, ms = base.get("structs", {}), measured.get("structs", {})
    for sname in sorted(set(bs) | set(ms)):
        b, m = bs.get(sname, {}), ms.get(sname, {})
        diff: dict[str, Any] = {}
        if b.get("size") != m.get("size"):
            diff["size"] = m.get("size")
        bf, mf = b.get("fields", {}), m.get("fields", {})
        fields = {f: mf.get(f) for f in sorted(set(bf) | set(mf)) if bf.get(f) != mf.get(f)}
        if fields:
            diff["fields"] = fields
        if diff:
            variant["structs"][sname] = diff
    bp, mp = base.get("provenance", {}), measured.get("provenance", {})
    variant["provenance"] = {k: mp.get(k) for k in sorted(set(bp) | set(mp)) if bp.get(k) != mp.get(k)}
    return {k: v for k, v in variant.items() if v}
