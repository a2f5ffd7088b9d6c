"""Images of CPython 3.12, 3.13 and 3.14 processes, read by zen on its own 3.11 (issues 8, 17).

The object readers and code objects are checked against ground truth in tests/test_readers.py
(sources "py3.13", "py3.14"); here: the shipped profiles are what calibration measures under
those interpreters, the image's own `_Py_DebugOffsets` table is read, cross-checked and wins over
a wrong profile, a corrupt table is ignored, statically linked builds are found, and the same
source compiled by 3.11, 3.13 and 3.14 gives close normalised listings. With the opt-in torch venvs
(tools/torch-venv.sh: torch 2.4.1 on 3.8/3.9, 2.13.0 on 3.10/3.13/3.14): the torch layout measured
there is the shipped profile, and family processes under those Pythons are recovered bit-exactly
and attributed as under 3.11.
"""

from __future__ import annotations

import json
import mmap
import shutil
import struct
import subprocess
from importlib import resources

import pytest
from conftest import FOREIGN, all_pythons, find_python, foreign_python, python_cache, recovered, start_target, zen
from rapidfuzz import fuzz

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.layout.debug_offsets import read_debug_offsets
from zen.cpython.layout.profile import load_profile, parse_profile
from zen.cpython.layout.releases import resolve_release, variant_between
from zen.cpython.program.programmatic import listing_of
from zen.cpython.readers.functions import read_function
from zen.cpython.runtime import Runtime
from zen.memory import open_space
from zen.runtime.errors import ObjectError


def _foreign(foreign_images, minor):
    made = foreign_images(minor)
    if made is None:
        pytest.skip(f"no CPython {minor} could be found or built (tools/build-python.sh {minor})")
    return made


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.12", *FOREIGN])
def test_calibration_reproduces_shipped_profile(minor, tmp_path):
    """Every release of `minor` found here calibrates to the shipped profile resolved for that exact
    release (its patch-release variant, if any): a user's test run does not depend on which patch
    release is installed, and an image of that release is read with its own layout (issue 17)."""
    exes = all_pythons(minor)
    if minor in FOREIGN and (built := foreign_python(minor)):
        exes.setdefault(subprocess.run([built, "-c", "import platform; print(platform.python_version())"],
                                       capture_output=True, text=True).stdout.strip(), built)  # fmt: skip
    if not exes:
        pytest.skip(f"no CPython {minor} on this machine")
    shipped = json.loads(resources.files("zen.cpython.layout").joinpath("profiles", f"cpython-{minor}-x86_64.json").read_text())
    for release, exe in sorted(exes.items()):
        out = tmp_path / f"{release}.json"
        res = zen("profile", "python", "--python", exe, "-o", out)
        assert f"calibrated CPython {release}:" in res.stdout
        measured = json.loads(out.read_text())
        expected, why = resolve_release(shipped, release)
        missing = variant_between(expected, measured)
        assert not missing, f"CPython {release} ({exe}) differs from the shipped {minor} profile ({why}): {missing}"
        for key in ("structs", "constants", "opcodes", "set_dummy_type_name"):
            assert measured[key] == expected[key], (release, key)
        assert set(measured["provenance"]) == set(expected["provenance"]), release
        assert load_profile(minor, release).why == why and release in why


@pytest.mark.parametrize("minor", FOREIGN)
def test_debug_offsets_agree_with_calibration(foreign_images, minor):
    t, image = _foreign(foreign_images, minor)
    with open_space(image) as space:
        ip = Interpreter.open(space)
        d = ip.info.debug_offsets
        assert d is not None and d["version"] == ip.info.hexversion and not d["free_threaded"]
        assert d["checked"] >= 39 and d["mismatches"] == [], d
        assert not any("DebugOffsets" in w for w in ip.info.warnings)
        # fields the table gives directly, independent of the profile
        table = read_debug_offsets(space, ip.info.runtime, minor)
        assert table.fields["interpreter_state.threads_head"] == ip.P.interp.threads_head
        assert table.fields["code_object.co_code_adaptive"] == ip.P.code.co_code_adaptive


