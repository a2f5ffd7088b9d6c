"""Patch-release variants of the shipped layout profiles (issue 17): which layout an image of a
given CPython release is read with, and why; the evidence for each variant is in its profile."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from zen.cpython.layout.profile import load_profile
from zen.cpython.layout.releases import release_tuple, resolve_release, variant_between


def shipped(minor: str) -> dict:
    return json.loads(resources.files("zen.cpython.layout").joinpath("profiles", f"cpython-{minor}-x86_64.json").read_text())


@pytest.mark.parametrize(
    "release,layout,stride",
    [("3.13.0", 1, 2), ("3.13.2", 1, 2), ("3.13.2rc1", 1, 2), ("3.13.3", 2, None), ("3.13.15", 2, None), ("3.13.99", 2, None)],
)
def test_313_line_data_layout_by_release(release, layout, stride):
    data, why = resolve_release(shipped("3.13"), release)
    assert data["constants"]["LINE_DATA_LAYOUT"] == layout and data["constants"].get("LINE_DATA_STRIDE") == stride
    assert release in why and (("is in 3.13.0-3.13.2" in why) == (layout == 1))
    prof = load_profile("3.13", release)
    assert prof.c("LINE_DATA_LAYOUT") == layout and prof.why == why


def test_314_incremental_gc_releases():
    base = shipped("3.14")
    for release in ("3.14.0", "3.14.4"):
        data, why = resolve_release(base, release)
        fields = data["structs"]["interp"]["fields"]
        assert [fields[f][0] for f in ("sysdict", "builtins", "modules")] == [7648, 7656, 7664], release
        assert data["constants"]["GC_NEXT_MASK"] == (1 << 64) - 2 and "incremental garbage collector" in why
        # only what the variant names changes
        declared = base["variants"][0]
        assert variant_between(base, data) == {k: declared[k] for k in ("structs", "constants", "provenance")}
    data, why = resolve_release(base, "3.14.5")
    assert data is base and "GC_NEXT_MASK" not in data["constants"] and "outside the variant range 3.14.0-3.14.4" in why


def test_unknown_release_gets_the_base_and_says_so():
    data, why = resolve_release(shipped("3.13"), "3.13")
    assert data["constants"]["LINE_DATA_LAYOUT"] == 2 and "exact release is unknown" in why
    assert release_tuple("3.13") is None and release_tuple("3.12.10") == (3, 12, 10)


def test_user_profiles_exact_release_first(tmp_path, monkeypatch):
    """`zen profile python` names its output after the exact release; that profile wins for images
    of that release, and serves other releases of the minor version only when nothing else does."""
    monkeypatch.setenv("ZEN_PROFILE_DIR", str(tmp_path))
    mine = shipped("3.12")
    mine["python"]["version"] = "3.12.7"
    (tmp_path / "cpython-3.12.7-x86_64.json").write_text(json.dumps(mine))
    load_profile.cache_clear()
    try:
        exact = load_profile("3.12", "3.12.7")
        assert exact.source == str(tmp_path / "cpython-3.12.7-x86_64.json") and "release 3.12.7 itself" in exact.why
        assert load_profile("3.12", "3.12.1").source == "zen:cpython-3.12-x86_64.json"  # shipped beats another release
        # a minor version zen ships no profile for (3.7): a user's profile of another release serves
        old = {**mine, "python": {**mine["python"], "version": "3.7.16", "minor": "3.7"}}
        (tmp_path / "cpython-3.7.16-x86_64.json").write_text(json.dumps(old))
        other = load_profile("3.7", "3.7.17")
        assert other.source.endswith("cpython-3.7.16-x86_64.json") and "calibrated on 3.7.16" in other.why
    finally:
        load_profile.cache_clear()
