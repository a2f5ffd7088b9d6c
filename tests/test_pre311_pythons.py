"""Images of CPython 3.9 and 3.10 processes (issue 17): what differs from the 3.11+ checks in
tests/test_readers.py (sources "py3.9", "py3.10", which run every reader against the process's
ground truth) and tests/test_cross_version.py (calibration, listings).

These predate `Py_Version` and `_Py_DebugOffsets`, merged local tables, co_qualname, managed
dicts and the 3.11 dict keys: the version comes from the `sys.version` banner, code objects are
rebuilt by an interpreter of the image's version from zen's field-level records and compared with
the originals. Skipped where that CPython is not installed (pyenv's, or python3.X on PATH).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, find_python

from zen.cpython.code.codebuild import can_rebuild, code_spec
from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.functions import read_function
from zen.cpython.readers.instances import read_instance
from zen.cpython.runtime import Runtime
from zen.memory import open_space
from zen.runtime.errors import ZenError

MINORS = ["3.8", "3.9", "3.10"]
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); from zen.cpython.code.codebuild_child import main; sys.exit(main(sys.argv[2:]))"
)
# run by the 3.10 interpreter: the rebuilt code objects against the process's own (functions.marshal)
_COMPARE = """
import json, marshal, sys
orig = marshal.load(open(sys.argv[1], "rb"))
built = marshal.load(open(sys.argv[2], "rb"))
index = json.load(open(sys.argv[3]))
same = 0
for i, b in zip(index, built):
    o = marshal.loads(orig[i])
    line = "co_linetable" if hasattr(o, "co_linetable") else "co_lnotab"
    fields = ("co_code", "co_stacksize", line, "co_filename", "co_consts", "co_varnames", "co_cellvars")
    if b == o and all(getattr(b, f) == getattr(o, f) for f in fields):
        same += 1
print(json.dumps({"built": len(built), "equal": same}))
"""


@pytest.fixture(scope="module", params=MINORS)
def old_python(foreign_images, request):
    """(Interpreter, target, minor) of a light target run by CPython 3.9 or 3.10."""
    minor = request.param
    made = foreign_images(minor)
    if made is None:
        pytest.skip(f"no CPython {minor} on this machine")
    target, image = made
    space = open_space(image)
    yield Interpreter.open(space), target, minor
    space.close()


def test_version_from_the_banner(old_python):
    ip, t, minor = old_python
    assert ip.info.version == t.truth["python"] and ip.info.minor == minor
    assert "sys.version banner" in ip.info.how["version"] and not ip.info.warnings
    assert ip.P.source == f"zen:cpython-{minor}-x86_64.json" and "dk_size" in ip.P.dictkeys.fields()


def test_instances_keep_their_dict_at_tp_dictoffset(old_python):
    ip, t, _ = old_python
    plain = read_instance(ip, t.truth["instances"]["plain"]["id"])
    assert plain.storage == "dict-offset" and list(plain.attrs) == list(t.truth["instances"]["plain"]["attrs"])


def test_frames_and_locals(old_python):
    ip, t, _ = old_python
    heap = Heap(ip)
    frames = heap.threads()[0].frames
    assert [f.get("qualname") for f in frames][:2] == ["main", "<module>"]
    assert "function" not in frames[0]  # 3.10 frames do not know their function
    locs = heap.frame_locals(frames[0])
    assert {"truth", "instances"} <= set(locs) and ip.kind(locs["truth"]) == "dict"


def test_code_objects_rebuilt_by_310_equal_the_originals(old_python, tmp_path):
    """Every function's code object, rebuilt by a CPython of the image's version from what zen read,
    equals the original (==, and bytecode, stack size, line table, file name, constants, local names)."""
    ip, t, minor = old_python
    assert not can_rebuild(ip)  # zen's own interpreter cannot: another version's bytecode
    truth = t.truth["all_functions"]
    specs, index, failures = [], [], []
    for i, e in enumerate(truth):
        try:
            specs.append(code_spec(ip, read_function(ip, e["id"]).code))
            index.append(i)
        except ZenError as exc:
            failures.append((e["qualname"], str(exc)))
    assert len(truth) > 1000 and len(specs) / len(truth) >= 0.999, failures[:5]
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    (tmp_path / "index.json").write_text(json.dumps(index))
    exe = find_python(minor)
    built = tmp_path / "built.marshal"
    res = subprocess.run([exe, "-I", "-c", _CHILD, str(REPO / "src"), str(tmp_path / "specs.json"), str(built)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    args = [str(t.outdir / "functions.marshal"), str(built), str(tmp_path / "index.json")]
    res = subprocess.run([exe, "-I", "-c", _COMPARE, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    counts = json.loads(res.stdout)
    print(f"\n{len(truth)} functions: {counts['built']} code objects rebuilt by CPython {minor}, {counts['equal']} equal")
    assert counts["built"] == len(specs) and counts["equal"] / len(truth) >= 0.999, counts


def test_code_qualnames_recovered(old_python):
    """Code objects before 3.11 have no co_qualname: functions', MAKE_FUNCTION's and class bodies' give it."""
    ip, t, _ = old_python
    rt = Runtime(ip)
    e = t.truth["functions"]
    quals = {}
    for a in rt.code_addrs:
        ci = rt.code(a)
        if ci is not None and ci.filename.endswith("objects_target.py"):
            quals.setdefault(ci.name, set()).add(ci.qualname)
    assert "Diamond.who" in quals["who"] and "Diamond.Nested" in quals["Nested"]
    assert any(q.endswith(".<locals>.<listcomp>") for q in quals["<listcomp>"])
    assert e["with_everything"]["qualname"] in quals["with_everything"]
