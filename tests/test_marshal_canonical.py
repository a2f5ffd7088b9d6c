"""Case bytes follow from the image alone, not from the state of the zen process (issue 16).

CPython's marshal writes a back-reference slot for every object whose reference count is above one
and marks a string interned when that object is interned in the writing process; before 3.13 it
writes frozensets in hash order. So `code.marshal` (and the marshal inside `pr.json`) used to change
with how zen was started (`python -m zen` or `python -c`), with the GC on or off, with caches holding
references and with PYTHONHASHSEED. Here the same real image is recovered twice, the second time by
a process that differs in all of these (and computes in-process what the first hands to forked
children), and the files must be byte-identical; the canonical form is
checked against the rule it documents and, for code objects made by other CPython versions, against
those versions' own objects.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import REPO, find_python, model_id, python_cache, recovered

from zen.cpython.code.canonical_marshal import MarshalFormatError, canonical, dumps

# A recovery through the API in a process unlike the CLI's: another hash seed, the GC off from the
# start, every 1-character string and every name of the image's code interned beforehand, every
# code record read and code object rebuilt held by an extra reference until the end, and the code
# stage split as with more than two cores (part of the code records and the class records made as
# a child makes them, encoded and spliced into pr.json; the CLI on two cores makes them all itself).
_OTHER_PROCESS = r"""
import gc, sys
gc.disable()
from pathlib import Path
for c in map(chr, range(256)):
    sys.intern(c)
import zen.recover.code_stage as cs
cs.cores = lambda: 8
import zen.cpython.code.codebuild as cb
import zen.cpython.runtime as rt
from zen.cpython.readers import code as rc
from zen.recover.run import recover
held = []
_read, _rebuild = rc.read_code, cb.rebuild_code
def read_code(ip, addr):
    ci = _read(ip, addr)
    held.append(ci)
    for n in ci.names + ci.localsplusnames:
        sys.intern(n)
    return ci
def rebuild_code(*a, **k):
    code = _rebuild(*a, **k)
    held.append(code)
    return code
rc.read_code = cb.read_code = rt.read_code = read_code
cb.rebuild_code = rebuild_code
res = recover(Path(sys.argv[1]), None, Path(sys.argv[2]), model=sys.argv[3])
print(res.status, len(held))
"""


def _recover_elsewhere(image: Path, out: Path, model: str, seed: str) -> None:
    # ZEN_FORK=0: every part of the code stage computed in this one process (the CLI's recovery
    # hands the system table and code.marshal to forked children: same bytes either way)
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO / "src"), "ZEN_FORK": "0"}
    res = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(image), str(out), model], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stdout.split()[1]) > 1000  # the warm-up really held references


def test_case_bytes_do_not_depend_on_the_zen_process(hf_image, workdir):
    image, t = hf_image
    case, _, manifest, _ = recovered(image, t, "gpt2", workdir)  # `python -m zen recover`, GC on
    other = workdir / "case-gpt2-other-process"
    _recover_elsewhere(image, other, hex(model_id(t, "gpt2")), "12345")
    codes = marshal.loads((case / "code.marshal").read_bytes())
    assert len(codes) > 500 and all(isinstance(c, types.CodeType) for c in codes.values())
    for name in ("code.marshal", "pr.json", "ur.json", "requirements.txt"):
        assert (case / name).read_bytes() == (other / name).read_bytes(), f"{name} differs between the two processes"
    files = json.loads((other / "manifest.json").read_text())["files"]
    assert files["code.marshal"] == manifest["files"]["code.marshal"] and files["pr.json"] == manifest["files"]["pr.json"]


def _interned(s: str) -> bool:
    """Whether this very object is interned here (a fresh equal string interns to it)."""
    return sys.intern("".join(list(s))) is s


def _walk(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _walk(c)


def test_recovered_code_marshal_is_canonical(hf_image, workdir):
    """The rules, checked on zen's real output: rewriting it here (another process, other reference
    counts) is the identity; names, identifier-like strings interned, other strings not; shared
    objects only where equal values recur."""
    image, t = hf_image
    case, _, _, _ = recovered(image, t, "gpt2", workdir)
    data = (case / "code.marshal").read_bytes()
    codes = marshal.loads(data)
    assert canonical(data) == data and dumps(codes) == data
    raw = marshal.dumps(codes)
    assert marshal.loads(canonical(raw)) == codes and canonical(raw) == data
    checked = 0
    for top in codes.values():
        for co in _walk(top):
            for s in (co.co_filename, co.co_qualname):
                identifier = s.isascii() and all(ch.isalnum() or ch == "_" for ch in s)
                if not identifier:
                    assert not _interned(s), s
                    checked += 1
            assert all(_interned(n) for n in co.co_names + co.co_varnames)
    assert checked > 1000


_SET_SOURCE = "def f(x):\n    return x in {'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta'}\n"
_SET_PROGRAM = r"""
import marshal, sys
sys.path.insert(0, sys.argv[1])
from zen.cpython.code.canonical_marshal import dumps
code = compile(sys.argv[2], "m.py", "exec")
canon = dumps(code)
assert marshal.loads(canon) == code
sys.stdout.write(marshal.dumps(code).hex() + " " + canon.hex())
"""


@pytest.mark.parametrize("minor", ["3.8", "3.10", "3.11"])
def test_frozenset_order_does_not_follow_hash_seed(minor):
    """A frozenset constant's items come out in one order whatever the string hash seed: CPython
    3.8-3.10's own marshal writes them in hash order (3.11.7 and later sort them too)."""
    exe = sys.executable if minor == "3.11" else _python(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} here")
    raws, outs = set(), set()
    for seed in ("1", "2", "3", "4"):
        res = subprocess.run([exe, "-c", _SET_PROGRAM, str(REPO / "src"), _SET_SOURCE], capture_output=True,
                             text=True, env={**os.environ, "PYTHONHASHSEED": seed}, check=True)  # fmt: skip
        raw, canon = res.stdout.split()
        raws.add(raw)
        outs.add(canon)
    assert len(outs) == 1
    if minor != "3.11":
        assert len(raws) > 1  # what the canonical form fixes there


