"""`zen drift` (issue 33): weight drift between three memory images of a process learning online.

A real process (tests/targets/drift_target.py) trains without pause; at three instants it stops
between two steps, saves its state_dict and waits while zen acquires it. The drift zen reports
from the three recovered cases must equal the drift computed here, with torch, from the state
dicts the process saved at the same instants; its frozen layer must report exactly 0, the layer
unfrozen after snapshot 1 must first change at snapshot 2. Cases that are not one model, or have
no weights, are refused.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import TARGETS, zen
from safetensors.torch import load_file

SNAPSHOTS = 3


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    """(target dir, [case per snapshot], {"activations": case, "other": case}) of one online-learning process."""
    where = tmp_path_factory.mktemp("drift")
    outdir = where / "target"
    outdir.mkdir()
    proc = subprocess.Popen([sys.executable, str(TARGETS / "drift_target.py"), str(outdir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=outdir)  # fmt: skip

    def say(cmd: str, expect: str) -> None:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        assert line == expect, f"the target answered {line!r} to {cmd!r}"

    images = []
    try:
        assert proc.stdout.readline().strip() == "READY"
        for i in range(SNAPSHOTS):
            say("snap", f"SAVED {i}")
            images.append(where / f"snap{i}.core")
            zen("acquire", "--pid", proc.pid, "-o", images[-1], "--lean")  # while the process is live, stopped between steps
            if i < SNAPSHOTS - 1:
                say("resume", "RESUMED")
    finally:
        proc.stdin.close()
        proc.wait(30)
    cases = []
    for i, image in enumerate(images):
        cases.append(where / f"case{i}")
        zen("recover", image, "-o", cases[-1], "--model", "model")
    others = {}
    for name in ("activations", "other"):
        others[name] = where / f"case_{name}"
        zen("recover", images[0], "-o", others[name], "--model", name)
    for image in images:
        image.unlink()
    yield outdir, cases, others
    shutil.rmtree(where, ignore_errors=True)


def _truth(states: list[dict], keys: list[str]) -> dict:
    """The drift of a group of tensors computed here with torch, in float64, from the saved state dicts."""
    out = []
    for i in range(1, len(states)):
        row = {}
        for label, ref in (("base", 0), ("step", i - 1)):
            a = torch.cat([states[ref][k].double().flatten() for k in keys])
            b = torch.cat([states[i][k].double().flatten() for k in keys])
            changed = sum(int((_bits(states[ref][k]) != _bits(states[i][k])).sum()) for k in keys)
            row[label] = {"l2": float((b - a).norm()), "na": float(a.norm()), "nb": float(b.norm()),
                          "dot": float((a * b).sum()), "changed": changed / a.numel()}  # fmt: skip
        out.append(row)
    first = next((i for i in range(1, len(states)) if any(not torch.equal(_bits(states[i - 1][k]), _bits(states[i][k]))
                                                         for k in keys)), None)  # fmt: skip
    return {"rows": out, "first_changed": first}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _close(a, b) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _check(series: dict, truth: dict) -> None:
    assert series["first_changed"] == truth["first_changed"], series["name"]
    for got, want in zip(series["snapshots"], truth["rows"], strict=True):
        base, step = want["base"], want["step"]
        assert _close(got["l2"], base["l2"]) and _close(got["step_l2"], step["l2"]), (series["name"], got, want)
        assert got["changed"] == base["changed"] and got["step_changed"] == step["changed"], series["name"]
        if base["na"] > 0:
            assert _close(got["relative"], base["l2"] / base["na"])
            assert _close(got["cosine"], base["dot"] / (base["na"] * base["nb"]))


def test_drift_equals_the_drift_of_the_saved_state_dicts(snapshots, tmp_path):
    outdir, cases, _ = snapshots
    states = [load_file(str(outdir / f"snap_{i}.safetensors")) for i in range(SNAPSHOTS)]
    out = tmp_path / "drift"
    res = zen("drift", *cases, "-o", out)
    doc = json.loads((out / "drift.json").read_text())
    assert [s["case"] for s in doc["snapshots"]] == [str(c.resolve()) for c in cases] and doc["problems"] == []
    assert {t["name"] for t in doc["tensors"]} == set(states[0])
    for t in doc["tensors"]:
        _check(t, _truth(states, [t["name"]]))
    layers = {lay["name"]: lay for lay in doc["layers"]}
    assert sorted(layers) == ["embed", "head", "hidden", "norm"]
    floats = [k for k in states[0] if states[0][k].is_floating_point()]
    for name, lay in layers.items():
        _check(lay, _truth(states, [k for k in floats if k.rsplit(".", 1)[0] == name]))
    _check(doc["model_drift"], _truth(states, floats))
    # the frozen layer did not move at all; the one unfrozen after snapshot 1 first moved at snapshot 2
    assert layers["embed"]["first_changed"] is None
    assert all(s["l2"] == 0 and s["changed"] == 0 and s["cosine"] == 1 for s in layers["embed"]["snapshots"])
    assert layers["hidden"]["first_changed"] == 2 and layers["hidden"]["snapshots"][0]["l2"] == 0
    assert layers["head"]["first_changed"] == 1 and layers["head"]["snapshots"][-1]["l2"] > 0
    assert [c["name"] for c in doc["counters"]] == ["norm.num_batches_tracked"]  # an integer: not in the layer totals
    assert doc["optimizer"]["recovered"] is False and "not recovered" in doc["optimizer"]["note"]
    assert list(doc["files"]) == ["drift_timeline.png"] and (out / "drift_timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "embed" in res.stdout and "never" in res.stdout and "snapshot 2" in res.stdout
    # in the report of the last snapshot
    md = tmp_path / "report.md"
    zen("report", cases[-1], "-o", md, "--drift", out, "--no-attribute")
    text = md.read_text()
    assert "Weight drift across snapshots" in text and "| embed | 544 | 0 | 0 | 1.000000 | 0.0% | never |" in text
    # snapshots given out of time order: computed, and said
    rev = json.loads(zen("drift", *cases[::-1], "--json").stdout)
    assert any("not in the order they were acquired" in p for p in rev["problems"])


def test_drift_refuses_other_models_and_cases_without_weights(snapshots, tmp_path):
    _outdir, cases, others = snapshots

    def refused(command: str, *args, says: str):
        res = zen(command, *args, check=False)
        assert res.returncode == 2, res.stdout + res.stderr
        assert says in res.stderr and "hint:" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert len([ln for ln in res.stderr.splitlines() if ln.startswith("error:")]) == 1

    refused("drift", cases[0], others["other"], says="is not the same model as case0: modules only in case0")
    refused("drift", cases[0], others["activations"], says="has no recovered weights (the model has no parameters or buffers)")
    refused("drift", cases[0], says="at least two cases")
    refused("analyze", others["activations"], "-o", tmp_path / "a", says="has no weights: the model has no parameters")


def test_large_tensors_are_compared_in_bounded_blocks(tmp_path):
    """Issue 49.4: drift mapped whole tensors, and every page it touched counted in its memory: two snapshots claiming
    a 10^9-element tensor took 15.8 GB. Blocks are now read with pread, one per file at a time: comparing two 256 MB
    tensors stays within ~150 MB of the process's baseline (mapped, it would hold both: 512 MB), with the same sums
    as a whole-array computation."""
    import subprocess
    import sys

    import numpy as np
    from safetensors.numpy import save_file

    n = 64 << 20  # 64 M float32 elements: 256 MB per snapshot
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n, dtype=np.float32)
    b = a.copy()
    b[::1000] += 1.0
    save_file({"w": a}, str(tmp_path / "a.safetensors"))
    save_file({"w": b}, str(tmp_path / "b.safetensors"))
    want = (float(np.dot(a.astype(np.float64), a.astype(np.float64))), int(np.count_nonzero(a != b)))
    del a, b
    code = (  # VmHWM: this process's peak resident memory (ru_maxrss would carry the parent's over fork and exec)
        "import sys, json; from zen.analyze.drift import compare; from zen.analyze.tensors import TensorFile\n"
        "hwm = lambda: next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        "base = hwm()\n"
        "s = compare(TensorFile(sys.argv[1]), TensorFile(sys.argv[2]), 'w')\n"
        "print(json.dumps([s.aa, s.changed, (hwm() - base) * 1024]))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    aa, changed, grew = json.loads(run.stdout)
    assert changed == want[1] and abs(aa - want[0]) <= 1e-9 * want[0]
    assert grew < 150 << 20, f"drift's memory grew by {grew / 2**20:.0f} MB comparing two 256 MB tensors"
