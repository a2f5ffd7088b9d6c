"""Layout profiles: the shipped one is what calibration measures; missing ones fail clearly."""

from __future__ import annotations

import json
import sys
from importlib import resources

import pytest
from conftest import zen

from zen.cpython.layout.profile import load_profile, parse_profile
from zen.runtime.errors import ProfileError

SHIPPED = f"cpython-{sys.version_info.major}.{sys.version_info.minor}-x86_64.json"


def test_calibration_reproduces_shipped_profile(tmp_path):
    out = tmp_path / "calibrated.json"
    res = zen("profile", "python", "-o", out)
    assert "self-checks passed" in res.stdout
    measured = json.loads(out.read_text())
    shipped_file = resources.files("zen.cpython.layout").joinpath("profiles", SHIPPED)
    if not shipped_file.is_file():
        pytest.skip(f"zen ships no profile for {sys.version_info[:2]}")
    shipped = json.loads(shipped_file.read_text())
    for key in ("structs", "constants", "opcodes", "set_dummy_type_name"):
        assert measured[key] == shipped[key], key
    assert measured["python"]["minor"] == shipped["python"]["minor"]


def test_every_field_has_provenance():
    prof = load_profile(f"{sys.version_info.major}.{sys.version_info.minor}")
    for name, struct in prof.structs.items():
        for field in struct.fields():
            assert f"{name}.{field}" in prof.provenance, f"{name}.{field}"


def test_missing_profile_error():
    with pytest.raises(ProfileError) as exc:
        load_profile("3.99", "3.99.1")
    assert "no layout profile for CPython 3.99" in str(exc.value)
    assert "zen profile python" in exc.value.hint


def test_malformed_profile():
    with pytest.raises(ProfileError, match="not a zen CPython layout profile"):
        parse_profile({"kind": "something else"}, "x.json")
    with pytest.raises(ProfileError, match="malformed"):
        parse_profile({"kind": "cpython-layout", "format": 1, "python": {}}, "x.json")


def test_user_profile_dir_takes_precedence(tmp_path, monkeypatch):
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    shipped = json.loads(resources.files("zen.cpython.layout").joinpath("profiles", SHIPPED).read_text())
    shipped["constants"]["T_OBJECT_EX"] = 16  # unchanged value; the source label tells which file won
    (tmp_path / SHIPPED).write_text(json.dumps(shipped))
    monkeypatch.setenv("ZEN_PROFILE_DIR", str(tmp_path))
    load_profile.cache_clear()
    try:
        assert load_profile(minor).source == str(tmp_path / SHIPPED)
    finally:
        load_profile.cache_clear()
