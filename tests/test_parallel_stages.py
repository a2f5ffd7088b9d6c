"""The parts of `zen recover` that run side by side (issue 16) give what they gave run in turn.

* `zen.runtime.forking.Forked`: a forked child's bytes, and the parent's own computation wherever the
  child does not deliver (it raises, dies, hangs, or fork is off);
* `zen.represent.jsontext.compact`: orjson's bytes equal `json.dumps`'s for every float-free value,
  lone surrogates and huge ints included;
* the image digest and the tensor files (`zen.recover.jobs`, forked children): the same files with
  fork off, and a failure of the analysis while they run stops them and leaves no case.

Byte-identity of whole cases with the forked children on and off is checked on a real image in
`test_marshal_canonical.py` (the second recovery there runs with `ZEN_FORK=0`).
"""

from __future__ import annotations

import gc
import json
import os
import random
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zen.represent.jsontext import compact, loads
from zen.runtime import forking
from zen.runtime.forking import Forked

PARENT = os.getpid()


def _pid_bytes() -> bytes:
    return str(os.getpid()).encode()


def test_child_computes_the_result():
    if not forking.enabled():
        pytest.skip("fork is not available on this machine (or one core)")
    job = Forked(_pid_bytes)
    assert job.pid is not None and job.pid != PARENT
    child = job.pid
    assert job.result() == str(child).encode() and job.how == "child"
    # the bytes are taken as soon as the child says they are complete; it is reaped once it has left, by the next job
    # or at zen's exit (`_reap_delivered`), never left a zombie
    deadline = time.monotonic() + 30
    while child in forking._DELIVERED_PIDS and time.monotonic() < deadline:
        forking._reap_delivered()
        time.sleep(0.01)
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped


def test_parent_computes_when_the_child_raises():
    def fn() -> bytes:
        if os.getpid() != PARENT:
            raise ValueError("only in the child")
        return b"parent"

    job = Forked(fn)
    assert job.result() == b"parent" and job.how == "in-process"


def test_parent_computes_when_the_child_dies():
    def fn() -> bytes:
        if os.getpid() != PARENT:
            os._exit(3)
        return b"parent"

    assert Forked(fn).result() == b"parent"


def test_parent_computes_when_the_child_hangs():
    def fn() -> bytes:
        if os.getpid() != PARENT:
            time.sleep(60)
        return b"parent"

    job = Forked(fn, timeout=0.5)
    pid = job.pid
    t = time.monotonic()
    assert job.result() == b"parent"
    assert time.monotonic() - t < 10
    if pid is not None:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_fork_off_computes_in_process(monkeypatch):
    monkeypatch.setenv("ZEN_FORK", "0")
    job = Forked(_pid_bytes)
    assert job.pid is None and job.result() == str(PARENT).encode()


@pytest.mark.parametrize("how", ["cancel", "dropped"])
def test_cancel_or_drop_kills_and_reaps_the_child(how):
    """cancel(), or a job dropped without result() (an error path), leaves no child running or unreaped."""

    def fn() -> bytes:
        time.sleep(60)
        return b""

    job = Forked(fn, fork=True)
    pid = job.pid
    if pid is None:
        pytest.skip("fork failed")
    if how == "cancel":
        job.cancel()
    else:
        del job
        gc.collect()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_child_leaves_without_flushing_the_parents_buffers(tmp_path, capfd):
    """The child must not write what the parent has buffered (a duplicated line on stdout)."""
    print("once", end="", flush=False)
    assert Forked(lambda: b"x", fork=True).result() == b"x"
    print(flush=True)
    assert capfd.readouterr().out.count("once") == 1


