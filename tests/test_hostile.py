"""Hostile evidence (issue 20): a real process built to break a forensic tool, special files given
as images, and case directories altered or crafted after recovery.

Each failure the abuse run found is reproduced here: non-UTF-8 mapped file names, a module that is
its own child, a 100 MB string attribute, modules nested deeper than the old 256-level cut, keys of
the wrong type in sys.modules, a FIFO as IMAGE, case files of the wrong shape, and weights altered,
deleted or replaced by a symlink to /dev/zero.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import start_target, zen

COMMANDS = ("show", "attribute", "diff", "report", "library-add")


@pytest.fixture(scope="session")
def hostile(workdir):
    """The hostile target imaged once with `zen acquire` (its maps hold a non-UTF-8 file name), plus
    `zen info --pid` on the live process; the target is stopped before the tests read the image."""
    out = workdir / "hostile-target"
    t = start_target("hostile_target.py", out)
    img = workdir / "hostile.core"
    try:
        info = zen("info", "--pid", t.pid, "--no-census", check=False)
        zen("acquire", "--pid", t.pid, "-o", img)
    finally:
        t.stop()
    yield t, img, info
    img.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def hostile_case(hostile, workdir):
    t, img, _ = hostile
    case = workdir / "hostile-case"
    res = zen("recover", img, "-o", case, check=False)
    return case, res


def test_live_process_with_non_utf8_mapping(hostile):
    _, img, info = hostile
    assert info.returncode == 0, info.stderr
    assert "Traceback" not in info.stderr
    assert img.stat().st_size > 0


def test_hostile_model_recovered_bit_exact(hostile, hostile_case):
    t, _, _ = hostile
    case, res = hostile_case
    assert res.returncode == 5, res.stderr  # partial: the 100 MB string was not read
    assert "Traceback" not in res.stderr
    man = json.loads((case / "manifest.json").read_text())
    assert man["status"] == "partial"
    assert man["model"]["class"].endswith(t.truth["class_qualname"])
    assert int(man["model"]["root"], 16) == t.truth["id"]  # found although it is its own child
    assert any(p.startswith("attribute model.blob not read") and "str length" in p for p in man["problems"])
    weights = _weights(case / "weights.safetensors")
    assert len(t.truth["state"]) == 305  # chain of 300 modules (deeper than the old 256 cut) + conv + fc + mark
    for s in t.truth["state"]:
        assert s["key"] in weights, s["key"]
        assert hashlib.sha256(weights[s["key"]]).hexdigest() == s["sha256"], s["key"]
    # a sys.modules name holding an undecodable byte is written as a JSON escape and reads back losslessly
    raw = (case / "pr.json").read_bytes()
    assert b"evil\\udcffname" in raw
    assert "evil\udcffname" in _strings(json.loads(raw))
    # model code naming a global with a lone surrogate in its name: recovered, its listing hashed
    helper = [c for c in json.loads(raw)["codes"] if c["qualname"] == "surrogate_helper"]
    assert helper and "G\ud800" in helper[0]["names"] and len(helper[0]["listing_sha256"]) == 64  # was: exit 70
    assert not Path(t.truth["marker"]).exists(), "a dunder hook of an object in the image was called"
    assert not Path("/tmp/zen-escape").exists()


def _weights(path: Path) -> dict:
    """name -> bytes of every tensor, read with zen's numpy reader: the Rust safetensors loader refuses the
    file (its JSON parser rejects the escape of the buffer name holding a lone surrogate)."""
    from zen.analyze.tensors import TensorFile

    f = TensorFile(path)
    return {k: f.raw(k).tobytes() for k in f.tensors}


def test_rebuilt_hostile_model_runs_bit_identical(hostile, hostile_case, tmp_path):
    """`zen reuse` of the hostile case loads (the buffer named with a lone surrogate included: its file was
    refused by the Rust loader, exit 70) and the rebuilt model gives the deployed output bit for bit. It is its
    own child, so `eval()` would recurse forever, in the deployed process as here: loaded in training mode (its
    layers behave alike in both)."""
    t, _, _ = hostile
    case, _ = hostile_case
    res = zen("reuse", case, "-o", tmp_path / "pkg", check=False)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    probe = (
        "import hashlib, json, sys, torch\n"
        "sys.path.insert(0, sys.argv[1]); import pkg\n"
        "torch.set_num_threads(1)\n"
        "m, rep = pkg.load_with_report(eval_mode=False)\n"
        "with torch.no_grad(): y = m(pkg.inputs()['input_0'])\n"
        "mark = m._buffers['mark\\udc80'].numpy().tobytes()\n"
        "print(json.dumps({'y': y.tolist(), 'mark': hashlib.sha256(mark).hexdigest(), 'n': len(rep['problems'])}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["y"] == t.truth["output"]
    assert got["mark"] == next(s["sha256"] for s in t.truth["state"] if s["key"] == "mark\udc80")
    assert got["n"] == 4  # blob, deep, big_list, big_dict: named, not rebuilt


def _strings(data) -> set[str]:
    out, stack = set(), [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            stack += v
    return out


def test_depth_limit_is_a_recorded_problem(hostile, workdir):
    t, img, _ = hostile
    case = workdir / "hostile-depth"
    res = zen("recover", img, "-o", case, "--limit", "max_module_depth=100", "--limit", "max_str=2e8", check=False)
    assert res.returncode == 5, res.stderr
    man = json.loads((case / "manifest.json").read_text())
    assert man["status"] == "partial"
    assert len(man["problems"]) == 1 and "deeper than max_module_depth=100" in man["problems"][0]
    assert man["limits"]["max_module_depth"] == 100 and man["limits"]["max_str"] == 200_000_000  # recorded (issue 36)
    assert man["limits"]["max_items"] == 1 << 24  # every other limit with its default
    weights = _weights(case / "weights.safetensors")
    assert len(weights) == 5 + 100  # conv and fc (weight, bias), mark + one scale per chain level at depth 1..100
    mr = json.loads((case / "mr.json").read_text())
    assert any(k == "blob" for m in mr["modules"] for k in m["hyperparameters"])  # max_str raised: read
    shutil.rmtree(case)


def test_unknown_limit_is_refused_before_anything_is_written(hostile, tmp_path):
    _, img, _ = hostile
    res = zen("recover", img, "-o", tmp_path / "c", "--limit", "max_bogus=3", check=False)
    assert res.returncode == 2 and "unknown limit" in res.stderr and "max_module_depth" in res.stderr
    assert not (tmp_path / "c").exists()


def test_hostile_names_are_printed_and_reported_safely(hostile_case, tmp_path):
    case, _ = hostile_case
    show = zen("show", case, check=False)
    assert show.returncode == 0, show.stderr
    assert "Hostile<b>bold</b>[/bold]" in show.stdout  # markup in a class name is printed, not interpreted
    html = tmp_path / "r.html"
    rep = zen("report", case, "-o", html, "--no-attribute", check=False)
    assert rep.returncode == 0, rep.stderr
    text = html.read_text()
    assert "<b>bold</b>" not in text and "&lt;b&gt;bold&lt;/b&gt;" in text
    assert "<img src=x" not in text and "<script>alert" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]


# -- case directories altered after recovery ------------------------------------------------------


@pytest.fixture(scope="session")
def intact(hostile_case, workdir):
    """The hostile case and a library holding it (as its own base)."""
    case, _ = hostile_case
    lib = workdir / "hostile-lib.sqlite"
    zen("library", "add", case, "--name", "hostile", "--library", lib)
    return case, lib


def _run(cmd: str, case: Path, lib: Path, tmp: Path) -> subprocess.CompletedProcess:
    args = {"show": ["show", case], "attribute": ["attribute", case, "--library", lib],
            "diff": ["diff", case, "--base", "hostile", "--library", lib, "--listing"],
            "report": ["report", case, "-o", tmp / "r.md", "--library", lib, "--listing"],
            "library-add": ["library", "add", case, "--name", "again", "--library", tmp / "l.sqlite"]}[cmd]  # fmt: skip
    return zen(*args, check=False)


def _copy(case: Path, tmp: Path) -> Path:
    c = tmp / "case"
    shutil.copytree(case, c)
    return c


def _rehash(c: Path, name: str) -> None:
    """Make the manifest agree with an edited file: a crafted case, not a damaged one."""
    man = json.loads((c / "manifest.json").read_text())
    man["files"][name] = hashlib.sha256((c / name).read_bytes()).hexdigest()
    (c / "manifest.json").write_text(json.dumps(man))


TAMPER = {
    "weights-altered": lambda c: (c / "weights.safetensors").write_bytes(
        (b := bytearray((c / "weights.safetensors").read_bytes())) and bytes(b[:-1]) + bytes([b[-1] ^ 1])),
    "weights-deleted": lambda c: (c / "weights.safetensors").unlink(),
    "weights-dev-zero": lambda c: ((c / "weights.safetensors").unlink(), (c / "weights.safetensors").symlink_to("/dev/zero")),
    "ur-null": lambda c: (c / "ur.json").write_text("null"),
}  # fmt: skip


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_altered_case_is_never_accepted_silently(intact, how, tmp_path):
    case, lib = intact
    c = _copy(case, tmp_path)
    TAMPER[how](c)
    reads = {"mr.json", "pr.json"}
    needed = {"show": reads, "attribute": reads, "diff": reads, "report": reads,
              "library-add": reads | {"ur.json", "weights.safetensors"}}  # fmt: skip
    changed = "weights.safetensors" if how.startswith("weights") else "ur.json"
    for cmd in COMMANDS:
        res = _run(cmd, c, lib, tmp_path)
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, (cmd, res.stderr)
        if changed in needed[cmd] or cmd == "library-add":
            assert res.returncode == 2, (cmd, how, res.returncode, res.stderr)
        else:  # results do not depend on the file: produced, with the problem shown, exit 5
            assert res.returncode == 5, (cmd, how, res.returncode, res.stderr)
        assert changed in res.stderr, (cmd, res.stderr)
    md = tmp_path / "r.md"
    assert md.exists() and "THE CASE FILES FAIL VERIFICATION" in md.read_text()


CRAFTED = {
    "mr-list": ("mr.json", "[]"),
    "mr-field-type": ("mr.json", None),  # modules[0].hyperparameters becomes a list
    "pr-deep": ("pr.json", "[" * 200_000 + "]" * 200_000),
    "pr-wrong-kind": ("pr.json", json.dumps({"kind": "zen-pr", "format": 1, "codes": "x"})),
    "manifest-list": ("manifest.json", "[1,2,3]"),
    "manifest-bad-status": ("manifest.json", None),
}


@pytest.mark.parametrize("how", sorted(CRAFTED))
def test_crafted_case_files_fail_clearly(intact, how, tmp_path):
    case, lib = intact
    c = _copy(case, tmp_path)
    name, text = CRAFTED[how]
    if how == "mr-field-type":
        mr = json.loads((c / name).read_text())
        mr["modules"][0]["hyperparameters"] = ["not", "a", "dict"]
        text = json.dumps(mr)
    if how == "manifest-bad-status":
        man = json.loads((c / name).read_text())
        man["status"] = {"complete": True}
        text = json.dumps(man)
    (c / name).write_text(text)
    if name != "manifest.json":
        _rehash(c, name)
    for cmd in COMMANDS:
        res = _run(cmd, c, lib, tmp_path)
        assert res.returncode == 2, (cmd, how, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, (cmd, res.stderr)
        assert name in res.stderr, (cmd, res.stderr)
    if how == "mr-field-type":
        assert "modules[0].hyperparameters: expected an object, found a list" in res.stderr


def _flip_last_tensor_byte(c: Path) -> None:
    raw = bytearray((c / "weights.safetensors").read_bytes())
    raw[-1] ^= 1
    (c / "weights.safetensors").write_bytes(bytes(raw))


def _absurd_shape(c: Path) -> None:
    mr = json.loads((c / "mr.json").read_text())
    t = next(t for t in mr["tensors"] if t["status"] == "ok")
    t["shape"], t["nbytes"] = [10**12, 10**12], 1728
    (c / "mr.json").write_text(json.dumps(mr))


# Lies: each file replaced by something zen never writes, and the manifest's hash rewritten to match (issue 38).
LIES = {
    "ur-truncated": ("ur.json", lambda c: (c / "ur.json").write_bytes((c / "ur.json").read_bytes()[:100])),
    "ur-deep": ("ur.json", lambda c: (c / "ur.json").write_text("[" * 200_000 + "]" * 200_000)),
    "weights-garbage": ("weights.safetensors", lambda c: (c / "weights.safetensors").write_bytes(os.urandom(5000))),
    "weights-8eib-header": ("weights.safetensors",
                            lambda c: (c / "weights.safetensors").write_bytes(struct.pack("<Q", 8 << 60) + b"{}")),
    "weights-one-bit": ("weights.safetensors", _flip_last_tensor_byte),  # well formed, but not the bytes read from the image
    "mr-absurd-shape": ("mr.json", _absurd_shape),
    "code-random": ("code.marshal", lambda c: (c / "code.marshal").write_bytes(os.urandom(3000))),
    # a code object naming an int: marshal.loads raised SystemError, exit 70 in diff and report (bench/fuzz_cli.py)
    "code-int-name": ("code.marshal", lambda c: (c / "code.marshal").write_bytes(marshal.dumps(
        {"0x1": compile("x", "f", "eval")}).replace(b")\x01\xda\x01x", b")\x01\xe9\x05\x00\x00\x00", 1))),
    "mr-huge-string": ("mr.json", lambda c: (c / "mr.json").write_text(
        (c / "mr.json").read_text().replace('"format"', '"x": "' + "a" * 3_000_000 + '", "format"', 1))),
}  # fmt: skip


@pytest.mark.parametrize("how", sorted(LIES))
def test_lying_case_files_are_caught_although_the_hashes_match(intact, how, tmp_path):
    case, lib = intact
    c = _copy(case, tmp_path)
    name, lie = LIES[how]
    lie(c)
    _rehash(c, name)
    for cmd in COMMANDS:
        res = _run(cmd, c, lib, tmp_path)
        assert res.returncode in (2, 5), (cmd, how, res.returncode, res.stderr[-600:])  # never exit 0 on a lie
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, (cmd, res.stderr)
        assert name in res.stderr, (cmd, how, res.stderr[-600:])
    res = zen("verify-case", c, "--json", check=False)
    got = json.loads(res.stdout)
    assert res.returncode == 1 and not got["ok"] and got["files"][name]["status"] in ("malformed", "inconsistent")
    for n, v in got["files"].items():  # the others are sound (a tensor file cannot agree with a lying mr.json)
        assert n == name or v["status"] in ("ok", "missing") or (name == "mr.json" and v["status"] == "inconsistent"), (n, v)


def test_signed_case_detects_a_rewritten_manifest(intact, tmp_path):
    case, _ = intact
    c = _copy(case, tmp_path)
    key = tmp_path / "lab-key"
    zen("keygen", "-o", key)
    zen("sign", c, "--key", key)
    ok = json.loads(zen("verify-case", c, "--key", f"{key}.pub", "--json").stdout)
    assert ok["ok"] and ok["signature"]["status"] == "valid"
    zen("keygen", "-o", tmp_path / "other")
    res = zen("verify-case", c, "--key", tmp_path / "other.pub", "--json", check=False)
    assert res.returncode == 1 and json.loads(res.stdout)["signature"]["status"] == "untrusted"
    man = json.loads((c / "manifest.json").read_text())
    man["evidence"]["sha256"] = "0" * 64  # a lie about the evidence, every file hash still right
    (c / "manifest.json").write_text(json.dumps(man))
    res = zen("verify-case", c, "--json", check=False)
    assert res.returncode == 1 and json.loads(res.stdout)["signature"]["status"] == "invalid"
    zen("report", c, "-o", tmp_path / "r.md", "--no-attribute", "--listing", check=False)
    assert "signature: **invalid**" in (tmp_path / "r.md").read_text()


def test_missing_manifest_fails_every_command(intact, tmp_path):
    case, lib = intact
    c = _copy(case, tmp_path)
    (c / "manifest.json").unlink()
    for cmd in COMMANDS:
        res = _run(cmd, c, lib, tmp_path)
        assert res.returncode == 2 and "no manifest.json" in res.stderr, (cmd, res.stderr)


def test_schema_checker_agrees_with_jsonschema_on_real_cases(intact):
    """The dataclass-derived checker and the JSON Schema rendered from the same hints accept the
    real case; both reject the same crafted mutation."""
    import jsonschema

    from zen.represent.mr import ModelMR
    from zen.represent.pr import ProgrammaticRepresentation, UnifiedRepresentation
    from zen.represent.schema import CaseFileError, check_record, json_schema

    case, _ = intact
    for name, cls in (("mr.json", ModelMR), ("pr.json", ProgrammaticRepresentation), ("ur.json", UnifiedRepresentation)):
        data = json.loads((case / name).read_text())
        check_record(data, cls, name, ("kind", "format"))
        validator = jsonschema.Draft202012Validator(json_schema(cls))
        assert not list(validator.iter_errors(data)), name
        bad = dict(data)
        first = next(k for k, v in data.items() if isinstance(v, list))
        bad[first] = {"x": 1}
        with pytest.raises(CaseFileError):
            check_record(bad, cls, name, ("kind", "format"))
        assert list(validator.iter_errors(bad)), name


def test_corrupt_sys_modules_key_skips_only_that_entry(hostile):
    """A key of sys.modules whose object header is garbage is a problem, not the end of the census."""
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter
    from zen.cpython.readers.dicts import read_dict
    from zen.memory import open_space
    from zen.memory.overlay import overlay

    _, img, _ = hostile
    space = open_space(img)
    try:
        ip0 = Interpreter.open(space)
        heap0 = Heap(ip0)
        before = heap0.sys_modules()
        d = ip0.ptr(heap0.interpreter_state() + ip0.P.interp.modules)
        keys = [k for k, _ in read_dict(ip0, d) if ip0.kind(k) == "str"]
        victim = next(k for k in keys if ip0.str(k) == "torch.nn.modules.linear")
        patched = overlay(space, {victim + 8: (0xDEAD_BEEF_0000).to_bytes(8, "little")})  # its type pointer
        heap = Heap(Interpreter(patched, ip0.info, ip0.P))
        after = heap.sys_modules()
    finally:
        space.close()
    assert set(before) - set(after) == {"torch.nn.modules.linear"}
    assert len(heap.problems) == 1 and "sys.modules entry" in heap.problems[0]


def test_library_import_checks_what_it_is_given(intact, tmp_path):
    case, lib = intact
    export = tmp_path / "export.json"
    zen("library", "export", "-o", export, "--library", lib)
    good = zen("library", "import", export, "--library", tmp_path / "copy.sqlite", check=False)
    assert good.returncode == 0, good.stderr
    data = json.loads(export.read_text())
    data["models"][0]["mr"]["tensors"] = {"not": "a list"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, needle in ((bad, "models[0].mr.tensors: expected a list"), (fifo, "not a regular file")):
        res = zen("library", "import", path, "--library", tmp_path / "other.sqlite", check=False, timeout=60)
        assert res.returncode == 2 and needle in res.stderr, res.stderr


def test_code_stage_failure_keeps_model_and_weights(hostile, tmp_path, monkeypatch):
    """A corrupt object met in the code stage (after the weights are written) costs the code files,
    not the case: MR and weights stay, the case is partial and says why."""
    import zen.recover.run as rec
    from zen.runtime.errors import ObjectError

    def broken(*args, **kwargs):
        raise ObjectError(0xDEAD, "corrupt code object (injected)")

    monkeypatch.setattr(rec, "_write_code", broken)
    t, img, _ = hostile
    res = rec.recover(img, None, tmp_path / "case")
    assert res.status == "partial"
    assert any("code was not recovered" in p and "injected" in p for p in res.problems)
    names = {p.name for p in (tmp_path / "case").iterdir()}
    assert {"manifest.json", "mr.json", "weights.safetensors"} <= names and "pr.json" not in names
    assert len(_weights(tmp_path / "case" / "weights.safetensors")) == len(t.truth["state"])


def test_one_walk_check_never_accepts_what_the_reporting_checks_refuse(intact):
    """`bounded_record` (one walk, no paths: how case files are loaded) says yes only where `check_depth` and
    `check_record` (the walks that name the problem) both pass: on the real case's records and on mutations of
    each kind the limits exist for, placed where the walk takes its shortcuts (lists of strings, flat rows)."""
    import random

    from zen.represent.pr import ProgrammaticRepresentation
    from zen.represent.schema import MAX_DEPTH, MAX_STRING, CaseFileError, bounded_record, check_depth, check_record

    case, _ = intact
    raw = (case / "pr.json").read_bytes()
    data = json.loads(raw)  # each mutation below starts from a fresh parse: cheaper than copy.deepcopy (CI time)
    cls, header = ProgrammaticRepresentation, ("kind", "format")

    def slow_ok(d) -> bool:
        try:
            check_depth(d, "pr.json")
            check_record(d, cls, "pr.json", header)
            return True
        except CaseFileError:
            return False

    assert bounded_record(data, cls, header) and slow_ok(data)
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    long = "a" * (MAX_STRING + 1)
    edits = {
        "deep-context": lambda d: d["context"].__setitem__("x", deep),
        "long-listing-line": lambda d: d["codes"][0]["listing"].append(long),
        "long-key": lambda d: d["context"].__setitem__(long, 1),
        "long-in-flat-row": lambda d: d["system_codes"][0].append(long),
        "long-beside-none": lambda d: d["system_codes"][0].extend([None, 3, long]),
        "bool-for-int": lambda d: d["codes"][0].__setitem__("argcount", True),
        "unknown-field": lambda d: d["codes"][0].__setitem__("zzz", 1),
        "missing-field": lambda d: d["codes"][0].pop("address"),
        "str-for-list": lambda d: d.__setitem__("exclusion", "x"),
        "int-in-strings": lambda d: d["codes"][0]["names"].append(1),
        "deep-in-calls": lambda d: d["codes"][0].__setitem__("calls", {"x": deep}),
    }
    for how, edit in edits.items():
        bad = json.loads(raw)
        edit(bad)
        assert not bounded_record(bad, cls, header) and not slow_ok(bad), how
    rng = random.Random(7)
    values = [None, True, 1, 1.5, "s", [], {}, ["s", 1], {"k": [1]}, deep, long]
    for _ in range(200):  # random values at random places: the one walk never says yes where the others say no
        bad = json.loads(raw)
        node = bad
        for _ in range(rng.randint(1, 4)):
            if isinstance(node, dict) and node:
                node = node[rng.choice(sorted(node))] if rng.random() < 0.7 else node
            elif isinstance(node, list) and node:
                node = node[rng.randrange(len(node))] if rng.random() < 0.7 else node
        if isinstance(node, dict) and node:
            node[rng.choice(sorted(node))] = rng.choice(values)
        elif isinstance(node, list) and node:
            node[rng.randrange(len(node))] = rng.choice(values)
        if bounded_record(bad, cls, header):
            assert slow_ok(bad)