# Run by another CPython: compile part of its own standard library, marshal it, and rewrite it in
# the canonical form there (the rule `codebuild_child` applies in the image's own interpreter).
_FOREIGN = r"""
import glob, marshal, sys, sysconfig
sys.path.insert(0, sys.argv[1])
from zen.cpython.code.canonical_marshal import dumps
codes = []
for f in sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:60]:
    try:
        codes.append(compile(open(f, encoding="utf-8").read(), f, "exec"))
    except (SyntaxError, UnicodeDecodeError):
        pass
canon = dumps(codes)
def fields(c):
    if isinstance(c, type(fields.__code__)):
        attrs = [a for a in dir(c) if a.startswith("co_") and a != "co_lnotab" and not callable(getattr(c, a))]
        out = [(a, fields(getattr(c, a))) for a in attrs]
        names = []
        while hasattr(c, "_varname_from_oparg"):
            try:
                names.append(c._varname_from_oparg(len(names)))
            except IndexError:
                break
        return ("code", out, names)
    if isinstance(c, (tuple, list)):
        return (type(c).__name__, [fields(x) for x in c])
    if isinstance(c, frozenset):
        return ("frozenset", sorted(repr(fields(x)) for x in c))
    return (type(c).__name__, repr(c))
back = marshal.loads(canon)
assert back == codes and fields(back) == fields(codes), "canonical bytes load to other code objects"
open(sys.argv[2], "wb").write(marshal.dumps(codes))
open(sys.argv[3], "wb").write(canon)
print(len(codes))
"""


def _python(minor: str) -> str | None:
    built = python_cache() / f"{minor}-shared"
    if (built / ".zen-build-ok").is_file() and (built / "bin" / f"python{minor}").is_file():
        return str(built / "bin" / f"python{minor}")
    return find_python(minor)


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.12", "3.13", "3.14"])
def test_code_objects_of_other_versions(minor, tmp_path):
    """Each version's layout of a code object: the canonical bytes written by that interpreter load
    there to its own code objects, field for field, and zen (3.11) rewriting that interpreter's raw
    marshal gives the same bytes, so code.marshal can be canonicalised on either side."""
    exe = _python(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} here")
    raw, canon = tmp_path / "raw.marshal", tmp_path / "canon.marshal"
    res = subprocess.run([exe, "-I", "-c", _FOREIGN, str(REPO / "src"), str(raw), str(canon)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout) > 40
    version = tuple(int(x) for x in minor.split("."))
    assert canonical(raw.read_bytes(), version) == canon.read_bytes()
    assert canonical(canon.read_bytes(), version) == canon.read_bytes()


@pytest.mark.parametrize(
    "data, why",
    [(b"", "truncated"), (b"i\x05\x00", "ends inside"), (b"z\x05ab", "ends inside"), (b"r\x00\x00\x00\x00", "back-reference"),
     (b"(\xff\xff\xff\x7f", "size"), (b"N\x00", "after"), (b"?", "not one"), (b")\x01" * 300 + b"N", "too deeply")],
)  # fmt: skip
def test_malformed_marshal_data_is_refused(data, why):
    with pytest.raises(MarshalFormatError, match=why):
        canonical(data)


def _shared_bomb(levels: int) -> bytes:
    """A frozenset holding one tuple of `levels` levels, each holding its child twice (the second time as a
    back-reference): a few bytes per level, 2^levels copies of the innermost string once expanded."""
    head = b"".join(bytes([0x29 | 0x80, 2]) for _ in range(levels))  # tuple at depth d takes reference slot d
    leaf = bytes([0x7A | 0x80, 1]) + b"a"  # slot `levels`
    refs = b"".join(b"r" + (levels - lvl + 1).to_bytes(4, "little") for lvl in range(1, levels + 1))
    return b">" + (1).to_bytes(4, "little") + head + leaf + refs


def test_set_items_of_shared_structure_are_bounded():
    """190 bytes took 44 s and gigabytes before the bound (`zen diff` rewrites code found in a case's snapshots)."""
    import time

    t = time.perf_counter()
    with pytest.raises(MarshalFormatError, match="expand past the bound"):
        canonical(_shared_bomb(26))
    assert time.perf_counter() - t < 5
    small = _shared_bomb(6)  # shared, but small: rewritten, and loads as the same value
    assert marshal.loads(canonical(small)) == marshal.loads(small)


def _chained_set(n: int) -> bytes:
    """A frozenset of `n` one-item tuples, each holding the one before it by back-reference: nested 2 deep as
    written, but sorted (longest encoding first) the set is emitted as one chain `n` deep."""
    out = b">" + n.to_bytes(4, "little") + bytes([0x29 | 0x80, 1]) + b"N"
    return out + b"".join(bytes([0x29 | 0x80, 1]) + b"r" + (i - 1).to_bytes(4, "little") for i in range(1, n))


def test_back_references_cannot_nest_past_the_bound():
    """3,000 items raised RecursionError out of the writer (a traceback in `zen diff`); 150 are rewritten."""
    with pytest.raises(MarshalFormatError, match="nested too deeply"):
        canonical(_chained_set(3000))
    assert marshal.loads(canonical(_chained_set(150))) == marshal.loads(_chained_set(150))
