"""Classes made inside a function, on a real process image (targets/local_class_target.py).

transformers 5.25 depends on kernels, whose decorators leave, in `apply_rotary_pos_emb`'s place, an instance of a
class made inside a function, and give every attention layer more instances in a dict attribute. No import path
reaches such a class. zen follows the class's methods in the code closure (the function the decorator replaced lives
in a cell of them), names the class in an instance's encoding through the object its module holds (`cls_of`), or
carries the class itself (`local_class`) where that module is rebuilt from the image; `zen reuse` then rebuilds the
model with the installed code or without it, and its outputs are bit-identical to the deployed model's.
"""

from __future__ import annotations

import json

import pytest
from conftest import imaged, model_id, zen
from test_reuse import check


@pytest.fixture(scope="module")
def kfunc(tmp_path_factory):
    work = tmp_path_factory.mktemp("kfunc")
    image = work / "kfunc.core"
    t = imaged("local_class_target.py", work / "target", image)
    case = work / "case"
    res = zen("recover", image, "-o", case, "--model", hex(model_id(t, "kfunc")), check=False)
    image.unlink()
    assert res.returncode == 0, res.stderr
    return t, case


def test_closure_reaches_what_the_instance_calls(kfunc):
    t, case = kfunc
    pr = json.loads((case / "pr.json").read_text())
    g = t.truth["models"]["kfunc"]
    assert {int(f, 16) for c in pr["codes"] for f in c["functions"]} == set(g["functions"])
    assert {int(c["address"], 16) for c in pr["codes"]} == set(g["codes"])
    assert {int(c["address"], 16) for c in pr["classes"]} == set(g["classes"])
    assert {"rotate_half", "mix", "_create_func_module.<locals>.Func.forward"} <= {c["qualname"] for c in pr["codes"]}
    assert "_create_func_module.<locals>.Func" not in {c["qualname"] for c in pr["classes"]}  # no name reaches it


def test_instances_name_their_class_through_the_module(kfunc):
    _t, case = kfunc
    mr = json.loads((case / "mr.json").read_text())
    funcs = next(m for m in mr["modules"] if m["path"] == "blocks.0")["state"]["_funcs"]
    ((key, inst),) = funcs["dict"]
    assert key == {"lit": "'mix'"} and inst["obj"] == "kfunc_model:_create_func_module.<locals>.Func"
    assert inst["cls_of"] == "kfunc_model:mix" and "local_class" not in inst


def test_self_contained_rebuild(kfunc, tmp_path):
    t, case = kfunc
    pkg = tmp_path / "sc_kfunc"
    zen("reuse", case, "-o", pkg)
    g = json.loads((pkg / "patch.json").read_text())["globals"]["kfunc_model"]["mix"]
    assert g["local_class"]["class"] == "kfunc_model:_create_func_module.<locals>.Func"  # the class itself
    lib = tmp_path / "installed"  # the decorator's library is installed (kernels is); the model's code is not
    lib.mkdir()
    (lib / "kfunc_lib.py").write_bytes((t.outdir / "kfunc_lib.py").read_bytes())
    res = check(pkg, t.outdir / "kfunc.io.pt", tmp_path / "res.json", lib, attack=False)
    assert res["equal"] and res["report"]["problems"] == [] and res["model_class"].startswith("zen_rebuilt."), res


def test_rebuild_over_the_installed_code(kfunc, tmp_path):
    t, case = kfunc
    lib = tmp_path / "lib.sqlite"
    zen("library", "add", case, "--name", "kfunc", "--library", lib)
    pkg = tmp_path / "patched_kfunc"
    zen("reuse", case, "--base", "kfunc", "--library", lib, "-o", pkg)
    res = check(pkg, t.outdir / "kfunc.io.pt", tmp_path / "res.json", t.outdir, attack=False)
    assert res["equal"] and res["report"]["problems"] == [], res