@pytest.mark.parametrize("minor", FOREIGN)
def test_image_table_wins_over_a_wrong_profile(foreign_images, minor):
    """A profile that is wrong where the table speaks (a patched build, say) is corrected."""
    t, image = _foreign(foreign_images, minor)
    data = json.loads(resources.files("zen.cpython.layout").joinpath("profiles", f"cpython-{minor}-x86_64.json").read_text())
    wrong = {("interp", "threads_head"): 8, ("code", "co_qualname"): 16, ("tuple", "ob_item"): 32}
    for (sname, fname), delta in wrong.items():
        data["structs"][sname]["fields"][fname][0] += delta
    bad = parse_profile(data, "wrong.json")
    with open_space(image) as space:
        ip = Interpreter.open(space, profile=bad)
        d = ip.info.debug_offsets
        assert {m["field"] for m in d["mismatches"]} == {f"{s}.{f}" for s, f in wrong} and d["applied"]
        assert any("disagrees with the image's _Py_DebugOffsets on 3 of" in w for w in ip.info.warnings)
        assert ip.P.source.endswith("+ _Py_DebugOffsets of the image") and bad.interp.threads_head != ip.P.interp.threads_head
        # with the image's values, threads, functions and tuples read right again
        assert [f.get("qualname") for f in Heap(ip).threads()[0].frames][:2] == ["main", "<module>"]
        e = t.truth["functions"]["with_everything"]
        assert read_function(ip, e["id"]).qualname == "with_everything"
        assert repr(ip.value(t.truth["values"]["tuple"]["id"])) == t.truth["values"]["tuple"]["repr"]