def test_child_with_a_busy_thread_in_the_parent():
    """The tensor writer and image hasher threads run while children fork: a thread holding the
    GIL-free hash and a file lock must not stop the child."""
    import hashlib

    stop = threading.Event()

    def busy() -> None:
        h = hashlib.sha256()
        block = bytes(1 << 20)
        while not stop.is_set():
            h.update(block)

    th = threading.Thread(target=busy, daemon=True)
    th.start()
    try:
        results = [Forked(lambda: hashlib.sha256(b"abc").hexdigest().encode(), timeout=30).result() for _ in range(20)]
    finally:
        stop.set()
        th.join()
    assert set(results) == {hashlib.sha256(b"abc").hexdigest().encode()}


def _core_sets() -> tuple[frozenset[int], frozenset[int]]:
    """(every core this process may use, its children's), or skip where children are not kept off one."""
    if not forking.enabled() or not hasattr(os, "sched_getaffinity"):
        pytest.skip("fork or CPU affinity is not available on this machine (or one core)")
    from zen.runtime import affinity

    sets = affinity._cpu_sets()
    if sets is None:
        pytest.skip("no core to keep for the parent")
    return sets


def _affinity_once_widened() -> bytes:
    """In a child: its CPU set as soon as it is more than the children's (the parent waits), at most 30 s."""
    _, children = _core_sets()
    deadline = time.monotonic() + 30
    while (now := frozenset(os.sched_getaffinity(0))) == children and time.monotonic() < deadline:
        time.sleep(0.01)
    return ",".join(map(str, sorted(now))).encode()


def test_children_keep_off_the_parents_core_until_it_waits(tmp_path):
    """A child runs on every core but one while the parent works (the parent never waits for a core: measured
    0.3-0.56 s of a GPT-2 recovery before), and on every core while the parent waits for a child; a child the
    parent is not waiting for keeps off its core again afterwards."""
    allowed, children = _core_sets()
    assert frozenset(os.sched_getaffinity(0)) == allowed  # the parent itself is never confined
    marker = tmp_path / "go"

    def other() -> bytes:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return b"done"

    b = Forked(other, fork=True)
    a = Forked(_affinity_once_widened, fork=True)
    if a.pid is None or b.pid is None:
        pytest.skip("fork failed")
    assert frozenset(os.sched_getaffinity(a.pid)) == children  # confined from the fork on
    assert frozenset(os.sched_getaffinity(b.pid)) == children
    seen = a.result()  # while this process waits, the child may use its core
    assert a.how == "child" and seen == ",".join(map(str, sorted(allowed))).encode()
    assert frozenset(os.sched_getaffinity(b.pid)) == children  # the wait is over: off the parent's core again
    marker.touch()
    assert b.result() == b"done"
    assert frozenset(os.sched_getaffinity(0)) == allowed


def test_widen_and_narrow_reach_every_thread_of_a_child():
    """Affinity is per thread: the tensor writer hashes in a pool of threads, which must follow its main thread."""
    import subprocess
    import sys

    allowed, children = _core_sets()
    from zen.runtime import affinity

    code = (
        "import threading, time\n"
        "for _ in range(2): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) == 3
        affinity.narrow([proc.pid])
        assert {frozenset(os.sched_getaffinity(t)) for t in tids} == {children}
        affinity.widen([proc.pid])
        assert {frozenset(os.sched_getaffinity(t)) for t in tids} == {allowed}
    finally:
        proc.kill()
        proc.wait()


# -- compact JSON ------------------------------------------------------------------------------
_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates, controls
_leaf = st.none() | st.booleans() | st.integers(min_value=-(1 << 80), max_value=1 << 80) | _text
_value = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_text, inner, max_size=5), max_leaves=30)


