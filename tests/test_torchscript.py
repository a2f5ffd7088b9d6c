"""TorchScript deployments (issue 48): real processes serving a model scripted, traced or `torch.jit.load`ed.

zen reads the served ScriptModule's C++ module tree (every tensor bit-exact under PyTorch's keys), links a model
scripted in the process to the Python classes it was compiled from, reads a loaded model's TorchScript code from
the image, and rebuilds each (from the classes, or as a TorchScript archive) with the deployed outputs bit for bit;
what it cannot rebuild (a model traced in the process: graphs, no code text) it refuses, naming why. The targets
are the deployment-form targets (`forms_fixtures`), started and imaged once per session.
"""

from __future__ import annotations

import json

import pytest
from conftest import zen
from core_edit import peek as _peek
from core_edit import poke as _poke
from core_edit import read as _read
from forms_fixtures import digest as _digest
from forms_fixtures import get_form as _get
from forms_fixtures import rebuilt as _rebuilt
from forms_fixtures import recover_form as _recover

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402


@pytest.mark.parametrize("form", ["jit-trace", "jit-script", "jit-load"])
def test_torchscript_model_is_read_from_its_cpp_module(form_images, workdir, form):
    """TorchScript (issue 48): the served ScriptModule's C++ tree is read through its `_c`: complete, every state_dict
    tensor bit-exact under PyTorch's own keys, the module tree with the eager class names (TorchScript's mangled
    names demangled), one root (the wrappers of its submodules are not models of their own, a traced module's
    inner script module neither); its data-flow edges, read from the forward graphs, are the eager model's. Scripted
    in the process: every module linked to the Python class it was compiled
    from (torch's concrete type store), and `zen reuse` rebuilds it: outputs bit-identical. jit.load'ed: no such
    link, but its TorchScript code is in the image: `zen reuse` writes a TorchScript archive (bit-identical through
    torch.jit.load). Traced here: no link and no code text, only graphs: zen prints them again (op names, types and
    constants read from the image) and `zen reuse` writes an archive of that code (bit-identical too)."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0, res.stderr
    assert manifest["status"] == "complete" and manifest["model"]["class"] == "__main__.Net", manifest["problems"]
    mr = json.loads((case / "mr.json").read_text())
    assert mr["deployment"]["form"] == "torchscript" and mr["deployment"]["script_class"].endswith(".Net")
    assert mr["root"]["address"] == f"{t.truth['served_id']:#x}" and mr["root"]["served_by"]
    weights = load_file(case / "weights.safetensors")
    assert sorted(weights) == sorted(t.truth["state"])
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    assert {m["path"]: m["cls_module"] + "." + m["cls_qualname"] for m in mr["modules"]} == {
        "": "__main__.Net", "fc1": "torch.nn.modules.linear.Linear", "act": "torch.nn.modules.activation.ReLU",
        "fc2": "torch.nn.modules.linear.Linear", "head": "torch.nn.modules.linear.Linear"}  # fmt: skip
    assert all(m["training"] is False for m in mr["modules"])  # the target serves in eval()
    scripted_roots = [r for r in mr["roots"] if r["cls"] != "__main__.Net"]
    assert scripted_roots == [], scripted_roots
    # data-flow edges from the forward graphs, as the eager path reads them from bytecode (torch.compile's case is
    # the same Net recovered as eager)
    _, compiled, _, _ = _recover(form_images, "compile", workdir)
    eager_edges = json.loads((compiled / "mr.json").read_text())["graph"]["dataflow"]
    assert ["<root>:in:x", "fc1"] in eager_edges and ["head", "<root>:out"] in eager_edges, eager_edges
    got = mr["graph"]["dataflow"]
    if form == "jit-trace":  # the trace recorded act's second call as an inlined relu: fc2 feeds head directly
        calls = [e for e in got if ":" not in e[0] + e[1]]
        assert calls == [["act", "fc2"], ["fc1", "act"], ["fc2", "head"]] and ["<root>:in:x", "fc1"] in got, got
    else:
        assert got == eager_edges, got
    assert not mr["graph"]["dataflow_skipped"], mr["graph"]
    ops = mr["graph"]["operators"]  # the MR's operators, named from libtorch_cpu's symbol table; a scripted ReLU
    assert all(ops[p].get("aten::linear") == 1 for p in ("fc1", "fc2", "head")), ops  # calls F.relu, not followed
    assert ("aten::relu" in ops["act"]) == (form == "jit-trace"), ops
    eager = mr["deployment"]["eager"]
    if form == "jit-script":
        assert eager["complete"] and eager["classes"][""] == "__main__:Net" and len(eager["classes"]) == 5, eager
        got = _rebuilt(workdir, case, form, t)
        assert got["equal"] and got["state_equal"], got
        return
    assert not eager["complete"] and eager["missing_count"] == 5, eager
    if form == "jit-load":  # its TorchScript code is in the image: rebuilt as an archive torch.jit.load accepts
        code = mr["deployment"]["torchscript"]
        assert not code["missing"] and "class Net(Module):" in code["files"]["code/__torch__.py"], code
        got = _rebuilt(workdir, case, form, t)
        assert got["equal"] and got["state_equal"] and got["model_class"].endswith("RecursiveScriptModule"), got
        return
    # traced here: no code text, only graphs, printed again as TorchScript IR with every call inlined (trace_ir)
    trace = mr["deployment"]["torchscript"]["trace"]
    assert not trace["refused"] and not trace["problems"], trace
    assert trace["plans"]["__torch__.Net"]["operators"] == {"aten::linear": 3, "aten::relu": 2}, trace["plans"]
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"] and got["model_class"].endswith("RecursiveScriptModule"), got


@pytest.mark.parametrize("form", ["jit-script-cnn", "jit-load-cnn"])
def test_a_scripted_cnn_keeps_its_constants_and_tuples_in_its_classes(form_images, workdir, form):
    """A scripted CNN (issue 48): strides, paddings, padding modes and BatchNorm's eps and momentum are TorchScript
    class constants, tuples and strings, read with the layout `zen profile torch` measured; the rebuilt model
    (the classes it was scripted from, given those values; loaded: a TorchScript archive of its code, whose short
    tuples the loader kept inline) gives the deployed outputs bit for bit."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0 and manifest["status"] == "complete", res.stderr
    mr = json.loads((case / "mr.json").read_text())
    conv, bn, pool = (next(m for m in mr["modules"] if m["path"] == p) for p in ("0", "1", "5"))
    assert conv["hyperparameters"]["stride"] == "(2, 2)" and conv["hyperparameters"]["padding"] == "(1, 1)", conv
    assert conv["state"]["kernel_size"] == {"tuple": [{"lit": "3"}, {"lit": "3"}]}, conv["state"]
    assert bn["hyperparameters"]["eps"] == "1e-05" and bn["hyperparameters"]["momentum"] == "0.1", bn
    assert pool["hyperparameters"]["output_size"] == "(2, 2)", pool
    assert next(m for m in mr["modules"] if m["path"] == "4")["hyperparameters"]["padding_mode"] == "'reflect'"
    weights = load_file(case / "weights.safetensors")
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items()) and len(weights) == 11
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"], got