@pytest.mark.parametrize("minor", FOREIGN)
def test_corrupt_debug_offsets_table_is_ignored(foreign_images, minor, tmp_path):
    t, image = _foreign(foreign_images, minor)
    with open_space(image) as space:
        ip = Interpreter.open(space)
        runtime = ip.info.runtime
        hexversion = ip.info.hexversion
    copy = tmp_path / "corrupt.core"
    shutil.copyfile(image, copy)
    with open(copy, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        pos = mm.find(b"xdebugpy" + struct.pack("<Q", hexversion))
        assert pos > 0
        # runtime_state.interpreters_head (header: cookie, version, free_threaded, size, finalizing)
        mm[pos + 40 : pos + 48] = struct.pack("<Q", 1 << 60)
    try:
        with open_space(copy) as space:
            ip = Interpreter.open(space)
            assert ip.info.runtime == runtime
            assert "problems" in ip.info.debug_offsets and "implausible offsets" in ip.info.debug_offsets["problems"][0]
            assert any("_Py_DebugOffsets table ignored" in w for w in ip.info.warnings)
            assert ip.P.source == load_profile(minor).source  # the shipped profile, untouched
            assert len(Heap(ip).threads()) == 1
    finally:
        copy.unlink()


@pytest.mark.parametrize("minor", FOREIGN)
def test_statically_linked_build(minor, workdir):
    """python3.X with libpython linked in (no libpython3.X.so mapped): found by the executable's
    symbols, cross-checked with its table, objects read right."""
    built = python_cache() / f"{minor}-static" / "bin" / f"python{minor}"
    if not (built.is_file() and (built.parent.parent / ".zen-build-ok").is_file()):
        pytest.skip(f"no static CPython {minor} build (tools/build-python.sh {minor} static)")
    t = start_target("objects_target.py", workdir / f"static-{minor}", "--light", python=str(built))
    img = workdir / f"static-{minor}.core"
    try:
        zen("acquire", "--pid", t.pid, "-o", img, "--lean")
    finally:
        t.stop()
    try:
        with open_space(img) as space:
            ip = Interpreter.open(space)
            assert ip.info.static_build and ip.info.version == t.truth["python"]
            assert ip.info.debug_offsets["checked"] >= 39 and ip.info.debug_offsets["mismatches"] == []
            for name in ("int_huge_neg", "str_latin1", "dict_general", "bytes_big", "tuple"):
                entry = t.truth["values"][name]
                assert repr(ip.value(entry["id"])) == entry["repr"], name
    finally:
        img.unlink(missing_ok=True)


def _listings(image) -> dict:
    """(qualname, first line) -> normalised listing of every code object compiled from the
    target's own file: identical source in every version."""
    with open_space(image) as space:
        rt = Runtime(Interpreter.open(space))
        out = {}
        for a in rt.code_addrs:
            ci = rt.code(a)
            if ci is not None and ci.filename.endswith("objects_target.py"):
                out[(ci.qualname, ci.firstlineno)] = listing_of(rt, ci)
        return out


def test_listings_of_identical_source_across_versions(foreign_images, torch_target_images, light_target, workdir):
    """The IBSS of a function with itself compiled by another minor version: as close to 1 as the
    normalisation gets (3.12+ inlines comprehensions, which no renaming undoes)."""
    base = workdir / "light-3.11.core"
    zen("acquire", "--pid", light_target.pid, "-o", base, "--lean")
    images = {"3.11": base}
    for minor in ("3.8", "3.9", "3.10", "3.12", *FOREIGN):
        made = foreign_images(minor)
        if made is not None:
            images[minor] = made[1]
    if len(images) < 2:
        pytest.skip("no foreign CPython to compare with")
    listings = {v: _listings(p) for v, p in images.items()}
    base.unlink()
    report = {}
    for minor in images:
        if minor == "3.11":
            continue
        keys = sorted(set(listings["3.11"]) & set(listings[minor]))
        assert len(keys) >= 40
        texts = [("\n".join(listings["3.11"][k]), "\n".join(listings[minor][k])) for k in keys]
        scores = [1.0 if a == b else fuzz.ratio(a, b) / 100 for a, b in texts]
        exact = sum(a == b for a, b in texts)
        report[minor] = (len(keys), exact, sum(scores) / len(scores), min(scores))
        print(f"\n3.11 vs {minor}: {len(keys)} code objects, {exact} identical listings, mean IBSS "
              f"{sum(scores) / len(scores):.4f}, min {min(scores):.4f}")  # fmt: skip
        assert exact / len(keys) >= 0.7 and sum(scores) / len(scores) >= 0.94, report[minor]
        # a function whose body has no comprehension reads the same in every version
        assert (
            listings["3.11"][("with_everything", _line(listings["3.11"], "with_everything"))]
            == listings[minor][("with_everything", _line(listings[minor], "with_everything"))]
        )
        if minor in ("3.8", "3.9", "3.10"):  # tuple assignments: swaps 3.11 makes static
            assert (
                listings["3.11"][("swapping", _line(listings["3.11"], "swapping"))]
                == listings[minor][("swapping", _line(listings[minor], "swapping"))]
            )


def _line(listings: dict, qualname: str) -> int:
    return next(line for q, line in listings if q == qualname)


def torch_python(minor: str) -> str | None:
    """A CPython `minor` with its pinned torch (tools/torch-venv.sh; opt-in: 2.5-4.5 GB of CUDA wheels)."""
    venv = python_cache() / f"{minor}-torch"
    exe = venv / "bin" / "python"
    return str(exe) if exe.is_file() and (venv / ".zen-torch-ok").is_file() else None


def torch_pin(minor: str) -> str:
    """The torch tools/torch-venv.sh installs for `minor`: 2.4.1 where 2.13.0 has no wheel (3.8, 3.9)."""
    return "2.4.1" if minor in ("3.8", "3.9") else "2.13.0"


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", *FOREIGN])
def test_torch_calibration_reproduces_shipped_profile(minor, tmp_path):
    """`zen profile torch` under another Python's torch measures the layout zen ships for that torch minor
    (2.4 from 3.8/3.9, 2.13 elsewhere): the torch layout does not depend on the Python version or on
    the CUDA build (the shipped 2.13 profile was measured on the CPU build under 3.11)."""
    exe = torch_python(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} with torch {torch_pin(minor)} (tools/torch-venv.sh {minor})")
    out = tmp_path / "torch.json"
    zen("profile", "torch", "--python", exe, "-o", out)
    measured = json.loads(out.read_text())
    torch_minor = ".".join(torch_pin(minor).split(".")[:2])
    assert measured["torch"]["minor"] == torch_minor and measured["torch"]["python"].startswith(minor + ".")
    shipped_file = resources.files("zen.frontends.pytorch") / "profiles" / f"torch-{torch_minor}-x86_64.json"
    shipped = json.loads(shipped_file.read_text())
    for key in ("structs", "constants", "dtypes", "device_types"):
        assert measured[key] == shipped[key], key


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", *FOREIGN])
@pytest.mark.parametrize("family,models", [("convnet", ("convnet_se", "convnet_wide")), ("gptmini", ("gptmini_lora",))])
def test_family_from_foreign_image_attributes_like_311(family_images, base_library, workdir, family, models, minor):
    """The same family process under 3.8, 3.9, 3.10, 3.13 or 3.14 (torch 2.4.1 on 3.8/3.9, whose layout
    profile differs from 2.13's): every tensor bit-exact against the state_dict that process saved, the
    model-specific code equal to what the process says it is, the same data-flow graph, each fork
    attributed to the same base as from the 3.11 image, and the score drop the version change causes,
    printed. (GPTMini's __init__ holds a list comprehension: a nested code object in 3.11, inlined
    from 3.12.)"""
    import torch
    from safetensors.torch import load_file
    from test_code_recovery import compare

    exe = torch_python(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} with torch {torch_pin(minor)} (tools/torch-venv.sh {minor})")
    tag = minor.replace(".", "")
    t = start_target("family_target.py", workdir / f"{family}-{tag}-target", family, "--src", str(workdir / "families-src"),
                     python=exe)  # fmt: skip
    img = workdir / f"{family}-{tag}.core"
    try:
        zen("acquire", "--pid", t.pid, "-o", img, "--lean")
    finally:
        t.stop()
    img11, t11 = family_images[family]
    drops = {}
    try:
        for name in models:
            case13, mr13, manifest, _ = recovered(img, t, name, workdir)
            assert manifest["python"]["version"].startswith(minor + ".")
            assert minor not in FOREIGN or manifest["python"]["debug_offsets"]["checked"] >= 39  # 3.13+: the image's table
            assert manifest["status"] == "complete", manifest["problems"]
            state = torch.load(t.outdir / f"{name}.state.pt", weights_only=True)  # saved by that process
            weights = load_file(case13 / "weights.safetensors")
            assert sorted(weights) == sorted(state) and len(state) > 5
            assert all(weights[k].dtype == v.dtype and torch.equal(weights[k], v) for k, v in state.items())
            compare(case13, t, name)  # functions, classes, code objects, dependencies: ground truth of that process
            assert not (case13 / "code.marshal").exists()  # its code objects cannot be rebuilt by zen's 3.11
            # data flow from the forward bytecode, decoded with that version's opcode tables: same graph as from 3.11
            mr11 = recovered(img11, t11, name, workdir)[1]
            assert mr13["graph"]["dataflow"] == mr11["graph"]["dataflow"] and not mr13["graph"]["dataflow_skipped"]
            assert len(mr13["graph"]["dataflow"]) > 20
            scores = {}
            for label, case_dir in (("3.11", recovered(img11, t11, name, workdir)[0]), (minor, case13)):
                att = json.loads(zen("attribute", case_dir, "--library", base_library, "--json", "--no-optimal").stdout)
                assert att["attributed"] == family, (label, att["candidates"][:2])
                scores[label] = att["candidates"][0]
            drops[name] = {k: round(scores["3.11"][k] - scores[minor][k], 4) for k in ("ur", "mr", "pr")}
            print(
                f"\n{name}: UR {scores['3.11']['ur']} (3.11 image) vs {scores[minor]['ur']} ({minor} image), drop {drops[name]}"
            )
            assert abs(drops[name]["ur"]) <= 0.02, drops
            # Algorithm 2 from listings alone: the same changes as from the 3.11 image
            diffs = [json.loads(zen("diff", c, "--base", family, "--library", base_library, "--json", "--listing").stdout)
                     for c in (recovered(img11, t11, name, workdir)[0], case13)]  # fmt: skip
            summary = [{k: d[k] for k in ("changed", "added", "unchanged", "classes_added")} for d in diffs]
            assert summary[0] == summary[1] and summary[0]["changed"] + summary[0]["added"] > 0, summary
            assert [f["recovered"] for f in diffs[0]["functions"]] == [f["recovered"] for f in diffs[1]["functions"]]
            res = zen("reuse", case13, "--base", family, "--library", base_library, "-o", workdir / f"reuse-{tag}", check=False)
            assert res.returncode == 2 and f"Python {minor}" in res.stderr and "Traceback" not in res.stderr
    finally:
        img.unlink(missing_ok=True)


def test_incremental_gc_tags_of_314_early_releases(foreign_images, tmp_path):
    """3.14.0-3.14.4 keep a flag in bit 0 of every GC node's _gc_next (the incremental collector):
    the profile variant for those releases masks it. No such interpreter exists here, so the tags
    are set in a copy of a real 3.14 image; its lists read the same under the variant and are
    rejected as broken under the base layout, which allows none."""
    t, image = _foreign(foreign_images, "3.14")
    with open_space(image) as space:
        ip = Interpreter.open(space)
        truth = Heap(ip).gc_generations()
        nodes = [a - ip.P.gc_head.size for gen in truth for a in gen]
        offsets = {}
        for a in nodes:
            c = space.chunk_of(a)
            offsets[a] = c._file_offset + (a - c.start)
    assert sum(map(len, truth)) > 100
    copy = tmp_path / "tagged.core"
    shutil.copyfile(image, copy)
    with open(copy, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        for off in offsets.values():
            (nxt,) = struct.unpack_from("<Q", mm, off)
            struct.pack_into("<Q", mm, off, nxt | 1)
    try:
        variant = load_profile("3.14", "3.14.2")
        assert "3.14.0-3.14.4" in variant.why and variant.c("GC_NEXT_MASK") == (1 << 64) - 2
        with open_space(copy) as space:
            assert Heap(Interpreter.open(space, profile=variant)).gc_generations() == truth
            with pytest.raises(ObjectError, match="GC list broken"):
                Heap(Interpreter.open(space)).gc_generations()
    finally:
        copy.unlink()


@pytest.mark.parametrize("minor", ["3.6", "3.7"])
def test_older_cpython_is_refused_clearly(minor, tmp_path):
    """An image of a CPython older than 3.8 (for which zen has no profile) is found, named and
    refused with exit 4, not misread (issue 17)."""
    exe = find_python(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} on this machine")
    proc = subprocess.Popen([exe, "-c", "import sys; print('READY', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "READY"
        img = tmp_path / "old.core"
        zen("acquire", "--pid", proc.pid, "-o", img, "--lean")
    finally:
        proc.communicate("", timeout=30)
    for cmd in (["info", img], ["recover", img, "-o", tmp_path / "case"]):
        res = zen(*cmd, check=False)
        assert res.returncode == 4, res.stderr
        assert "is not supported: zen reads images of CPython 3.8 to 3.14" in res.stderr and f"CPython {minor}." in res.stderr
        assert "Traceback" not in res.stderr + res.stdout
    assert not (tmp_path / "case").exists()
    img.unlink()
