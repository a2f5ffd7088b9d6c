"""Case files of `zen decompile` (issue 19): a decompiled TVM library as a case for library/attribute/report.

Real artefacts on both sides: a child builds TVM libraries of four models (tests/targets/tvm_models.py,
torchvision ResNet-18 when the zoo side directory has torchvision), and another child holds the very
same PyTorch models (same seeds, same initialisation) in memory, is imaged with `zen acquire`, and its
models are recovered with `zen recover`. The child writes the ground truth: every module's class,
hyper-parameters and the sha256 of every parameter and buffer. The tests check the decompiled MR
against it layer by layer, then attribute each decompiled model against a library of the recovered
process-image cases, and make a report.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tvm_builds import build_libraries, run_each

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TARGETS = HERE / "targets"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
ZOO_SITE = Path(os.environ.get("ZEN_ZOO_SITE", CACHE / "zen" / "zoo-site"))
MODELS = ["cnn", "resnet", "mlp"] + (["tv_resnet18"] if (ZOO_SITE / "torchvision").is_dir() else [])
UNFUSED = ["cnn_unfused", "resnet_unfused"]  # one kernel per operator: biases and dense weights pass through
# reshape/transpose kernels of their own; checked against the same truth as the fused build
LAYERS = {"Conv1d", "Conv2d", "BatchNorm1d", "BatchNorm2d", "Linear", "LayerNorm", "Embedding"}


def _has_tvm() -> bool:
    return subprocess.run([sys.executable, "-c", "import tvm, torch"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _has_tvm(), reason="apache-tvm is not installed (pip install -e .[tvm])")

# The process that holds the PyTorch models (built exactly as tvm_models.build builds them) and
# writes what it knows about them; it waits on stdin while it is imaged.
HOLDER = r"""
import hashlib, json, sys
from pathlib import Path
import torch
from torch import nn
sys.path.insert(0, sys.argv[2])
import tvm_models as T

out, names, truth, keep = Path(sys.argv[1]), sys.argv[3:], {}, {}
for name in names:
    cls = T.MODELS[name][0] if name in T.MODELS else T.zoo_model(name)[0]
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5); m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5); m.bias.uniform_(-0.2, 0.2)
    keep[name] = model
    mods = []
    for path, m in model.named_modules():
        own = list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
        mods.append({"path": path, "cls": type(m).__qualname__,
                     "hyper": {k: repr(v) for k, v in vars(m).items() if not k.startswith("_") and k != "training"
                               and isinstance(v, (int, float, bool, str, tuple, type(None)))},
                     "tensors": {k: [list(t.shape), hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()]
                                 for k, t in own if t is not None and t.dtype.is_floating_point}})
    truth[name] = {"id": id(model), "modules": mods}
(out / "truth.json").write_text(json.dumps(truth))
print("READY", flush=True)
sys.stdin.read()
"""


def _env() -> dict:
    env = dict(os.environ, COLUMNS="200")
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def zen(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zen", *map(str, args)], capture_output=True, text=True, env=_env(), timeout=900)


@pytest.fixture(scope="session")
def decompiled_cases(tmp_path_factory) -> dict[str, Path]:
    """Each model's TVM library (fused, llvm) decompiled into a case directory."""
    out = tmp_path_factory.mktemp("tvm_case_libs")
    build_libraries(out, MODELS + [u.replace("_unfused", ":unfused") for u in UNFUSED] + ["resnet:detached"])
    names = MODELS + UNFUSED + ["resnet_detached"]
    runs = run_each(zen, [["decompile", out / f"{n}.so", "-o", out / f"dec_{n}", "--no-check"] for n in names])
    cases = {}
    for name, res in zip(names, runs):
        assert res.returncode == 0, res.stderr[-2000:]
        cases[name] = out / f"dec_{name}"
    return cases


