"""`zen recover` against ground truth from real processes: test-tree models and transformers/peft.

For every model: weights.safetensors equals the process's state_dict() (keys, order, dtypes,
shapes, bytes), the module tree and hyper-parameters equal the process's, and a freshly built
copy loaded with the recovered weights reproduces the process's recorded outputs bit for bit.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import TARGETS, recovered, zen
from safetensors.torch import load_file

sys.path.insert(0, str(TARGETS))
import models_zoo  # noqa: E402

torch.set_num_threads(1)  # as in the target processes: the same summation order, bit-identical outputs


def check_model(image, target, name, workdir, build):
    case, mr, manifest, _ = recovered(image, target, name, workdir)
    gt = target.truth["models"][name]
    state = torch.load(target.outdir / f"{name}.state.pt", weights_only=True)
    io = torch.load(target.outdir / f"{name}.io.pt", weights_only=True)
    weights = load_file(case / "weights.safetensors")
    # -- tensors: every state_dict entry, same order, exact bytes -----------------------------
    assert [t["key"] for t in mr["tensors"]] == list(state)
    on_device = {t["key"] for t in mr["tensors"] if t["status"] == "on-device"}
    assert list(weights) == [k for k in state if k not in on_device]
    for rec, g in zip(mr["tensors"], gt["state"]):
        assert (rec["dtype"], rec["shape"], rec["device"]) == (g["dtype"], g["shape"], g["device"]), rec["key"]
        if rec["key"] in weights:
            w, s = weights[rec["key"]], state[rec["key"]]
            assert w.dtype == s.dtype and w.shape == s.shape and torch.equal(w, s), rec["key"]
            assert rec["stride"] == g["stride"], rec["key"]
    # -- module tree -------------------------------------------------------------------------
    by_path = {m["path"]: m for m in mr["modules"]}
    assert list(by_path) == [m["path"] for m in gt["modules"]]
    for g in gt["modules"]:
        m = by_path[g["path"]]
        assert f"{m['cls_module']}.{m['cls_qualname']}" == g["class"], g["path"]
        assert m["hyperparameters"] == g["hyperparameters"], g["path"]
        assert (m["parameters"], m["buffers"], m["children"]) == (g["parameters"], g["buffers"], g["children"]), g["path"]
        assert int(m["address"], 16) == g["address"]
    # -- the recovered weights reproduce the deployed outputs ----------------------------------
    fresh, _ = build(name)
    missing = fresh.load_state_dict(weights, strict=not on_device)
    assert set(getattr(missing, "missing_keys", [])) <= on_device
    with torch.no_grad():
        y = fresh(io["input"])
    y = y if isinstance(y, torch.Tensor) else y.logits
    assert torch.equal(y, io["output"]), name
    return case, mr, manifest


@pytest.mark.parametrize("name", models_zoo.ZOO)
def test_zoo_model(zoo_image, workdir, name):
    image, t = zoo_image
    case, mr, manifest = check_model(image, t, name, workdir, models_zoo.build)
    assert manifest["status"] == ("partial" if name == "ondevice" else "complete")
    assert manifest["evidence"]["sha256"] and manifest["files"]["weights.safetensors"]
    assert manifest["python"]["version"] in manifest["python"]["profile_why"]  # the layout chosen for that release


@pytest.mark.parametrize("name", models_zoo.HF)
def test_transformers_model(hf_image, workdir, name):
    image, t = hf_image
    check_model(image, t, name, workdir, lambda n: models_zoo.build_hf(n)[:2])


def test_roots_and_ranking(zoo_image, workdir):
    image, t = zoo_image
    _, mr, manifest, _ = recovered(image, t, "cnn", workdir)
    ids = {hex(m["id"]) for m in t.truth["models"].values()}
    assert {r["address"] for r in mr["roots"]} == ids
    top = mr["roots"][0]
    assert top["address"] == hex(t.truth["models"]["cnn"]["id"]) and "__main__.model" in top["referenced_from"]


def test_tied_weights(zoo_image, hf_image, workdir):
    _, mr, _, _ = recovered(*zoo_image, "tied", workdir)
    assert mr["tied"] == [["embed.weight", "out.weight"]]
    assert mr["summary"]["unique_tensors"] == len(mr["tensors"]) - 1
    _, mr, _, _ = recovered(*hf_image, "gpt2", workdir)
    assert ["transformer.wte.weight", "lm_head.weight"] in mr["tied"]


def test_odd_tensors(zoo_image, workdir):
    case, mr, _, _ = recovered(*zoo_image, "odd", workdir)
    wt = next(t for t in mr["tensors"] if t["key"] == "wt")
    assert wt["shape"] == [6, 4] and wt["stride"] == [1, 6]  # non-contiguous, written in C order
    grid = next(t for t in mr["tensors"] if t["key"] == "grid")
    assert len(grid["shape"]) == 7
    root = mr["modules"][0]
    assert root["non_persistent_buffers"] == ["cache"] and "unused" in root["none_entries"]
    assert root["unregistered_tensors"] == ["scratch"]
    assert [m["path"] for m in mr["modules"]].count("second") == 0  # named_modules() lists a shared module once
    # tensors outside state_dict travel in extra.safetensors, one key each (two in one list attribute)
    from safetensors.numpy import load_file

    extra = load_file(case / "extra.safetensors")
    assert {t["key"] for t in mr["extra_tensors"]} == set(extra) >= {"scratch", "anchors", "anchors#1"}
    assert extra["anchors"].tolist() == [1.0, 1.0] and extra["anchors#1"].tolist() == [0.0, 0.0, 0.0]
    assert root["state"]["anchors"]["list"] == [{"tensor": "anchors", "file": "extra"}, {"tensor": "anchors#1", "file": "extra"}]


def test_mixed_dtypes(zoo_image, workdir):
    _, mr, _, _ = recovered(*zoo_image, "mixed", workdir)
    assert {"float32", "float16", "bfloat16", "int8", "bool", "int64"} == set(mr["summary"]["dtypes"])


def test_on_device_tensor_recorded_without_data(zoo_image, workdir):
    _, mr, manifest, res = recovered(*zoo_image, "ondevice", workdir)
    ghost = next(t for t in mr["tensors"] if t["key"] == "ghost")
    assert ghost["status"] == "on-device" and ghost["device"] == "meta" and ghost["shape"] == [4, 5]
    assert res.returncode == 5 and any("ghost" in p for p in manifest["problems"])


def test_inputs_recovered(zoo_image, workdir):
    image, t = zoo_image
    for name in ("cnn", "tied"):
        case, mr, _, _ = recovered(image, t, name, workdir)
        io = torch.load(t.outdir / f"{name}.io.pt", weights_only=True)
        found = load_file(case / "inputs.safetensors")
        assert any(v.shape == io["input"].shape and torch.equal(v, io["input"]) for v in found.values()), name
        assert hex(t.truth["models"][name]["input_id"]) in {i["address"] for i in mr["inputs"]}


def test_dataflow_edges(zoo_image, workdir):
    _, mr, _, _ = recovered(*zoo_image, "cnn", workdir)
    edges = {tuple(e) for e in mr["graph"]["dataflow"]}
    expected = {("<root>:in:x", "stem"), ("stem", "body"), ("stem", "skip"), ("body", "pool"), ("skip", "pool"), ("pool", "head"),
                ("head", "<root>:out"), ("body.0", "body.1"), ("stem.conv", "stem.bn"), ("stem.bn", "stem.act")}  # fmt: skip
    assert expected <= edges, expected - edges


def test_recovery_is_deterministic(zoo_image, workdir):
    image, t = zoo_image
    case, _, _, _ = recovered(image, t, "cnn", workdir)
    again = workdir / "case-again"
    zen("recover", image, "-o", again, "--model", hex(t.truth["models"]["cnn"]["id"]))
    for name in ("mr.json", "weights.safetensors", "inputs.safetensors"):
        assert (case / name).read_bytes() == (again / name).read_bytes(), name


def test_recover_live_process(workdir):
    """`zen recover --pid`: the process is stopped while read and resumed; weights are exact."""
    from conftest import start_target

    from zen.memory.live import process_state

    t = start_target("models_target.py", workdir / "live-zoo", "zoo")
    try:
        case = workdir / "case-live"
        zen("recover", "--pid", t.pid, "-o", case, "--model", "#1")
        assert process_state(t.pid) != "T"
        mr = json.loads((case / "mr.json").read_text())
        assert mr["root"]["address"] == hex(t.truth["models"]["cnn"]["id"])
        state = torch.load(t.outdir / "cnn.state.pt", weights_only=True)
        weights = load_file(case / "weights.safetensors")
        assert list(weights) == list(state) and all(torch.equal(weights[k], state[k]) for k in state)
        manifest = json.loads((case / "manifest.json").read_text())
        assert manifest["evidence"]["live_pid"] == t.pid
    finally:
        t.stop()
