"""The Keras / TensorFlow front end against ground truth from real Keras processes (issue 18).

A target process (tests/targets/keras_target.py, run in the TF environment of tools/tf-venv.sh) builds a Sequential
CNN trained one step with Adam, a functional model with branches and a shared layer, and a subclassed transformer
block with variables of many dtypes; it records every variable's Keras path, dtype, shape and sha256. The process is
imaged once per session; `zen recover` must give every variable bit for bit, in `model.variables` order, keyed by
path, with layers, configuration, functional graph and optimizer slots; keras.applications.MobileNetV2 (random
weights) is one of the models. `zen reuse` packages are run by `zen verify --python TF` and must give the outputs the
deployed process wrote, bit for bit; a second process serves a customised fork of Block, attributed to its base.
The data flow of the subclassed models' and layers' `call`, recovered from bytecode, must equal what the target
traced in an eager run of it.
zen itself never imports TensorFlow: the tests skip, saying why, when the TF environment is absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import booby_trapped, recovered, start_target, zen, zen_command

MODELS = ("cnn", "branches", "block", "mobilenet", "nested")


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
    block_case = recovered(image, t, "block", workdir)[0]
    pr = json.loads((block_case / "pr.json").read_text())
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


# -- keras.applications, reuse, attribution ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ("cnn", "branches", "mobilenet", "nested"))
def test_graph_matches_keras(keras_image, workdir, name):
    """The root's functional graph: exactly the edges Keras's own nodes give (parent_nodes), every layer called."""
    image, t = keras_image
    _, mr, _, _ = recovered(image, t, name, workdir)
    gt = t.truth["models"][name]
    assert len(mr["modules"]) == len(gt["layers"]) and len(mr["tensors"]) == len(gt["variables"])
    root = mr["graph"]["functional"][""]
    assert {(a, b) for a, b, _ in root["edges"]} == {tuple(e) for e in gt["edges"]}
    assert {n["op"] for n in root["nodes"]} == {x for e in gt["edges"] for x in e}
    if name == "mobilenet":
        assert (len(gt["layers"]), len(gt["variables"])) == (157, 262)
    if name == "nested":  # the nested Sequential and functional model have graphs of their own
        assert {"inner", "sub"} <= set(mr["graph"]["functional"])


def _verify(pkg: Path, tfpy: str, inputs: Path, expect: Path, check: bool = True):
    res = zen("verify", pkg, "--python", tfpy, "--inputs", inputs, "--expect", expect, "--json", check=check)
    return json.loads(res.stdout) if res.returncode == 0 else res


@pytest.mark.parametrize("name", MODELS)
def test_reuse_outputs_bit_identical(keras_image, workdir, tfpy, name):
    """zen reuse rebuilds the model from its recovered configuration; zen verify runs it in the TF environment on
    the deployed inputs and compares with the outputs the deployed process wrote, byte for byte."""
    image, t = keras_image
    case, mr, _, _ = recovered(image, t, name, workdir)
    pkg = workdir / f"keras_reuse_{name}"
    zen("reuse", case, "-o", pkg)
    info = json.loads((pkg / "reuse.json").read_text())
    assert info["framework"] == "keras" and (pkg / "patch.json").is_file() == (name == "block")
    got = _verify(pkg, tfpy, t.outdir / f"{name}-inputs.safetensors", t.outdir / f"{name}-outputs.safetensors")
    assert got["ok"] and [r["equal"] for r in got["results"]] == [True], got["results"]
    rep = got["report"]
    assert (rep["assigned"], rep["variables"], rep["matched_by"]) == (len(mr["tensors"]), len(mr["tensors"]), "path")
    if name == "nested":  # no recorded constructor arguments: rebuilt from its configuration attributes
        assert any(n.startswith("sub.s1: constructed from its configuration") for n in rep["notes"]), rep["notes"]
    if name == "block":  # the subclassed model's classes come from the recovered code, not from an import
        assert rep["patch"]["synthesised"] == ["zen_rebuilt.__main__"] and rep["patch"]["created"] >= 4
    assert json.loads((pkg / "verify.json").read_text())["results"][0]["equal"] is True


def test_verify_in_a_booby_trapped_directory(keras_image, workdir, tfpy, tmp_path):
    """The TF environment's verifier child, started where planted `keras.py`, `tensorflow.py`, `numpy.py`,
    `sitecustomize.py`, a `zen/` package ... lie, imports none of them and still verifies (issue 38)."""
    image, t = keras_image
    case, _, _, _ = recovered(image, t, "cnn", workdir)
    pkg = tmp_path / "keras_reuse_trap"
    zen("reuse", case, "-o", pkg)
    evidence, markers = booby_trapped(tmp_path)
    res = zen_command("verify", pkg, "--python", tfpy, "--inputs", t.outdir / "cnn-inputs.safetensors", "--expect",
                      t.outdir / "cnn-outputs.safetensors", "--json", cwd=evidence)  # fmt: skip
    assert json.loads(res.stdout)["ok"]
    assert sorted(p.name for p in markers.iterdir()) == []


def test_reuse_package_loads_in_tf(keras_image, workdir, tfpy):
    """`import PKG; PKG.load()` in the TF environment gives a keras.Model whose predict() works."""
    image, t = keras_image
    for name in ("cnn", "block"):
        pkg = workdir / f"keras_reuse_{name}"
        if not (pkg / "reuse.json").is_file():
            zen("reuse", recovered(image, t, name, workdir)[0], "-o", pkg)
    script = (
        "import json, sys, keras, numpy as np\n"
        "sys.path[:0] = [sys.argv[1]]\n"
        "from zen.reuse.keras_runtime import read_safetensors\n"
        "out = {}\n"
        "for name in ('cnn', 'block'):\n"
        "    m = __import__(f'keras_reuse_{name}').load()\n"
        "    x = read_safetensors(f'{sys.argv[2]}/{name}-inputs.safetensors')['x']\n"
        "    y = read_safetensors(f'{sys.argv[2]}/{name}-outputs.safetensors')['x']\n"
        "    p = m.predict(x, verbose=0)\n"
        "    out[name] = [isinstance(m, keras.Model), list(p.shape) == list(y.shape), bool(np.allclose(p, y, atol=1e-5))]\n"
        "print('RESULT', json.dumps(out))\n"
    )  # fmt: skip
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "TF_CPP_MIN_LOG_LEVEL": "3"}
    res = subprocess.run([tfpy, "-c", script, str(workdir), str(t.outdir)], capture_output=True, text=True, env=env,
                         timeout=300, check=False)  # fmt: skip
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, res.stderr[-2000:]
    assert json.loads(line[7:]) == {"cnn": [True, True, True], "block": [True, True, True]}


def test_verify_without_tensorflow_is_clear(keras_image, workdir):
    image, t = keras_image
    pkg = workdir / "keras_reuse_notf"
    zen("reuse", recovered(image, t, "cnn", workdir)[0], "-o", pkg)
    args = ("--inputs", t.outdir / "cnn-inputs.safetensors")
    res = zen("verify", pkg, "--python", sys.executable, *args, check=False)  # zen's own python: no TensorFlow
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "Keras is not importable" in " ".join(res.stderr.split())
    res = zen("verify", pkg, "--python", "/nonexistent/python3", *args, check=False)
    assert res.returncode != 0 and "no Python interpreter" in " ".join(res.stderr.split())
    res = zen("reuse", recovered(image, t, "cnn", workdir)[0], "-o", workdir / "keras_reuse_base", "--base", "x", check=False)
    assert res.returncode != 0 and "--base applies to PyTorch" in " ".join(res.stderr.split())


@pytest.fixture(scope="session")
def fork_image(workdir, tfpy):
    img, t = _imaged(workdir, tfpy, "fork")
    yield img, t
    img.unlink(missing_ok=True)


def _library_with_foreign_twin(workdir: Path, base_case: Path) -> Path:
    """A library holding the Keras Block as `keras-block`, and the very same fingerprint marked as a PyTorch
    model (`block-as-pytorch`): identical code and MR, so only the framework check can keep it from winning."""
    from zen.attribute.invariants import packed
    from zen.library.store import Library
    from zen.represent import case

    lib = workdir / "keras-attr.sqlite"
    lib.unlink(missing_ok=True)
    zen("library", "add", base_case, "--name", "keras-block", "--library", lib)
    mr, pr, ur = case.load_mr(base_case), case.load_pr(base_case), case.load_ur(base_case)
    mr.framework = "pytorch"
    with Library(lib, invariants=packed) as db:
        db.add("block-as-pytorch", mr, pr, ur)
    return lib


def test_fork_attributed_to_its_base(keras_image, fork_image, workdir, tfpy):
    image, t = keras_image
    base_case = recovered(image, t, "block", workdir)[0]
    fimage, ft = fork_image
    fork_case, fmr, _, _ = recovered(fimage, ft, "fork", workdir)
    assert fmr["root"]["cls"] == "__main__.ForkBlock" and any(m["path"] == "proj" for m in fmr["modules"])
    lib = _library_with_foreign_twin(workdir, base_case)
    got = json.loads(zen("attribute", fork_case, "--library", lib, "--json").stdout)
    assert got["attributed"] == "keras-block", got
    names = [c["name"] for c in got["candidates"]]
    foreign = got["candidates"][names.index("block-as-pytorch")]
    assert foreign["method"] == "other framework" and "not attributed to a pytorch base" in foreign["note"]
    assert names[-1] == "block-as-pytorch" and foreign["ur"] == got["candidates"][0]["ur"]  # same score, refused
    text = " ".join(zen("attribute", fork_case, "--library", lib).stdout.split())
    assert "attributed to keras-block" in text and "Not attributable" in text and "block-as-pytorch" in text
    # the fork's own changed call is rebuilt from its recovered code: outputs bit-identical too
    pkg = workdir / "keras_reuse_fork"
    zen("reuse", fork_case, "-o", pkg)
    got = _verify(pkg, tfpy, ft.outdir / "fork-inputs.safetensors", ft.outdir / "fork-outputs.safetensors")
    assert got["ok"] and got["results"][0]["equal"] is True


def _in_scope(node: str, scope: str) -> bool:
    """Whether a data-flow node belongs to one layer's own `call`: its inputs/output or its direct sublayers."""
    if node.startswith(f"{scope or '<root>'}:"):
        return True
    rest = node[len(scope) + 1 :] if scope and node.startswith(f"{scope}.") else (node if not scope else "")
    return bool(rest) and "." not in rest and ":" not in rest