@pytest.fixture(scope="session")
def recovered_cases(tmp_path_factory) -> tuple[dict, dict[str, Path]]:
    """The same models recovered by `zen recover` from an image of a process holding them: (truth, cases)."""
    work = tmp_path_factory.mktemp("tvm_case_holder")
    (work / "holder.py").write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(work / "holder.py"), str(work), str(TARGETS), *MODELS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        line = ""
        while time.monotonic() < deadline and line.strip() != "READY":
            line = proc.stdout.readline()
            if not line:
                break
        assert line.strip() == "READY", f"the model holder did not start (exit {proc.poll()})"
        truth = json.loads((work / "truth.json").read_text())
        res = zen("acquire", "--pid", proc.pid, "-o", work / "holder.core", "--lean")
        assert res.returncode == 0, res.stderr[-2000:]
    finally:
        proc.stdin.close()
        proc.wait(30)
    cases = {}
    for name in MODELS:
        case = work / f"rec_{name}"
        res = zen("recover", work / "holder.core", "-o", case, "--model", hex(truth[name]["id"]))
        assert res.returncode in (0, 5), res.stderr[-2000:]
        cases[name] = case
    (work / "holder.core").unlink()
    return truth, cases


def _sha(a) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


@pytest.mark.parametrize("name", MODELS + UNFUSED)
def test_mr_matches_the_original_layers(name, decompiled_cases, recovered_cases):
    """Every layer with weights is in the MR as its torch.nn class, with the original's hyper-parameters
    (torch's names and reprs) and every parameter and buffer bit-exact under PyTorch's names and shapes."""
    from safetensors.numpy import load_file

    truth = recovered_cases[0][name.removesuffix("_unfused")]
    case = decompiled_cases[name]
    mr = json.loads((case / "mr.json").read_text())
    manifest = json.loads((case / "manifest.json").read_text())
    assert manifest["kind"] == "zen-case" and manifest["case"]["source"] == "compiled" and manifest["status"] == "complete"
    weights = load_file(str(case / "state_dict.safetensors"))
    assert {t["key"] for t in mr["tensors"]} == set(weights)
    by_weight = {}
    for m in mr["modules"]:
        if "weight" in m["parameters"]:
            by_weight[_sha(weights[f"{m['path']}.weight"])] = m
    layers = [m for m in truth["modules"] if m["cls"] in LAYERS]
    assert len(layers) == sum(1 for m in mr["modules"] if m["cls_qualname"] in LAYERS)
    for orig in layers:
        m = by_weight.get(orig["tensors"]["weight"][1])
        assert m is not None, f"{orig['path']}'s weight is not in the decompiled MR"
        assert m["cls_module"].startswith("torch.nn.modules.") and m["cls_qualname"] == orig["cls"], orig["path"]
        hyper = {k: v for k, v in m["hyperparameters"].items() if k != "training"}
        assert hyper == orig["hyper"], (orig["path"], hyper, orig["hyper"])
        for key, (shape, sha) in orig["tensors"].items():
            if key == "num_batches_tracked":
                continue
            got = weights[f"{m['path']}.{key}"]
            assert list(got.shape) == shape and _sha(got) == sha, (orig["path"], key)

    # parameter-free layers the original registered (pools, activations) are there with equal settings
    # (`inplace` is a Python-side memory choice an executable does not keep)
    def settings(hyper: dict) -> str:
        return json.dumps({k: v for k, v in hyper.items() if k not in ("training", "inplace")}, sort_keys=True)

    for cls in ("MaxPool2d", "AvgPool2d", "ReLU"):
        want = sorted(settings(m["hyper"]) for m in truth["modules"] if m["cls"] == cls)
        got = [settings(m["hyperparameters"]) for m in mr["modules"] if m["cls_qualname"] == cls]
        assert all(w in got for w in set(want)), (cls, want, got)
    assert mr["graph"]["dataflow"], "no data-flow edges"
    paths = {m["path"] for m in mr["modules"]}
    assert all(a in paths and b in paths for a, b in mr["graph"]["dataflow"])


