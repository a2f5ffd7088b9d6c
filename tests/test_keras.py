"""The Keras / TensorFlow front end against ground truth from real Keras processes (issue 18, slice 1).

A target process (tests/targets/keras_target.py, run in the TF environment of tools/tf-venv.sh) builds a Sequential
CNN trained one step with Adam, a functional model with branches and a shared layer, and a subclassed transformer
block with variables of many dtypes; it records every variable's Keras path, dtype, shape and sha256. The process is
imaged once per session; `zen recover` must give every variable bit for bit, in `model.variables` order, keyed by
path, with layers, configuration, functional graph and optimizer slots. zen itself never imports TensorFlow: the
tests skip, saying why, when the TF environment is absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
from conftest import recovered, start_target, zen

MODELS = ("cnn", "branches", "block")


def tf_python() -> str | None:
    """The TF environment's interpreter (tools/tf-venv.sh), if it was built completely."""
    env = os.environ.get("ZEN_TF_PYTHON")
    if env:
        return env if Path(env).is_file() else None
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    venv = Path(os.environ.get("ZEN_TF_VENV") or cache / "zen" / "tf-venv")
    exe = venv / "bin" / "python"
    return str(exe) if exe.is_file() and (venv / ".zen-tf-ok").is_file() else None


@pytest.fixture(scope="session")
def tfpy() -> str:
    exe = tf_python()
    if exe is None:
        pytest.skip("no TensorFlow environment: build it with `tools/tf-venv.sh` (tensorflow-cpu 2.21.0, keras 3.15.1)")
    return exe


def _imaged(workdir: Path, tfpy: str, mode: str):
    t = start_target("keras_target.py", workdir / f"keras-{mode}", mode, python=tfpy)
    img = workdir / f"keras-{mode}.core"
    try:
        zen("acquire", "--pid", t.pid, "-o", img, "--lean")
    finally:
        t.stop()
    return img, t


@pytest.fixture(scope="session")
def keras_image(workdir, tfpy):
    img, t = _imaged(workdir, tfpy, "models")
    yield img, t
    img.unlink(missing_ok=True)


def safetensors_bytes(path: Path) -> tuple[dict, bytes]:
    """(header, data) of a safetensors file, read raw: the bytes compared are the bytes zen wrote."""
    raw = path.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def check_variables(file: Path, records: list[dict], truth: list[dict]) -> None:
    header, data = safetensors_bytes(file)
    assert [r["key"] for r in records] == [v["path"] for v in truth]
    for rec, v in zip(records, truth):
        e = header[v["path"]]
        lo, hi = e["data_offsets"]
        assert hashlib.sha256(data[lo:hi]).hexdigest() == v["sha256"], v["path"]
        assert (e["shape"], rec["shape"], rec["dtype"], rec["status"]) == (v["shape"], v["shape"], v["dtype"], "ok"), v["path"]


@pytest.mark.parametrize("name", MODELS)
def test_variables_bit_exact(keras_image, workdir, name):
    image, t = keras_image
    case, mr, manifest, _ = recovered(image, t, name, workdir)
    gt = t.truth["models"][name]
    assert mr["framework"] == "keras" and manifest["framework"] == "keras"
    assert manifest["status"] == "complete", manifest["problems"]
    check_variables(case / "weights.safetensors", mr["tensors"], gt["variables"])
    for rec, v in zip(mr["tensors"], gt["variables"]):
        want = "seed" if "seed_generator" in v["path"] else ("parameter" if v["trainable"] else "buffer")
        assert rec["kind"] == want, v["path"]
        assert int(rec["address"], 16) == v["id"]
    assert manifest["tensorflow"]["version"] == t.truth["tensorflow"] and manifest["keras"]["version"] == t.truth["keras"]
    assert manifest["torch"]["version"] is None and manifest["profiles"]["tf"] == "zen:tf-2.21-x86_64.json"


@pytest.mark.parametrize("name", MODELS)
def test_layers_and_configuration(keras_image, workdir, name):
    image, t = keras_image
    _, mr, _, _ = recovered(image, t, name, workdir)
    gt = t.truth["models"][name]
    by_addr = {int(m["address"], 16): m for m in mr["modules"]}
    assert set(by_addr) == {la["id"] for la in gt["layers"]}
    for la in gt["layers"]:
        m = by_addr[la["id"]]
        assert f"{m['cls_module']}.{m['cls_qualname']}" == la["class"], la["name"]
        assert len(m["children"]) == la["n_sublayers"], la["name"]
        assert m["path"].rsplit(".", 1)[-1] == la["name"] or m["path"] == ""
        for k, v in la["config"].items():
            assert m["hyperparameters"].get(k) == v, (la["name"], k)
    if name == "block":
        mha = next(m for m in mr["modules"] if m["path"] == "mha")
        assert (mha["hyperparameters"]["num_heads"], mha["hyperparameters"]["key_dim"]) == ("2", "8")
        assert [m["path"] for m in mr["modules"] if m["path"].startswith("mha.")][:3] == ["mha.query", "mha.key", "mha.value"]
        assert next(m for m in mr["modules"] if m["path"] == "ff_in")["hyperparameters"]["activation"].endswith(".gelu'")


