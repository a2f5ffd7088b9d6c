"""Deployment forms (issue 47): real processes serving a model compiled, quantized, scripted or behind ONNX Runtime.

Each form's target (`targets/forms_target.py`) writes what its own `state_dict()` holds; zen must either recover
the model exactly (torch.compile: eager keys, every tensor bit-exact, a rebuilt model with the deployed outputs)
or say "partial" (exit 5) with problems that name the state it did not read and why, and refuse to write a
runnable copy. Never "complete" with state missing. The targets start together (one torch import each, in
parallel), each is imaged once (`zen acquire --lean`), the images are deleted at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import zen, zen_command
from core_edit import peek as _peek
from core_edit import poke as _poke
from forms_fixtures import digest as _digest
from forms_fixtures import get_form as _get
from forms_fixtures import rebuilt as _rebuilt
from forms_fixtures import recover_form as _recover

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

VNNI = "avx512_vnni" in Path("/proc/cpuinfo").read_text()


@pytest.mark.parametrize("form", ["compile", "compile-method"])
def test_compiled_model_is_recovered_as_eager(form_images, workdir, form):
    """torch.compile: keys as in eager (no `_orig_mod.`), every tensor bit-exact, the compilation recorded, and the
    rebuilt (eager) model gives the deployed model's outputs (compiled and eager may differ in the last bits: the
    difference is measured, not hidden) and its state_dict."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0, res.stderr
    assert manifest["status"] == "complete" and manifest["model"]["class"] == "__main__.Net"
    mr = json.loads((case / "mr.json").read_text())
    assert mr["deployment"]["form"] == "torch.compile"
    if form == "compile":
        assert mr["deployment"]["backend"] == "inductor" and mr["root"]["referenced_from"] == ["__main__.model"]
    else:
        assert mr["deployment"]["compiled_in_place"] == [""]
    weights = load_file(case / "weights.safetensors")
    assert sorted(weights) == sorted(t.truth["state"])
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    got = _rebuilt(workdir, case, form, t)
    assert got["state_equal"] and got["max_abs_diff"] <= 1e-5, got