@pytest.fixture(scope="session")
def library(recovered_cases, tmp_path_factory) -> Path:
    lib = tmp_path_factory.mktemp("tvm_case_library") / "lib.sqlite"
    for name, case in recovered_cases[1].items():
        res = zen("library", "add", case, "--name", f"recovered_{name}", "--library", lib)
        assert res.returncode == 0, res.stderr[-2000:]
    return lib


@pytest.mark.parametrize("name", MODELS + UNFUSED)
def test_decompiled_model_is_attributed_to_the_recovered_one(name, decompiled_cases, library):
    """Against a library of process-image cases, each decompiled model's MR is closest to the same
    architecture's; the result says it is an MR-only attribution with PR/UR not available (null)."""
    res = zen("attribute", decompiled_cases[name], "--library", library, "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    att = json.loads(res.stdout)
    base = f"recovered_{name.removesuffix('_unfused')}"
    assert att["attributed"] == base, att["candidates"]
    assert att["basis"] == "mr-only" and "compiled executable" in att["explanation"]
    assert "not weight values" in att["explanation"]  # MR cannot tell a base from its fine-tuned copy
    best, *others = att["candidates"]
    assert best["name"] == base and others
    assert best["mr"] > max(c["mr"] for c in others)
    assert all(c["pr"] is None and c["ur"] is None and c["cos"] is None and "pr_note" in c for c in att["candidates"])


def test_no_base_is_named_when_no_library_architecture_is_close(decompiled_cases, recovered_cases, tmp_path):
    """MR-only evidence names no base when the library lacks the model's architecture: against a library
    holding only the MLP, the decompiled CNN is not attributed; the closest entry is listed with its MR."""
    lib = tmp_path / "mlp_only.sqlite"
    res = zen("library", "add", recovered_cases[1]["mlp"], "--name", "recovered_mlp", "--library", lib)
    assert res.returncode == 0, res.stderr[-2000:]
    att = json.loads(zen("attribute", decompiled_cases["cnn"], "--library", lib, "--json").stdout)
    assert att["attributed"] is None and att["basis"] == "mr-only"
    assert "architecture close to this model" in att["message"] and "recovered_mlp" in att["explanation"]
    assert att["candidates"][0]["name"] == "recovered_mlp" and att["candidates"][0]["mr"] < 0.7


def test_same_model_from_image_and_executable_is_most_similar(decompiled_cases, recovered_cases):
    """MR similarity of a model recovered from a process image and decompiled from its TVM library is
    higher than with any other architecture, in both directions of the comparison table."""
    from zen.attribute.mr_similarity import mr_similarity
    from zen.represent import case

    dec = {n: case.load_mr(p) for n, p in decompiled_cases.items()}
    rec = {n: case.load_mr(p) for n, p in recovered_cases[1].items()}
    table = {(a, b): mr_similarity(dec[a], rec[b]).mrss for a in MODELS for b in MODELS}
    for a in MODELS:
        assert table[a, a] > max(table[a, b] for b in MODELS if b != a), table
        assert table[a, a] > max(table[b, a] for b in MODELS if b != a), table
        assert table[a, a] >= 0.75, table


def test_decompiled_case_verifies_and_a_changed_state_dict_is_caught(decompiled_cases, tmp_path):
    """mr.json of a decompiled case describes state_dict.safetensors (weights.safetensors is keyed by kernel
    constant): verify-case checks each tensor there against mr.json, and one flipped bit is named."""
    import shutil

    case = tmp_path / "dec"
    shutil.copytree(decompiled_cases["cnn"], case)
    res = zen("verify-case", case, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["files"]["weights.safetensors"]["status"] == "ok", res.stderr
    p = case / "state_dict.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-5] ^= 1
    p.write_bytes(bytes(raw))
    res = zen("verify-case", case, "--json")
    reasons = json.loads(res.stdout)["files"]["weights.safetensors"]["reasons"]
    assert res.returncode == 1 and any("state_dict.safetensors" in r and "sha256" in r for r in reasons), reasons


def test_library_add_and_report_on_a_decompiled_case(decompiled_cases, library, tmp_path):
    """`zen library add` takes a decompiled case; `zen report` says the model came from a compiled executable."""
    lib = tmp_path / "lib.sqlite"
    name = MODELS[-1]
    res = zen("library", "add", decompiled_cases[name], "--name", f"tvm_{name}", "--library", lib)
    assert res.returncode == 0, res.stderr
    res = zen("library", "add", decompiled_cases["cnn"], "--name", "tvm_cnn", "--library", lib)
    assert res.returncode == 0, res.stderr
    att = json.loads(zen("attribute", decompiled_cases[name], "--library", lib, "--json").stdout)
    assert att["attributed"] == f"tvm_{name}" and att["candidates"][0]["mr"] == 1.0
    html = tmp_path / "r.html"
    res = zen("report", decompiled_cases[name], "--library", library, "-o", html)
    assert res.returncode == 0, res.stderr[-2000:]
    text = html.read_text()
    assert "compiled executable" in text and f"recovered_{name}" in text and "n/a" in text
    data = json.loads(html.with_suffix(".json").read_text())
    assert data["evidence"]["source"] == "compiled" and data["evidence"]["integrity"]["verified"]
    assert data["attribution"]["attributed"] == f"recovered_{name}"
    # a case file altered after decompiling is refused, as for recovered cases
    mr = decompiled_cases[name] / "mr.json"
    saved = mr.read_bytes()
    try:
        mr.write_bytes(saved.replace(b'"training": "False"', b'"training": "True"', 1))
        res = zen("library", "add", decompiled_cases[name], "--name", "altered", "--library", lib)
        assert res.returncode != 0 and "Traceback" not in res.stderr and "altered" in res.stderr
    finally:
        mr.write_bytes(saved)


def test_fast_and_reference_attribution_agree_on_a_compiled_model(decompiled_cases, library):
    """The MR-only path scores with the library's stored invariants; the per-pair reference gives the same result."""
    from zen.attribute.algorithm import attribute
    from zen.attribute.invariants import packed
    from zen.library.store import Library
    from zen.represent import case

    name = MODELS[-1]
    mr, pr = case.load_mr(decompiled_cases[name]), case.load_pr(decompiled_cases[name])
    with Library(library, create=False, invariants=packed) as lib:
        fast, ref = attribute(mr, pr, lib), attribute(mr, pr, lib, reference=True)
    assert fast.to_json() == ref.to_json() and fast.attributed == f"recovered_{name}"


def test_static_decompile_is_refused_as_a_case_with_a_clear_message(decompiled_cases, library, tmp_path):
    lib_so = decompiled_cases["cnn"].parent / "cnn.so"
    assert zen("decompile", lib_so, "-o", tmp_path / "static", "--static").returncode == 0
    res = zen("attribute", tmp_path / "static", "--library", library)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "without probing" in res.stderr


def test_detached_weights_are_recorded_missing_not_invented(decompiled_cases):
    """Weights compiled as inputs of main are not in the library: same layers as the embedded build, their
    tensors recorded with shape and status "missing" (no hash, not in state_dict.safetensors), case partial."""
    from safetensors.numpy import load_file

    det, full = decompiled_cases["resnet_detached"], decompiled_cases["resnet"]
    mr_det, mr_full = (json.loads((d / "mr.json").read_text()) for d in (det, full))
    assert json.loads((det / "manifest.json").read_text())["status"] == "partial"
    layers = lambda mr: [(m["cls_qualname"], m["hyperparameters"]) for m in mr["modules"]]  # noqa: E731
    assert layers(mr_det) == layers(mr_full)
    missing = [t for t in mr_det["tensors"] if t["status"] == "missing"]
    params = load_file(str(det.parent / "resnet_detached.params.safetensors"))
    assert len(missing) == len(params) and all(t["sha256"] is None for t in missing)
    shapes = {t["key"]: t["shape"] for t in mr_full["tensors"]}
    assert all(t["shape"] == shapes[t["key"]] for t in mr_det["tensors"])
    assert set(load_file(str(det / "state_dict.safetensors"))) == {t["key"] for t in mr_det["tensors"] if t["status"] == "ok"}