def test_functional_graph(keras_image, workdir):
    image, t = keras_image
    _, mr, _, _ = recovered(image, t, "branches", workdir)
    want = {("features", "side"), ("features", "shared"), ("side", "shared"), ("shared", "cat"), ("cat", "bn"),
            ("features", "skip"), ("bn", "add"), ("skip", "add"), ("add", "out")}  # fmt: skip
    assert {tuple(e) for e in mr["graph"]["dataflow"]} == want
    # the shared layer is one module with two inbound nodes in this model
    assert [m["path"] for m in mr["modules"]].count("shared") == 1
    _, mr, _, _ = recovered(image, t, "cnn", workdir)
    chain = ["input_layer", "conv1", "bn1", "relu1", "conv2", "flat", "drop", "fc"]
    assert {tuple(e) for e in mr["graph"]["dataflow"]} == set(zip(chain, chain[1:]))


def test_optimizer_slots(keras_image, workdir):
    image, t = keras_image
    case, mr, _, _ = recovered(image, t, "cnn", workdir)
    gt = t.truth["models"]["cnn"]["optimizer"]
    assert len(gt) == 18
    check_variables(case / "extra.safetensors", mr["extra_tensors"], gt)
    kinds = {r["key"]: r["kind"] for r in mr["extra_tensors"]}
    assert kinds["adam/iteration"] == kinds["adam/learning_rate"] == "optimizer_state"
    slots = {v["path"] for v in gt} - {"adam/iteration", "adam/learning_rate"}
    assert {k for k, v in kinds.items() if v == "optimizer_slot"} == slots


def test_roots_default_choice_and_code(keras_image, workdir):
    image, t = keras_image
    case = workdir / "keras-default"
    res = zen("recover", image, "-o", case)
    mr = json.loads((case / "mr.json").read_text())
    assert {int(r["address"], 16) for r in mr["roots"]} == {m["id"] for m in t.truth["models"].values()}
    assert mr["root"]["referenced_from"], "rank 1 is the model a live frame names"
    assert "model:" in res.stdout
    ur = json.loads((case / "ur.json").read_text())
    assert [n["path"] for n in ur["nodes"]] == [m["path"] for m in mr["modules"]]
    pr = json.loads((case / "pr.json").read_text())
    assert any(c["qualname"] == "Block.call" for c in pr["codes"])  # the subclassed model's own call


def test_no_model_is_exit_6(workdir, tfpy):
    image, _ = _imaged(workdir, tfpy, "nomodel")
    try:
        res = zen("recover", image, "-o", workdir / "keras-nomodel-case", check=False)
    finally:
        image.unlink(missing_ok=True)
    assert res.returncode == 6, res.stderr
    msg = " ".join(res.stderr.split())
    assert "no Keras models found" in msg and "TensorFlow 2.21.0" in msg and "Keras variable" in msg
    assert not (workdir / "keras-nomodel-case").exists()


def test_unknown_tf_version_is_exit_4(workdir, tfpy):
    image, _ = _imaged(workdir, tfpy, "fakeversion")
    try:
        res = zen("recover", image, "-o", workdir / "keras-fake-case", check=False)
    finally:
        image.unlink(missing_ok=True)
    assert res.returncode == 4, res.stderr
    msg = " ".join(res.stderr.split())
    assert "TensorFlow 2.99" in msg and "zen profile tf --python" in msg


def test_calibration_matches_shipped_profile(tmp_path, tfpy):
    """`zen profile tf` in the TF environment measures what zen ships for 2.21 (offsets, encodings, dtype table)."""
    from importlib import resources

    out = tmp_path / "tf.json"
    res = zen("profile", "tf", "--python", tfpy, "-o", out)
    assert "self-checks passed" in res.stdout
    got = json.loads(out.read_text())
    shipped = json.loads(resources.files("zen.frontends.keras").joinpath("profiles", "tf-2.21-x86_64.json").read_text())
    for k in ("structs", "constants", "dtypes"):
        assert got[k] == shipped[k], k
    assert got["self_checks"] >= 200
