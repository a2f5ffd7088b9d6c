"""Programmatic and unified representation (issue 4) against ground truth from live processes.

The ground truth (targets/code_truth.py) applies the closure rules to live objects with `dis`;
zen applies them to memory. Both must find exactly the same functions, classes and code objects.
"""

from __future__ import annotations

import json
import marshal

import pytest
from conftest import model_id, recovered, zen
from families import FAMILIES  # noqa: E402

VARIANTS = [(f, v) for f, vs in FAMILIES.items() for v in vs]


def load_pr(case):
    return json.loads((case / "pr.json").read_text())


def code_truth(target, name):
    models = target.truth.get("variants") or target.truth["models"]
    entry = models[name]
    return entry.get("code", entry)


def compare(case, target, name):
    """Assert zen's model-specific code equals the ground truth; return (pr, precision, recall)."""
    pr = load_pr(case)
    g = code_truth(target, name)
    functions = {int(f, 16) for c in pr["codes"] for f in c["functions"]}
    truth = set(g["functions"])
    tp = len(functions & truth)
    precision, recall = tp / max(1, len(functions)), tp / max(1, len(truth))
    print(f"\n{name}: {len(truth)} model functions, precision {precision:.2%}, recall {recall:.2%}")
    assert functions == truth, (sorted(g["qualnames"].get(str(a)) for a in truth - functions), len(functions - truth))
    assert {int(c["address"], 16) for c in pr["classes"]} == set(g["classes"])
    assert {int(c["address"], 16) for c in pr["codes"]} == set(g["codes"])
    assert sorted(pr["dependencies"]) == g["dependencies"]
    assert pr["counts"]["model"]["functions"] == len(truth)
    return pr


@pytest.mark.parametrize("family,name", VARIANTS)
def test_family_code(family_images, workdir, family, name):
    image, t = family_images[family]
    case, mr, _, _ = recovered(image, t, name, workdir)
    pr = compare(case, t, name)
    # every rebuilt code object equals the live one
    with open(t.outdir / f"{name}.code.marshal", "rb") as fh:
        live = {int(k): v for k, v in marshal.load(fh).items()}  # our own fixture's output
    rebuilt = marshal.loads((case / "code.marshal").read_bytes())
    assert {int(k, 16) for k in rebuilt} == set(live)
    for k, code in rebuilt.items():
        orig = live[int(k, 16)]
        assert code == orig and code.co_stacksize == orig.co_stacksize and code.co_code == orig.co_code, code.co_qualname
    # defaults and keyword defaults of every function
    g = code_truth(t, name)
    for c in pr["codes"]:
        for f in c["functions"]:
            assert c["defaults"] == g["defaults"].get(str(int(f, 16))) or len(c["functions"]) > 1, c["qualname"]
            assert c["kwdefaults"] == g["kwdefaults"].get(str(int(f, 16))) or len(c["functions"]) > 1, c["qualname"]
    # ϕ: every module-tree node maps to its class; every code object has exactly one owning node
    ur = json.loads((case / "ur.json").read_text())
    assert [n["path"] for n in ur["nodes"]] == [m["path"] for m in mr["modules"]]
    assert [n["cls"] for n in ur["nodes"]] == [f"{m['cls_module']}.{m['cls_qualname']}" for m in mr["modules"]]
    owned = [c for n in ur["nodes"] for c in n["owned"]]
    assert len(owned) == len(set(owned)) and set(owned) == {c["address"] for c in pr["codes"]}


@pytest.mark.parametrize("name", ["gpt2", "llama", "lora"])
def test_transformers_code(hf_image, workdir, name):
    image, t = hf_image
    case, _, _, _ = recovered(image, t, name, workdir)
    pr = compare(case, t, name)
    modules = set(pr["modules"])
    expected = {"gpt2": "transformers.models.gpt2.modeling_gpt2", "llama": "transformers.models.llama.modeling_llama",
                "lora": "peft.tuners.lora.layer"}[name]  # fmt: skip
    assert expected in modules
    req = (case / "requirements.txt").read_text()
    for pkg, version in t.truth["versions"].items():
        if pkg in ("transformers", "torch") or (pkg == "peft" and name == "lora"):
            assert f"{pkg}=={version.split('+')[0]}" in req, req


