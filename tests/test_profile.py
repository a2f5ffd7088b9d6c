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


@pytest.mark.parametrize("seed", [984, 2613])
def test_calibration_is_not_misled_by_index_bytes_that_equal_the_log2(seed):
    """CI failed once with "dict keys: log2_index_bytes ambiguous [(9, 32), (36, 32)]": under these string-hash seeds
    (found by search; calibration runs isolated, so CI met one by chance, about 1 in 1,500 on 3.11) a byte inside the
    three probe dicts' indices equals each one's log2 size. The field is looked for in the header only."""
    import os
    import subprocess

    code = "import json; from zen.cpython.calibration.run import calibrate; print(json.dumps(calibrate()['structs']))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONHASHSEED": str(seed)})  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    shipped_file = resources.files("zen.cpython.layout").joinpath("profiles", SHIPPED)
    if shipped_file.is_file():
        assert json.loads(res.stdout) == json.loads(shipped_file.read_text())["structs"]


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
