"""Hostile evidence (issue 20): special files given as images, and a core without Python; each must
fail clearly, before anything is written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import case_of, zen


@pytest.mark.parametrize("kind", ["fifo", "chardev", "socket", "dir"])
def test_special_files_are_refused(kind, tmp_path):
    import socket

    path = tmp_path / "image"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        path = Path("/dev/zero")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    else:
        path.mkdir()
    for cmd in (["info", path], ["recover", path, "-o", tmp_path / "case"], ["ps", path], ["objects", path, "--type", "dict"]):
        # a command blocked on the FIFO never returns: the subprocess timeout catches it (no wall-clock
        # assertion beside it: on a loaded machine zen's start alone can take seconds)
        res = zen(*cmd, check=False, timeout=120)
        assert res.returncode == 2, (cmd, res.stderr)
        assert "not a regular file" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "case").exists()


def test_failed_recovery_leaves_no_half_written_case(tmp_path):
    core = tmp_path / "not-python.core"
    # a real core of a process without Python: recovery fails (exit 3) after the case dir exists
    proc = subprocess.Popen(["sleep", "60"])
    try:
        zen("acquire", "--pid", proc.pid, "-o", core)
    finally:
        proc.kill()
        proc.wait()
    res = zen("recover", core, "-o", tmp_path / "case", check=False)
    assert res.returncode == 3, res.stderr
    assert not (tmp_path / "case").exists()
    assert stat.S_ISREG(core.stat().st_mode) and sys.executable


def test_an_input_record_with_a_boolean_shape_is_named_not_a_traceback(family_images, hf_image, workdir, tmp_path):
    """mr.json's input records are free-form (`list[dict]`): one crafted with `"shape": true` and the manifest
    rehashed made every command that checks the case raise TypeError (bench/fuzz.py, case target, seed 1807)."""
    import hashlib
    import json
    import shutil

    c = tmp_path / "case"
    shutil.copytree(case_of("convnet_se", "convnet", family_images, hf_image, workdir), c)
    mr = json.loads((c / "mr.json").read_text())
    mr["inputs"] = [{**(mr["inputs"][0] if mr["inputs"] else {"key": "input_0"}), "shape": True}]
    (c / "mr.json").write_text(json.dumps(mr))
    man = json.loads((c / "manifest.json").read_text())
    man["files"]["mr.json"] = hashlib.sha256((c / "mr.json").read_bytes()).hexdigest()
    (c / "manifest.json").write_text(json.dumps(man))
    res = zen("verify-case", c, "--json", check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-800:]
    got = json.loads(res.stdout)
    assert any("not a list of integers" in r for v in got["files"].values() for r in v.get("reasons", [])), got["files"]
    res = zen("show", c, check=False)
    assert res.returncode in (2, 5) and "Traceback" not in res.stderr, res.stderr[-800:]
    assert "not a list of integers" in res.stderr


def test_a_long_lived_process_keeps_a_few_parsed_case_states(family_images, hf_image, workdir, tmp_path):
    """Each parsed case file was kept for the life of the process, one entry per file state: bench/fuzz.py's 1,800
    altered cases grew it to 16 GB. Now the newest few are kept, and the newest is still served from the cache."""
    import shutil

    from zen.represent import case

    c = tmp_path / "case"
    shutil.copytree(case_of("convnet_se", "convnet", family_images, hf_image, workdir), c)
    for i in range(3 * case.CACHED_STATES):
        os.utime(c / "mr.json", ns=(10**18 + i, 10**18 + i))  # a new file state: parsed again
        first = case.load_mr(c)
        assert case.load_mr(c) is first  # the same state: from the cache
        case.integrity(c, case.load_manifest(c))
    assert len(case._record_cache) <= case.CACHED_STATES and len(case._verdict_cache) <= case.CACHED_STATES


def test_code_check_starts_first_and_leaves_nothing_behind(family_images, hf_image, workdir, tmp_path, monkeypatch):
    """code.marshal's child is started before the other files are hashed and parsed, and answered at the end. A
    code.marshal that turns out altered is never judged by it (the verdict is "altered" alone), and no child or
    scratch directory is left whatever the outcome."""
    import shutil

    from zen.represent import case
    from zen.runtime import childproc

    c = tmp_path / "case"
    shutil.copytree(case_of("convnet_se", "convnet", family_images, hf_image, workdir), c)
    started: list = []
    real = childproc.Started

    class Recording(real):
        def __init__(self, *a, **k) -> None:
            started.append(self)
            super().__init__(*a, **k)

    monkeypatch.setattr(childproc, "Started", Recording)
    sound = case.verdicts(c, case.load_manifest(c), code=True)
    assert all(v.status == "ok" for v in sound.values() if v.status != "missing"), sound
    (c / "code.marshal").write_bytes((c / "code.marshal").read_bytes()[:-1] + b"\0")  # altered, not rehashed
    altered = case.verdicts(c, case.load_manifest(c), code=True)["code.marshal"]
    assert altered.status == "altered" and len(altered.reasons) == 1, altered
    assert len(started) == 2
    for s in started:  # reaped, scratch directory removed
        assert s.proc.returncode is not None and not os.path.exists(s._cwd)


@pytest.mark.parametrize("hierarchy", [[[1, "a", 0]], [[None, None, None]], [["a", "b"]], [[["x"], "a", 0]], "abc"])
def test_a_hand_made_module_graph_is_refused_not_an_internal_error(family_images, hf_image, base_library, workdir,
                                                                   tmp_path, hierarchy):  # fmt: skip
    """mr.json's graph is free-form (`dict[str, Any]`); hierarchy edges with a number, null or list for a name, two
    items, or a string for the list, and the manifest rehashed, made `zen attribute` exit 70 (TypeError or
    ValueError where the graph was built). Random mutation never made one; they were written by hand."""
    import hashlib
    import json
    import shutil

    c = tmp_path / "case"
    shutil.copytree(case_of("convnet_se", "convnet", family_images, hf_image, workdir), c)
    mr = json.loads((c / "mr.json").read_text())
    mr["graph"]["hierarchy"] = hierarchy
    (c / "mr.json").write_text(json.dumps(mr))
    man = json.loads((c / "manifest.json").read_text())
    man["files"]["mr.json"] = hashlib.sha256((c / "mr.json").read_bytes()).hexdigest()
    (c / "manifest.json").write_text(json.dumps(man))
    res = zen("attribute", c, "--library", base_library, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr[-800:]
    assert "mr.json: graph.hierarchy" in res.stderr and "recover it again" in res.stderr


def test_altered_and_malformed_json_give_the_verdicts_of_one_after_the_other(family_images, hf_image, workdir, tmp_path):
    """The JSON files are parsed while a thread hashes the files: a pr.json both altered (hash) and malformed
    (content) is reported altered first, then malformed, as when hashing came first; a FIFO in mr.json's place is
    never opened by either (the check returns, saying what it is)."""
    import shutil

    from zen.represent import case

    c = tmp_path / "case"
    shutil.copytree(case_of("convnet_se", "convnet", family_images, hf_image, workdir), c)
    (c / "pr.json").write_bytes(b'{"kind": "zen-pr", "format": 1, "codes": [')
    v = case.verdicts(c, case.load_manifest(c))["pr.json"]
    assert v.status == "altered" and len(v.reasons) == 2 and "altered" in v.reasons[0] and "malformed" in v.reasons[1], v
    (c / "mr.json").unlink()
    os.mkfifo(c / "mr.json")
    got = case.verdicts(c, case.load_manifest(c))
    assert got["mr.json"].status == "missing" and "not a regular file" in got["mr.json"].reasons[0], got["mr.json"]


def test_code_records_are_built_as_their_constructor_builds_them(family_images, hf_image, workdir):
    """pr.json's code records are built without the keyword call: equal to `CodeRecord(**d)` field for field and in
    field order (whatever the order in the file), with fresh default lists, the parsed dict left unchanged, and an
    unknown or missing field refused as the call refuses it."""
    import dataclasses
    import json

    from zen.represent.pr import CodeRecord, Signature, record_from_json

    c = case_of("convnet_se", "convnet", family_images, hf_image, workdir)
    raw = json.loads((c / "pr.json").read_text())["codes"]
    for d in raw:
        want = CodeRecord(**{**d, "signature": Signature(**d["signature"]) if d.get("signature") else None})
        got = record_from_json(d)
        assert got == want and list(vars(got)) == list(vars(want))
        assert vars(got) is not d and (d["signature"] is None or type(d["signature"]) is dict)  # the caller's dict as it was
        shuffled = record_from_json(dict(reversed(d.items())))  # fields in another order: the same record, in field order
        assert shuffled == want and list(vars(shuffled)) == list(vars(want))
    required = [f.name for f in dataclasses.fields(CodeRecord) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]  # fmt: skip
    lean = {k: v for k, v in raw[0].items() if k in required}
    a, b = record_from_json(lean), record_from_json(lean)
    assert a.children == [] and a.children is not b.children and list(vars(a)) == [f.name for f in dataclasses.fields(a)]
    with pytest.raises(TypeError):
        record_from_json({**raw[0], "planted": 1})
    with pytest.raises((TypeError, KeyError)):
        record_from_json({k: v for k, v in raw[0].items() if k != "listing"})