def test_subclassed_dataflow_from_call(keras_image, fork_image, workdir):
    """Data flow of the subclassed Block, its fork and the subclassed layer inside, recovered from `call` bytecode,
    equals what the target traced in an eager run (which sublayer's output feeds which call); the fork's changed
    `call` gives a different edge set, and Keras's own composite layers (MultiHeadAttention) are walked too."""
    got = {}
    for (image, t), name in ((keras_image, "block"), (fork_image, "fork")):
        _, mr, _, _ = recovered(image, t, name, workdir)
        truth, graph = t.truth["models"][name]["dataflow"], mr["graph"]
        assert truth["scopes"] == ["", "tables"] and len(truth["edges"]) >= 12
        assert not graph["dataflow_skipped"] and "call bytecode" in graph["dataflow_method"]
        got[name] = {(a, b) for a, b in graph["dataflow"] if any(_in_scope(a, s) and _in_scope(b, s) for s in truth["scopes"])}
        assert got[name] == {tuple(e) for e in truth["edges"]}, name
        edges = {tuple(e) for e in graph["dataflow"]}
        assert {("mha:in:query", "mha.query"), ("mha:in:value", "mha.value"), ("mha.query", "mha.attention_output")} <= edges
    assert {("norm1", "proj"), ("proj", "head")} <= got["fork"] - got["block"] and not got["block"] - got["fork"]


def test_cross_framework_attribution_refused(keras_image, workdir):
    """A model of one framework never attributes to a base of the other, in the fast and the reference path."""
    from zen.attribute.algorithm import attribute
    from zen.attribute.invariants import packed
    from zen.library.store import Library
    from zen.represent import case

    image, t = keras_image
    base_case = recovered(image, t, "block", workdir)[0]
    lib = _library_with_foreign_twin(workdir, base_case)
    mr, pr = case.load_mr(base_case), case.load_pr(base_case)
    mr.framework = "pytorch"  # the same model as a PyTorch query: only block-as-pytorch may be attributed
    with Library(lib, invariants=packed) as db:
        for reference in (False, True):
            res = attribute(mr, pr, db, reference=reference)
            assert res.attributed == "block-as-pytorch"
            assert [(c.name, c.method) for c in res.candidates][-1] == ("keras-block", "other framework")
        db.remove("block-as-pytorch")
        for reference in (False, True):
            res = attribute(mr, pr, db, reference=reference)
            assert res.attributed is None and "no pytorch base model" in res.message
            assert [c.method for c in res.candidates] == ["other framework"]