def _reference(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


@settings(max_examples=400, deadline=None)
@given(_value)
def test_compact_equals_json(obj):
    assert compact(obj) == _reference(obj)


def test_compact_corner_cases():
    for obj in (["\udc80\udcff", "a\x00\x1f\x7f\u2028\u2029\ufeff"], {"k": (1, 2, "t")}, [1 << 64, -(1 << 63)], {"": None},
                ["\"\\/\b\f\n\r\t"], [2**63 - 1, -(2**63)]):  # fmt: skip
        assert compact(obj) == _reference(obj)


_json_value = st.recursive(_leaf | st.floats(), lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(_text, inner, max_size=5), max_leaves=30)  # fmt: skip


def _same(a, b) -> bool:
    """Equal, floats bit for bit (NaN included), and of the same types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=400, deadline=None)
@given(_json_value)
def test_loads_equals_json(obj):
    """`jsontext.loads` (orjson, json where orjson refuses) reads what json wrote exactly as json reads it."""
    text = json.dumps(obj, ensure_ascii=False)
    assert _same(loads(text), json.loads(text))
    raw = text.encode("utf-8", "surrogatepass")
    assert _same(loads(raw), json.loads(raw))


def test_loads_corner_cases():
    rng = random.Random(3)
    doubles = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20000)]
    texts = [json.dumps(doubles), "[1e400, -1e400, NaN, Infinity]", '["\\ud800", "\\udfff x"]', "[18446744073709551616]",
             "[" * 200 + "]" * 200, '{"a": 1, "a": 2}',
             '{"h": "ab1234567890123456789012", "x":\n  -9223372036854775809}', '["x"' + ',"1234567890123456789012"' * 9000 + ']',
             "18446744073709551615", '["\\u00e9", "\u00e9", 9223372036854775807, -9223372036854775808]',
             "[0.1, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308]"]  # fmt: skip
    for text in texts:
        assert _same(loads(text), json.loads(text)), text[:60]
    for bad in ("[1,", "{'a': 1}", "\ufeff[1]", ""):
        with pytest.raises(ValueError):
            loads(bad)
    with pytest.raises(RecursionError):  # past orjson's 1,024 levels json decides, as before: too deep for Python
        loads("[" * 200_000 + "]" * 200_000)


def test_compact_of_a_real_pr(hf_image, workdir):
    """Every record of a real PR (written by `compact`) reads back and re-encodes by `json` to the same bytes."""
    from conftest import recovered

    image, t = hf_image
    case, _, _, _ = recovered(image, t, "gpt2", workdir)
    raw = (case / "pr.json").read_bytes()
    pr = json.loads(raw)
    codes = pr.pop("codes")
    assert len(codes) > 500
    head = _reference(pr)
    assert raw == head[:-1] + b',"codes":[\n' + b",\n".join(_reference(c) for c in codes) + b"\n]}\n"


def test_as_plain_is_asdict(hf_image, workdir):
    """`jsontext.as_plain` (what MR and UR files are written from) equals `dataclasses.asdict`, value for value and
    type for type, on a real GPT-2 case's MR and UR and on hand-made values: namedtuples, tuples, sets and bytes
    (deep-copied, not shared), nested dataclasses in dicts, non-str keys."""
    import dataclasses
    from collections import namedtuple

    from conftest import recovered

    from zen.represent import case as case_files
    from zen.represent.jsontext import as_plain

    image, t = hf_image
    case, _, _, _ = recovered(image, t, "gpt2", workdir)
    Point = namedtuple("Point", "x y")

    @dataclasses.dataclass
    class Inner:
        p: Point
        s: set

    @dataclasses.dataclass
    class Outer:
        a: list
        b: dict
        c: tuple
        d: bytes | None

    made = Outer([Inner(Point(1, [2.5]), {3}), None], {1: Inner(Point("x", ()), set()), "k": [True, {"n": None}]},
                 (Point(0, 0), "s"), b"raw")  # fmt: skip
    for obj in (case_files.load_mr(case), case_files.load_ur(case), made):
        plain, ref = as_plain(obj), dataclasses.asdict(obj)
        assert plain == ref and repr(plain) == repr(ref)
    plain = as_plain(made)
    assert plain["a"][0]["s"] is not made.a[0].s and plain["a"][0]["p"].y is not made.a[0].p.y  # copies, as asdict


# -- the jobs beside the analysis ----------------------------------------------------------------
def _children() -> list[int]:
    """Processes this one started that are still there (running or not yet reaped)."""
    pid = os.getpid()
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def test_analysis_failure_stops_the_jobs(zoo_image, tmp_path, monkeypatch):
    """A failure in the code stage while the tensors are written and the image hashed: both
    children are stopped and reaped, the case directory is removed, the error is the analysis's."""
    import zen.recover.run as R

    image, t = zoo_image

    class Boom(Exception):
        pass

    def failing(*a, **k):
        raise Boom("analysis failed")

    before = set(_children())
    monkeypatch.setattr(R, "_write_code", failing)
    out = tmp_path / "case"
    with pytest.raises(Boom):
        R.recover(Path(image), None, out)
    assert not out.exists()
    assert set(_children()) <= before
    assert not [th for th in threading.enumerate() if th.name.startswith("zen-")]


def test_jobs_write_the_same_case_with_and_without_fork(zoo_image, tmp_path, monkeypatch):
    """The image digest and the tensor files from forked children equal those written in-process."""
    import zen.recover.run as R

    image, _ = zoo_image
    R.recover(Path(image), None, tmp_path / "forked", rehash=True)  # hashed here, not taken from the digest cache
    monkeypatch.setenv("ZEN_FORK", "0")
    R.recover(Path(image), None, tmp_path / "inline", rehash=True)
    a = json.loads((tmp_path / "forked" / "manifest.json").read_text())
    b = json.loads((tmp_path / "inline" / "manifest.json").read_text())
    assert a["evidence"]["sha256"] == b["evidence"]["sha256"] and len(a["evidence"]["sha256"]) == 64
    assert a["files"] == b["files"]
    for name in a["files"]:
        assert (tmp_path / "forked" / name).read_bytes() == (tmp_path / "inline" / name).read_bytes(), name


def test_code_stage_leaves_no_cycles_for_the_collector(zoo_image, tmp_path, monkeypatch):
    """The code stage's runtime (its caches hold every decoded instruction) is freed by reference
    counting when the stage ends: no cycle through it (the owner index, an encoder and its value
    hook, canonical marshal's emitter) leaves it to a pass of the cyclic collector."""
    import zen.recover.run as R

    image, _ = zoo_image
    monkeypatch.setenv("ZEN_FORK", "0")  # every part of the stage in this process
    gc.collect()
    gc.disable()
    try:
        R.recover(Path(image), None, tmp_path / "case")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = {f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage}
        emitters = [o for o in gc.garbage if getattr(o, "__qualname__", "").startswith("_Rewriter.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert (tmp_path / "case" / "pr.json").is_file() and (tmp_path / "case" / "code.marshal").is_file()
    code_stage = {"zen.cpython.runtime.Runtime", "zen.cpython.owners.OwnerIndex", "zen.cpython.code.instructions.Instruction",
                  "zen.cpython.readers.code.CodeInfo", "zen.cpython.namespaces.NamespaceTable"}  # fmt: skip
    assert not left & code_stage, sorted(left & code_stage)
    assert not emitters


@pytest.mark.parametrize("fork", ["1", "0"])
def test_image_digest(tmp_path, monkeypatch, fork):
    """The image's sha256 from a mapping released block by block (or read, where the file cannot
    be mapped: an empty one), in a child or a thread; a file that goes away is an error, not a crash."""
    import hashlib

    import zen.evidence.image_digest as idg
    from zen.evidence.image_digest import ImageDigest

    monkeypatch.setenv("ZEN_FORK", fork)
    monkeypatch.setattr(idg, "MAP_BLOCK", 1 << 16)  # several blocks
    data = os.urandom((1 << 18) + 123)
    for name, content in (("some", data), ("empty", b"")):
        p = tmp_path / name
        p.write_bytes(content)
        assert ImageDigest(p).result() == (hashlib.sha256(content).hexdigest(), None)
    digest, error = ImageDigest(tmp_path / "gone").result()
    assert digest is None and "No such file" in error