def test_encoded_records_written_as_they_are(hf_image, workdir):
    """The code records a forked child encoded are spliced into pr.json (`EncodedRecords`): split anywhere, a real
    PR read back and written with its tail still encoded gives the file's bytes; the tail decodes to the records it
    was made from; a module list that does not match the lines is refused."""
    from zen.represent.pr import EncodedRecords, ProgrammaticRepresentation, encode_records

    image, t = hf_image
    case, _, _, _ = recovered(image, t, "gpt2", workdir)
    data = (case / "pr.json").read_bytes()
    pr = ProgrammaticRepresentation.from_json(json.loads(data))
    codes = pr.codes
    for cut in (0, 1, len(codes) // 3, len(codes) - 1, len(codes)):
        pr.codes = codes[:cut]
        encoded = EncodedRecords.from_bytes(encode_records(codes[cut:]).to_bytes())
        assert len(encoded) == len(codes) - cut and encoded.modules == [c.module for c in codes[cut:]]
        assert pr.dump_bytes(more_codes=encoded) == data, cut
        assert pr.codes + encoded.records() == codes
    good = encode_records(codes[:3])
    with pytest.raises(ValueError):
        EncodedRecords.from_bytes(json.dumps(good.modules[:2]).encode() + b"\n" + good.lines)


def _instance_key(owner, attr, module, qualname, model_classes):
    rank = 2 if owner is None else 0 if owner in model_classes else 1
    return rank, (owner or "", attr or "", module or "", qualname or "")


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_shared_code_recorded_by_the_same_function_in_every_image(hf_image, workdir, name):
    """A code object that several functions share (a decorator's wrapper) is recorded by the one a
    model class holds, the first by names: never by the lowest address, which changes between images
    and once rebuilt Qwen2ForCausalLM as LlamaAttention (its record voted for the wrong class)."""
    image, t = hf_image
    case, mr, _, _ = recovered(image, t, name, workdir)
    pr = load_pr(case)
    model_classes = {f"{m['cls_module']}.{m['cls_qualname']}" for m in mr["modules"]}
    contested = 0
    for c in pr["codes"]:
        if c["parent"] is not None or not c["others"]:
            continue
        mine = _instance_key(c["owner_class"], c["attr"], c["module"], None, model_classes)
        held = [o for o in c["others"] if o["owner"] in model_classes] + ([c] if c["owner_class"] in model_classes else [])
        contested += len(held) > 1
        for o in c["others"]:
            theirs = _instance_key(o["owner"], o["attr"], o["module"], None, model_classes)
            assert mine <= theirs, (c["qualname"], mine, theirs)
    assert contested, "no code object shared by two model classes' functions: the check above decided nothing"


def test_obfuscated_fork_matched_by_code(family_images, workdir):
    """Module and class names renamed at run time: the same code is found, and it is the same code."""
    plain_img, plain_t = family_images["convnet"]
    obf_img, obf_t = family_images["convnet-obf"]
    obf_case, _, _, _ = recovered(obf_img, obf_t, "convnet_se", workdir)
    obf = compare(obf_case, obf_t, "convnet_se")
    plain = load_pr(recovered(plain_img, plain_t, "convnet_se", workdir)[0])
    assert {c["module"] for c in obf["codes"]} == {"m_7f3a9c"}
    assert all(c["qualname"].startswith("K") for c in obf["classes"])
    assert sorted(c["listing_sha256"] for c in obf["codes"]) == sorted(c["listing_sha256"] for c in plain["codes"])
    assert sorted(c["bytecode_sha256"] for c in obf["codes"]) == sorted(c["bytecode_sha256"] for c in plain["codes"])


def test_listing_identical_across_processes(family_images, workdir):
    """Two processes importing the same file give identical normalised listings for each function."""
    a = load_pr(recovered(*family_images["convnet"], "convnet_wide", workdir)[0])
    b = load_pr(recovered(*family_images["convnet-obf"], "convnet_wide", workdir)[0])
    la = {c["qualname"]: c["listing"] for c in a["codes"]}
    lb = {c["qualname"]: c["listing"] for c in b["codes"]}
    assert la == lb and len(la) >= 6
    assert {c["address"] for c in a["codes"]} != {c["address"] for c in b["codes"]}  # really two processes


def test_show(family_images, workdir):
    case, _, _, _ = recovered(*family_images["convnet"], "convnet_se", workdir)
    res = zen("show", case)
    assert "model-specific" in res.stdout and "SEBlock" in res.stdout and "se_gate(x)" in res.stdout
    assert "torch==2.13.0" in res.stdout
    data = json.loads(zen("show", case, "--json").stdout)
    assert data["counts"]["model"]["classes"] == 3


def test_model_ids_are_roots(family_images, workdir):
    image, t = family_images["mobile"]
    _, mr, _, _ = recovered(image, t, "mobile_ghost", workdir)
    assert mr["root"]["address"] == hex(model_id(t, "mobile_ghost"))