def _source_of(img, off: dict, obj: int, name: str) -> int:
    """The Source holding code file `name` of a jit.load'ed model's image, walked the way zen walks it."""
    cu = _peek(img, _peek(img, obj + off["jitobject.type"]) + off["classtype.compilation_unit"])
    begin, end = _peek(img, cu + off["compilationunit.functions"]), _peek(img, cu + off["compilationunit.functions"] + 8)
    for i in range((end - begin) // 8):
        graph = _peek(img, _peek(img, begin + 8 * i) + off["graphfunction.graph"])
        block = _peek(img, graph + off["jitgraph.block"])
        node, last = _peek(img, block + off["jitblock.input"]), _peek(img, block + off["jitblock.output"])
        for _ in range(1000):
            src = _peek(img, node + off["jitnode.source"])
            try:
                if _read(img, _peek(img, src + off["jitsource.filename"]), len(name)) == name.encode():
                    return src
            except AssertionError:  # a stale word: not in the image
                pass
            if node == last:
                break
            node = _peek(img, node + off["jitnode.next"])
    raise AssertionError(f"{name} not found")


def _hostile_setup(form_images, workdir, form: str) -> tuple:
    """(the shipped 2.13 profile, its offsets as "struct.field", the served module's C++ Object, the form's image)."""
    from importlib import resources

    if not torch.__version__.startswith("2.13"):
        pytest.skip("offsets from the shipped torch 2.13 profile")
    profile = json.loads(resources.files("zen.frontends.pytorch").joinpath("profiles", "torch-2.13-x86_64.json").read_text())
    off = {f"{s}.{f}": v[0] for s, d in profile["structs"].items() for f, v in d["fields"].items()}
    _, case, _, _ = _recover(form_images, form, workdir)
    obj = int(json.loads((case / "mr.json").read_text())["deployment"]["object"], 16)
    return profile, off, obj, _get(form_images, form)[0]


def test_hostile_torchscript_code_is_bounded_and_named(form_images, workdir, tmp_path):
    """Hand-built hostile images of a jit.load'ed model's code (issue 48): a code file claiming ten million text
    pieces, a file name claiming a gigabyte, a compilation unit claiming a billion functions. The model's state is
    still read (complete), the file is named missing, and `zen reuse` refuses naming it: no hang, no huge read. A
    graph node claiming a billion inputs: its module's data flow is skipped and named."""
    import struct

    _, off, obj, img = _hostile_setup(form_images, workdir, "jit-load")
    src = _source_of(img, off, obj, "code/__torch__.py")
    cu = _peek(img, _peek(img, obj + off["jitobject.type"]) + off["classtype.compilation_unit"])
    fns = cu + off["compilationunit.functions"]
    hostile = {  # name -> (address, bytes, the file named missing)
        "pieces": (src + off["jitsource.pieces"] + 8, struct.pack("<Q", _peek(img, src) + 16 * 10**7), "code/__torch__.py"),
        "filename": (src + off["jitsource.filename"] + 8, struct.pack("<Q", 1 << 30), "code/__torch__.py"),
        "functions": (fns + 8, struct.pack("<Q", _peek(img, fns) + 8 * 10**9), "code/__torch__.py"),
    }
    for name, (addr, data, missing) in hostile.items():
        bad = _poke(img, tmp_path / f"{name}.core", addr, data)
        case = tmp_path / f"case-{name}"
        res = zen("recover", bad, "-o", case, check=False, timeout=300)
        bad.unlink()
        assert res.returncode == 0 and "Traceback" not in res.stderr, (name, res.stderr[-2000:])
        ts = json.loads((case / "mr.json").read_text())["deployment"]["torchscript"]
        assert missing in ts["missing"], (name, ts["missing"], ts["problems"])
        refused = zen("reuse", case, "-o", tmp_path / f"pkg_{name}", check=False)
        assert refused.returncode == 5 and missing in refused.stderr, (name, refused.stderr)
    # the forward graph's return node claiming a billion inputs: that module's data flow is skipped, named
    ct = _peek(img, obj + off["jitobject.type"])
    graph = _peek(img, _peek(img, _peek(img, ct + off["classtype.methods"])) + off["graphfunction.graph"])
    ret = _peek(img, _peek(img, graph + off["jitgraph.block"]) + off["jitblock.output"])
    at = ret + off["jitnode.inputs"]
    bad = _poke(img, tmp_path / "inputs.core", at + 8, struct.pack("<Q", _peek(img, at) + 8 * 10**9))
    res = zen("recover", bad, "-o", tmp_path / "case-inputs", check=False, timeout=300)
    bad.unlink()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    graph = json.loads((tmp_path / "case-inputs" / "mr.json").read_text())["graph"]
    assert "implausible vector" in graph["dataflow_skipped"].get("", ""), graph


def test_an_archive_is_refused_for_hostile_names():
    """A class name read from the image becomes a pickle GLOBAL in data.pkl (newline-terminated), a code file name a
    path in the archive: a class name that is not a dotted identifier (a newline and opcodes, say) or a file name
    torch.jit.save would not write (`..`) is refused, named, before anything is written."""
    from types import SimpleNamespace

    from zen.reuse.torchscript_archive import archive_problems

    code = {"code/__torch__.py": "class Net(Module):\n  pass\n"}
    good = {"classes": {"": "__torch__.Net"}, "files": code, "missing": [], "conflicts": [], "problems": []}
    mr = SimpleNamespace(deployment={"torchscript": good}, tensors=[], modules=[])
    assert archive_problems(mr) == []
    mr.deployment["torchscript"] = {**good, "classes": {"": "__torch__.Net\nc os\nsystem"}}
    assert any("is not a qualified name" in p for p in archive_problems(mr)), archive_problems(mr)
    mr.deployment["torchscript"] = {**good, "files": {"code/../../etc/x.py": "", **code}}
    assert any("is not one torch.jit.save writes" in p for p in archive_problems(mr)), archive_problems(mr)
    # code naming a tensor constant whose value was not read from the image: refused, the constant named
    uses = {"code/__torch__.py": "class Net(Module):\n  def forward(self, x):\n    return x * CONSTANTS.c3\n"}
    mr.deployment["torchscript"] = {**good, "files": uses, "tensor_constants": {"c0": {}}}
    assert any("CONSTANTS.c3, whose value was not found" in p for p in archive_problems(mr)), archive_problems(mr)


def test_state_zen_does_not_decode_is_named(form_images, workdir):
    """A scripted module holding an instance of a TorchScript class (`torch.jit.script` of a plain class): a C++
    object zen does not decode. The case is partial, the problem names the attribute, its module and the class; the
    Linear beside it is still read, bit-exact; no runnable copy is written."""
    res, case, manifest, t = _recover(form_images, "jit-script-object", workdir)
    problems = " ".join(manifest["problems"])
    assert res.returncode == 5 and manifest["status"] == "partial", problems
    assert "cfg (__torch__.WithObject" in problems and "an instance of TorchScript class __torch__.Scale" in problems
    weights = load_file(case / "weights.safetensors")
    assert sorted(weights) == ["fc.bias", "fc.weight"]
    assert all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    pkg = workdir / "refused_jit_script_object"
    assert zen("reuse", case, "-o", pkg, check=False).returncode == 5 and not pkg.exists()


@pytest.mark.parametrize("form", ["jit-trace-cnn", "jit-load-trace-cnn"])
def test_a_traced_cnn_is_printed_again_from_its_graphs(form_images, workdir, form):
    """A CNN traced in the process (issue 48): sizes as values (`aten::size`, `prim::NumToTensor`), a view, 0-dim and
    1-d tensor constants, a tensor list, a tuple output, BatchNorm's running statistics, a module called twice
    (`forward1`). Every graph is printed again from the image (op names from libtorch_cpu's interned strings,
    constants' values), the tensor constants' values are the traced ones, and the archive rebuilt from it gives
    the deployed outputs bit for bit. Saved and loaded (-load-): its code names the constants `CONSTANTS.c0` and
    `.c1`; their values are read from the graph nodes whose source ranges cover those names, and written to the
    rebuilt archive's constants.pkl."""
    res, case, manifest, t = _recover(form_images, form, workdir)
    assert res.returncode == 0 and manifest["status"] == "complete", res.stderr
    code = json.loads((case / "mr.json").read_text())["deployment"]["torchscript"]
    traced = [float(torch.tensor(v)) for v in (0.25, -1.5, 3.0, 0.0, 1e-3, 2.0, -2.0, 0.5, 7.0, 1.0)]
    if form == "jit-trace-cnn":
        trace = code["trace"]
        assert not trace["refused"] and not trace["problems"], trace
        top = trace["plans"]["__torch__.TracedCNN"]
        ops = top["operators"]
        assert ops["aten::_convolution"] == 2 and ops["aten::batch_norm"] == 1 and ops["aten::view"] == 1, ops
        assert ops["prim::NumToTensor"] == 1 and ops["aten::cat"] == 1 and ops["prim::TupleConstruct"] == 1, ops
        assert ["features", "1", "running_var"] in top["state"] and ["shift"] in top["state"], top["state"]
        constants = top["constants"]
    else:
        assert "trace" not in code and not code["problems"] and not code["missing"], code
        constants = [code["tensor_constants"][k] for k in ("c0", "c1")]
    assert [(c["dtype"], c["shape"]) for c in constants] == [("float64", []), ("float32", [10])], constants
    assert float(constants[0]["values"][0]) == 0.5 and [float(v) for v in constants[1]["values"]] == traced
    weights = load_file(case / "weights.safetensors")
    assert len(weights) == 12 and all(_digest(weights[k]) == v["sha256"] for k, v in t.truth["state"].items())
    got = _rebuilt(workdir, case, form, t)
    assert got["equal"] and got["state_equal"] and got["model_class"].endswith("RecursiveScriptModule"), got


def test_hostile_traced_graphs_are_refused_and_named(form_images, workdir, tmp_path):
    """Hand-built hostile images of a model traced in the process (issue 48): libtorch_cpu's symbol table claiming
    ten billion entries, a graph node whose op symbol lies far outside the table, a prim::GetAttr with no output (an
    exit 70 bench/fuzz_torchscript.py found). The model's state is still
    read (complete); the graphs are not printed, the reason is named, and `zen reuse` refuses (exit 5): no hang,
    no huge read, no guessed op."""
    import struct

    from elftools.elf.elffile import ELFFile

    profile, off, obj, img = _hostile_setup(form_images, workdir, "jit-trace")

    with open(img, "rb") as fh:  # libtorch_cpu's first byte, from the core's NT_FILE note
        notes = [n for seg in ELFFile(fh).iter_segments() if seg.header.p_type == "PT_NOTE" for n in seg.iter_notes()]
        files = next(n for n in notes if n["n_type"] == "NT_FILE")["n_desc"]
        base = min(e.vm_start for e, name in zip(files["Elf_Nt_File_Entry"], files["filename"])
                   if name.endswith(b"libtorch_cpu.so") and e.page_offset == 0)  # fmt: skip
    vec = base + profile["constants"]["INTERNED_OFFSET"]
    ct = _peek(img, obj + off["jitobject.type"])
    graph = _peek(img, _peek(img, _peek(img, ct + off["classtype.methods"])) + off["graphfunction.graph"])
    first = _peek(img, _peek(img, _peek(img, graph + off["jitgraph.block"]) + off["jitblock.input"]) + off["jitnode.next"])
    hostile = {  # name -> (address, bytes, what the refusal names)
        "symbols": (vec + 8, struct.pack("<Q", _peek(img, vec) + 72 * 10**10), "no symbol table"),
        "kind": (first + off["jitnode.kind"], struct.pack("<I", 0x7FFFFFF0), "outside the table"),
        # its prim::GetAttr with no output at all (its output vector's end put back to its start)
        "outputs": (
            first + off["jitnode.outputs"] + 8,
            struct.pack("<Q", _peek(img, first + off["jitnode.outputs"])),
            "with 0 outputs",
        ),
    }
    for name, (addr, data, why) in hostile.items():
        bad = _poke(img, tmp_path / f"{name}.core", addr, data)
        out = tmp_path / f"case-{name}"
        res = zen("recover", bad, "-o", out, check=False, timeout=300)
        bad.unlink()
        assert res.returncode == 0 and "Traceback" not in res.stderr, (name, res.stderr[-2000:])
        trace = json.loads((out / "mr.json").read_text())["deployment"]["torchscript"]["trace"]
        assert why in " ".join([*trace["problems"], *trace["refused"].values()]), (name, trace)
        refused = zen("reuse", out, "-o", tmp_path / f"pkg_{name}", check=False)
        assert refused.returncode == 5 and why in refused.stderr, (name, refused.stderr)