@pytest.mark.parametrize("form", ["torchao-int8", "quanto-int8", "bnb-8bit", "bnb-4bit"])
def test_quantized_model_is_read_in_parts_and_rebuilt_exactly(form_images, workdir, form):
    """Tensor subclasses (torchao, quanto) and Parameter subclasses (bitsandbytes): every inner tensor read bit-exact
    (`KEY.NAME` in the weights file), the subclass recorded, the case complete; the rebuilt model is of the same
    classes, its own state_dict equals the deployed one (the library's serialization: torchao's subclasses,
    quanto's `weight._data`, bitsandbytes' `SCB` and `weight.absmax`...) and its outputs are bit-identical."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0, res.stderr
    assert manifest["status"] == "complete"
    mr = json.loads((case / "mr.json").read_text())
    weights = load_file(case / "weights.safetensors")
    subclassed = {x["key"]: x["python_type"] for x in mr["tensors"] if x["subclass"]}
    assert sorted(subclassed) == ["fc1.weight", "fc2.weight", "head.weight"], subclassed
    for key, cls in subclassed.items():
        assert t.truth["state"].get(key, {}).get("subclass", cls) == cls
    for key, d in t.truth["state"].items():
        for name, inner in (d.get("inner") or {}).items():  # torchao: the subclass's components
            assert _digest(weights[f"{key}.{name}"]) == inner["sha256"], (key, name)
        if "sha256" in d and key in weights:  # quanto's weight._data, plain biases
            assert _digest(weights[key]) == d["sha256"], key
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"], got
    # --dequantize: a float copy, every layer and weight a torch.nn one, outputs within the kernels' rounding
    flt = _rebuilt(workdir, case, form, t, "--dequantize")
    assert len(flt["report"]["dequantized"]) == 3, flt["report"]
    assert not [c for c in flt["classes"] if any(lib in c for lib in ("torchao", "quanto", "bitsandbytes"))], flt
    assert flt["max_abs_diff"] < 1e-2, flt
    if form == "torchao-int8":  # drift compares a subclass through its parts, grouped under the layer that owns it
        again = workdir / "case-form-torchao-int8-again"
        zen("recover", _get(form_images, form)[0], "-o", again)
        res = zen("drift", case, again, "-o", workdir / "drift-torchao", check=False)
        doc = json.loads((workdir / "drift-torchao" / "drift.json").read_text())
        assert "not compared" not in res.stderr and not doc["not_compared"], res.stderr
        assert sorted(x["name"] for x in doc["layers"]) == ["fc1", "fc2", "head"]


def test_cpu_offloaded_model_is_read_from_the_hooks_map(form_images, workdir):
    """accelerate's cpu_offload: the parameters are on `meta`, the data in the hooks' weights_map (CPU tensors in the
    image): read from there bit-exact, the case complete, the hooks left out of the rebuild (which runs on the
    package's weights, never fetching from elsewhere), outputs bit-identical."""
    res, case, manifest, t = _recover(form_images, "offload-cpu", workdir)
    assert res.returncode == 0 and manifest["status"] == "complete", res.stderr
    mr = json.loads((case / "mr.json").read_text())
    assert all(x["device"] == "meta" and x["offload"]["from"] == "memory" for x in mr["tensors"])
    assert mr["deployment"]["form"] == "accelerate" and mr["deployment"]["offloaded_from"] == ["memory"]
    weights = load_file(case / "weights.safetensors")
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    got = _rebuilt(workdir, case, "offload-cpu", t)
    assert got["equal"] and got["state_equal"], got


def test_disk_offloaded_model_names_its_files_and_reads_them_when_given(form_images, workdir):
    """accelerate's disk offload: without the files, partial, each tensor naming the file accelerate would read (from
    the hook's index), and no package; with `--offload DIR`, read from the files (sha256 in the evidence, each tensor
    marked), complete, and rebuilt bit-identical."""
    res, case, manifest, t = _recover(form_images, "offload-disk", workdir)
    assert res.returncode == 5 and manifest["status"] == "partial", res.stderr
    offdir = t.outdir / "offload"
    for key in ("fc2.weight", "fc2.bias", "head.weight", "head.bias"):
        assert any(p.startswith(f"{key}: offloaded") and str(offdir / f"{key}.dat") in p for p in manifest["problems"]), key
    refused = zen("reuse", case, "-o", workdir / "refused_offload", check=False)
    assert refused.returncode == 5 and "fc2.weight.dat" in refused.stderr
    img = _get(form_images, "offload-disk")[0]
    missing = zen("recover", img, "-o", workdir / "no-case", "--offload", offdir / "nope", check=False)
    assert missing.returncode == 2 and "--offload" in missing.stderr and "no such file" in missing.stderr, missing.stderr
    assert not (workdir / "no-case").exists() and "Traceback" not in missing.stderr
    res, case, manifest, t = _recover(form_images, "offload-disk", workdir, "--offload", offdir)
    assert res.returncode == 0 and manifest["status"] == "complete", res.stderr
    files = {Path(e["path"]).name: e for e in manifest["evidence"]["offload"]}
    assert sorted(files) == ["fc2.bias.dat", "fc2.weight.dat", "head.bias.dat", "head.weight.dat"]
    assert all(e["sha256"] == hashlib.sha256((offdir / n).read_bytes()).hexdigest() for n, e in files.items())
    weights = load_file(case / "weights.safetensors")
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    mr = json.loads((case / "mr.json").read_text())
    assert "given with --offload" in mr["tensors"][2]["note"]
    got = _rebuilt(workdir, case, "offload-disk", t)
    assert got["equal"] and got["state_equal"], got


def test_the_served_model_is_chosen_and_every_model_can_be_written(form_images, workdir):
    """A float reference kept beside the served int8 model: zen picks the one running code uses (the serving loop
    loads the global `model`), says so, lists the reference as merely alive; `--model all` writes a case for each."""
    res, case, manifest, t = _recover(form_images, "several", workdir)
    assert res.returncode == 0, res.stderr
    mr = json.loads((case / "mr.json").read_text())
    served, reference = mr["roots"][0], next(r for r in mr["roots"] if r["address"] == hex(t.truth["reference_id"]))
    assert served["address"] == hex(t.truth["served_id"]) and mr["root"]["address"] == served["address"]
    assert "global model loaded by the live frame serve" in served["served_by"] and not reference["served_by"]
    assert manifest["model"]["selected_by"] == "rank 1 (served by running code)"
    img, _ = _get(form_images, "several")
    every = workdir / "cases-several"
    res = zen("recover", img, "-o", every, "--model", "all", check=False)
    assert res.returncode == 0, res.stderr
    dirs = sorted(p.name for p in every.iterdir())
    assert dirs == ["1-Net", f"{reference['rank']}-Net"], dirs
    ref = json.loads((every / dirs[1] / "mr.json").read_text())
    assert ref["root"]["address"] == reference["address"] and len(ref["tensors"]) == 6
    assert all(x["python_type"] == "torch.nn.parameter.Parameter" for x in ref["tensors"])
    assert json.loads((every / "1-Net" / "manifest.json").read_text())["status"] == "complete"


def test_subclasses_holding_each_other_are_read_once_and_bounded(form_images, workdir):
    """Hostile: 30 wrapper-subclass tensors, each holding all the others as inner tensors. Expanding every part at
    every level would make 30**4 records; each object is read once (a later meeting points to the first), the
    nesting bound cuts the rest with a true problem, and the case is partial, quickly, without a traceback."""
    res, case, manifest, t = _recover(form_images, "hostile-ring", workdir)
    assert res.returncode == 5 and "Traceback" not in res.stderr, res.stderr
    mr = json.loads((case / "mr.json").read_text())
    assert len(mr["tensors"]) < 2000, len(mr["tensors"])
    assert any("nested deeper than" in p for p in manifest["problems"])
    assert any(x["tied_to"] and "whose parts are read there" in x["note"] for x in mr["tensors"])
    assert not any("pages are not in the image" in p for p in manifest["problems"])


def test_drift_of_nan_weights_says_so_without_a_raw_warning(form_images, workdir):
    """Issue 49.6: weights holding NaN and inf made `zen drift` print numpy's RuntimeWarning with a source line; the
    metrics that are undefined are now '-' (null in drift.json) and one problem says which tensors and why."""
    res, case, manifest, t = _recover(form_images, "nan-weights", workdir)
    assert res.returncode == 0, res.stderr
    again = workdir / "case-form-nan-weights-again"
    zen("recover", _get(form_images, "nan-weights")[0], "-o", again)
    out = workdir / "drift-nan"
    res = zen("drift", case, again, "-o", out, check=False)
    assert "RuntimeWarning" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "3 tensor(s) hold NaN or infinite values (fc1.weight, fc2.weight, head.bias)" in res.stderr, res.stderr
    doc = json.loads((out / "drift.json").read_text())
    fc1 = next(x for x in doc["layers"] if x["name"] == "fc1")["snapshots"][0]
    assert fc1["l2"] is None and fc1["nonfinite"] == 4 and fc1["changed"] == 0.0


def test_onnx_runtime_session_is_named_not_a_leftover_module(form_images, workdir):
    """An ONNX Runtime process: exit 6 naming the session and the file it loaded, never a leftover module as the model."""
    res, case, manifest, t = _recover(form_images, "ort", workdir)
    assert res.returncode == 6, res.stderr
    assert "ONNX Runtime session holds the model" in res.stderr and "model.onnx" in res.stderr
    assert manifest is None and "Traceback" not in res.stderr


@pytest.mark.parametrize("form", ["dynamic", "dynamic-per-channel", "dynamic-fp16"])
def test_packed_quantized_weights_are_unpacked_and_repacked_exactly(form_images, workdir, form):
    """Dynamic quantization (issue 48): fbgemm keeps each Linear's int8 (or float16) weight only in a packed C++
    object. zen unpacks it (the blocking read from the object), with its scales, zero points and bias: complete,
    bit-exact against the deployed `state_dict()`'s (weight, bias) tuples, per-tensor, per-channel and float16; the
    rebuilt model packs them again with PyTorch's own prepack and gives the deployed outputs bit for bit, and the
    same state_dict."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0, res.stderr
    assert manifest["status"] == "complete", manifest["problems"]
    weights = load_file(case / "weights.safetensors")
    records = {r["key"]: r for r in json.loads((case / "mr.json").read_text())["tensors"]}
    packed = {k: v for k, v in t.truth["state"].items() if v.get("value_type") == "tuple"}
    assert len(packed) == 3
    for key, v in packed.items():
        w, b = v["items"]
        assert _digest(weights[f"{key}.weight"]) == w["sha256"] and _digest(weights[f"{key}.bias"]) == b["sha256"]
        q = records[f"{key}.weight"]["quantization"]
        if form == "dynamic-fp16":  # float16 blocks, widened to the float32 weight PyTorch's unpack gives
            assert q["dtype"] == "float16" and w["dtype"] == "float32" and records[f"{key}.weight"]["dtype"] == "float32"
        else:
            assert (q["qscheme"], q["scale"], q["zero_point"]) == (w["qscheme"], w["scale"], w["zero_point"]), key
        assert q["packed"]["engine"] == "fbgemm"
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"], got


def _fbgemm_layout_left_unread(res, case, manifest, t, module: str, layout: str) -> bool:
    """Whether the case is the true partial zen gives where fbgemm packed `module` in a layout zen does not read yet,
    checked: exit 5, status partial, every problem about that module and one naming the layout, the module's weight
    not written, and every tensor that was written the deployed state's bit for bit.

    Where: CPUs without AVX512-VNNI (this project's CI machines have had both kinds). PyTorch's x86 engine gives a
    quantized transposed convolution to oneDNN only with VNNI (`should_use_onednn_quant`), else to fbgemm, whose
    transposed packing zen does not unpack; and fbgemm packs a grouped convolution with its group-wise kernel there
    (`PackWeightMatrixForGConv`), not as one im2col matrix per group. Partial and named, never a wrong weight."""
    if VNNI or res.returncode != 5:
        return False
    problems = manifest["problems"]
    assert manifest["status"] == "partial" and problems, problems
    assert all(p.startswith((f"{module} (", f"{module}.")) for p in problems), problems
    assert any(layout in p and "a layout zen does not read yet" in p for p in problems), problems
    weights = load_file(case / "weights.safetensors")
    state = t.truth["state"]
    assert f"{module}.weight" not in weights and weights, sorted(weights)
    assert all(_digest(v) == state[k]["sha256"] for k, v in weights.items() if "sha256" in state.get(k, {})), sorted(weights)
    return True


@pytest.mark.parametrize("form", ["static-convtranspose", "static-convtranspose1d", "static-conv3d", "static-conv3d-fbgemm"])
def test_transposed_and_3d_quantized_convolutions_are_read_from_the_weight_kept(form_images, workdir, form):
    """Quantized ConvTranspose2d, ConvTranspose1d and Conv3d (issue 48): fbgemm packs no transposed convolution, and
    the x86 engine gives a Conv3d to oneDNN on VNNI CPUs; oneDNN's object keeps the quantized weight it was made from
    ((in, out, k...) transposed; a 1-d one's packed as (in, out, 1, k); (out, in, kt, kh, kw)): read with its
    quantizer's scales, complete, bit-exact, and rebuilt (packed again by PyTorch) with the deployed outputs bit for
    bit. fbgemm's own 3-d packing (`PackWeightsForConv<3>`, its matrices after a larger conv_param_t) is unpacked
    (the same test on a CPU without AVX512-VNNI, where the x86 engine packs the Conv3d with fbgemm)."""
    vnni = "avx512_vnni" in Path("/proc/cpuinfo").read_text()  # without it the x86 engine gives a Conv3d to fbgemm
    res, case, manifest, t = _recover(form_images, form, workdir)
    if form.startswith("static-convtranspose") and _fbgemm_layout_left_unread(res, case, manifest, t, "1", "fbgemm packed"):
        return  # no VNNI: fbgemm packed the transposed convolution (zen names it; the rest is read)
    assert res.returncode == 0 and manifest["status"] == "complete", manifest["problems"]
    weights = load_file(case / "weights.safetensors")
    rec = next(r for r in json.loads((case / "mr.json").read_text())["tensors"] if r["key"] == "1.weight")
    state = t.truth["state"]
    assert all(_digest(weights[k]) == state[k]["sha256"] for k in ("1.weight", "1.bias"))
    kind = form.removeprefix("static-").removesuffix("-fbgemm") + ("2d" if form == "static-convtranspose" else "")
    shape = {"convtranspose2d": [3, 4, 3, 3], "convtranspose1d": [3, 4, 3], "conv3d": [4, 3, 3, 3, 3]}[kind]
    assert rec["shape"] == shape and rec["quantization"]["packed"]["kind"] == kind, rec
    fbgemm = form.endswith("fbgemm") or (form == "static-conv3d" and not vnni)
    engine = ("fbgemm",) if fbgemm else ("onednn", "qnnpack")
    assert rec["quantization"]["packed"]["engine"] in engine, rec
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"], got


@pytest.mark.parametrize("form,engine", [("static-cnn", None), ("static-cnn-fbgemm", "fbgemm"), ("static-depthwise", "fbgemm"),
                                         ("static-cnn-onednn", "onednn"), ("static-cnn-qnnpack", "qnnpack"),
                                         ("static-conv1d", None), ("static-conv1d-fbgemm", "fbgemm"),
                                         ("static-grouped", "fbgemm")])  # fmt: skip
def test_static_quantized_models_are_read_from_each_engines_objects(form_images, workdir, form, engine):
    """Static quantization (issue 48): quantized Conv2ds and Linears keep their int8 weights only in C++ objects, a
    different class per engine, told apart by their RTTI. fbgemm's (re-blocked) are unpacked; oneDNN's and QNNPACK's
    keep the quantized weight they were made from, read as stored with its quantizer's scales and zero points. PyTorch's
    default x86 engine packs the default qconfig's symmetric convolution weights with oneDNN on AVX512-VNNI CPUs and
    with fbgemm elsewhere; fbgemm packs a depthwise convolution its own way (unpacked too). Each: complete, every
    weight and bias bit-exact under the module's own state_dict keys, the scales and zero points those of the
    deployed state_dict, and the rebuilt model (packed again by PyTorch) gives the deployed outputs bit for bit. A Conv1d
    is packed as a Conv2d of kernel (1, k): read the same way, its weight 3-d as its state_dict holds it. A grouped
    convolution: fbgemm packs each group's matrix alone, one after another."""
    vnni = "avx512_vnni" in Path("/proc/cpuinfo").read_text()
    res, case, manifest, t = _recover(form_images, form, workdir)
    if form == "static-grouped" and _fbgemm_layout_left_unread(res, case, manifest, t, "3", ") grouped"):
        return  # no VNNI: fbgemm's group-wise packing (zen names it; the rest is read)
    assert res.returncode == 0 and manifest["status"] == "complete", manifest["problems"]
    weights = load_file(case / "weights.safetensors")
    records = {r["key"]: r for r in json.loads((case / "mr.json").read_text())["tensors"]}
    state = t.truth["state"]
    assert all(_digest(weights[k]) == state[k]["sha256"] for k in ("1.weight", "1.bias"))
    q = records["1.weight"]["quantization"]
    assert (q["qscheme"], q["scale"], q["zero_point"]) == (state["1.weight"]["qscheme"], state["1.weight"]["scale"],
                                                          state["1.weight"]["zero_point"])  # fmt: skip
    conv_engine = engine or ("onednn" if vnni else "fbgemm")
    assert q["packed"]["engine"] == conv_engine and records["1.weight"]["shape"] == [8, 3, 3] + [3] * ("conv1d" not in form)
    if "conv1d" in form:
        assert _digest(weights["3.weight"]) == state["3.weight"]["sha256"] and records["3.weight"]["shape"] == [4, 8, 3]
    if form == "static-depthwise":
        assert _digest(weights["3.weight"]) == state["3.weight"]["sha256"] and records["3.weight"]["shape"] == [8, 1, 3, 3]
        assert records["3.weight"]["quantization"]["packed"]["algorithm"] == "depthwise"
    if form == "static-grouped":  # 4 groups, each group's matrix packed alone
        assert _digest(weights["3.weight"]) == state["3.weight"]["sha256"] and records["3.weight"]["shape"] == [8, 2, 3, 3]
        assert records["3.weight"]["quantization"]["packed"]["groups"] == 4
    key = next(k for k in state if k.endswith("._packed_params._packed_params"))
    w, b = state[key]["items"]
    assert _digest(weights[f"{key}.weight"]) == w["sha256"] and _digest(weights[f"{key}.bias"]) == b["sha256"]
    lin = records[f"{key}.weight"]["quantization"]
    assert (lin["scale"], lin["zero_point"], lin["packed"]["engine"]) == (w["scale"], w["zero_point"], engine or "fbgemm")
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["max_abs_diff"] == 0 and got["state_equal"], got


@pytest.mark.parametrize("form", ["static-embedding", "static-embedding-4bit"])
def test_a_quantized_embedding_table_is_read_from_its_packed_object(form_images, workdir, form):
    """Weight-only quantized EmbeddingBag (issue 48): its table lives only in fbgemm's PackedEmbeddingBagWeight (fused
    rows: 8-bit values then a float scale and bias; 4-bit: two values a byte, the low nibble first, then a half
    scale and bias) and the per-row float qparams. Complete, the table bit-exact under the state_dict's
    `_packed_weight` key (4-bit: the bytes of its quint4x2 storage) with its qparams, and the rebuilt model identical."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0 and manifest["status"] == "complete", manifest["problems"]
    want, key = t.truth["state"]["0._packed_params._packed_weight"], "0._packed_params._packed_weight"
    q = {r["key"]: r for r in json.loads((case / "mr.json").read_text())["tensors"]}[key]["quantization"]
    assert _digest(load_file(case / "weights.safetensors")[key]) == want["sha256"]
    dtype = "quint4x2" if form.endswith("4bit") else "quint8"
    assert (q["dtype"], q["scale"], q["zero_point"]) == (dtype, want["scale"], want["zero_point"]), q
    assert q["packed"]["columns"] == 8 and q["packed"]["bit_rate"] == (4 if form.endswith("4bit") else 8), q
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["max_abs_diff"] == 0 and got["state_equal"], got


def test_packed_and_scripted_state_without_a_measured_layout_is_partial(form_images, workdir, tmp_path):
    """A torch profile calibrated before zen measured TorchScript and packed-weight layouts: never complete, a problem
    that says what is missing and how to measure it, exit 5, and no runnable copy."""
    from importlib import resources

    if not torch.__version__.startswith("2.13"):
        pytest.skip(f"the shipped profile edited here is torch 2.13's (this torch: {torch.__version__})")
    prof = json.loads(resources.files("zen.frontends.pytorch").joinpath("profiles", "torch-2.13-x86_64.json").read_text())
    for s in ("pybind", "jitmodule", "jitobject", "ivalue", "classtype", "classattr", "stdstring", "conststring",
              "packedlinear", "packb"):  # fmt: skip
        prof["structs"].pop(s)
    (tmp_path / "torch-2.13-x86_64.json").write_text(json.dumps(prof))
    env = {**os.environ, "ZEN_PROFILE_DIR": str(tmp_path)}
    for form, says in (("jit-load", "no TorchScript layout"), ("dynamic", "no packed-object layout")):
        img, _ = _get(form_images, form)
        case = tmp_path / f"case-{form}"
        res = zen_command("recover", img, "-o", case, cwd=tmp_path, check=False, env=env)
        assert res.returncode == 5, res.stderr
        manifest = json.loads((case / "manifest.json").read_text())
        text = "\n".join(manifest["problems"])
        assert manifest["status"] == "partial" and says in text and "zen profile torch" in text, text
        refused = zen_command("reuse", case, "-o", tmp_path / f"pkg_{form.replace('-', '_')}", cwd=tmp_path, check=False)
        assert refused.returncode == 5 and "did not read" in refused.stderr, refused.stderr


def test_hostile_cpp_objects_are_bounded_and_named(form_images, workdir, tmp_path):
    """Hand-built hostile images (issue 48): a TorchScript Object claiming ten million slots, a ClassType attribute
    name claiming a gigabyte, a packed weight claiming a million rows. Each is a bounded read that fails into a
    partial case naming what was not read (exit 5): never a crash, a hang or a huge allocation."""
    import struct
    from importlib import resources

    if not torch.__version__.startswith("2.13"):
        pytest.skip("offsets from the shipped torch 2.13 profile")
    profile = json.loads(resources.files("zen.frontends.pytorch").joinpath("profiles", "torch-2.13-x86_64.json").read_text())
    off = {f"{s}.{f}": v[0] for s, d in profile["structs"].items() for f, v in d["fields"].items()}
    good = {}
    for form in ("jit-load", "dynamic"):
        res, case, _, _ = _recover(form_images, form, workdir)
        assert res.returncode == 0, res.stderr
        good[form] = json.loads((case / "mr.json").read_text())
    img_jit, img_dyn = _get(form_images, "jit-load")[0], _get(form_images, "dynamic")[0]
    obj = int(good["jit-load"]["deployment"]["object"], 16)
    slots = obj + off["jitobject.slots"]
    attrs = _peek(img_jit, _peek(img_jit, obj + off["jitobject.type"]) + off["classtype.attributes"])
    plw = int(next(t for t in good["dynamic"]["tensors"] if t.get("quantization"))["quantization"]["packed"]["object"], 16)
    packb = _peek(img_dyn, plw + off["packedlinear.packb"])
    hostile = {  # name -> (image, address, bytes, what the problem must say)
        "slots": (img_jit, slots + 8, struct.pack("<Q", _peek(img_jit, slots) + 16 * 10**7), "slots for"),
        "name": (img_jit, attrs + off["classattr.name"] + off["stdstring.size"], struct.pack("<Q", 1 << 30), "limit"),
        "packed": (img_dyn, packb + off["packb.nrows"], struct.pack("<i", 1 << 20), "not a consistent fbgemm"),
    }
    for name, (img, addr, data, says) in hostile.items():
        bad = _poke(img, tmp_path / f"{name}.core", addr, data)
        case = tmp_path / f"case-{name}"
        res = zen("recover", bad, "-o", case, check=False, timeout=300)
        bad.unlink()
        assert res.returncode == 5 and "Traceback" not in res.stderr, (name, res.stderr[-2000:])
        manifest = json.loads((case / "manifest.json").read_text())
        assert manifest["status"] == "partial" and says in "\n".join(manifest["problems"]), (name, manifest["problems"])
