"""Recovery and reuse of real third-party models (issue 15): a CI-sized sample of bench/zoo.py.

Each model runs in its own process (fixed seed, random init, one forward; the process writes its
ground truth: a sha256 per state_dict tensor, a description of every plain attribute of every
module, its input and output), is imaged by zen, recovered, added to a library, and rebuilt twice,
on itself as the base (`zen reuse --base`) and self-contained; each rebuild runs in a fresh process
on the recorded input. Outputs must be bit-identical, every attribute value equal to the deployed
one (partials, config objects, enums, closures, ... compared by what they are), every MRO the
image's. The sample: torchvision ResNet-18 (classes as values), ViT-B/16 (`norm_layer=partial(...)`),
an obfuscated fork of ResNet-18 (renamed methods, an added property and class attribute, a changed
base class) rebuilt on ResNet-18, a ResNet-18 whose head holds every kind of value the issue lists,
timm EfficientNet-B0 and ViT-Tiny, transformers BERT and T5 (config objects). Images are deleted
as soon as a model is recovered.

torchvision/timm come from bench/zoo.py's side directory (PyPI's torchvision for torch 2.13 is a
CUDA build that breaks transformers' imports when installed next to the CPU torch): their models
are skipped, saying why, when it cannot be installed.
"""

from __future__ import annotations

import json
import shutil

import pytest
import zoo  # bench/zoo.py (conftest puts bench/ on sys.path)

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

FORK, FORK_BASE, VALUES, PARTIAL, CONFIG = "tvfork_resnet18_obf", "tv_resnet18", "tvvalues_resnet18", "tv_vit_b_16", "hf_bert"
SAMPLE = [FORK_BASE, FORK, PARTIAL, VALUES, "timm_efficientnet_b0", "timm_vit_tiny_patch16_224", CONFIG, "hf_t5"]
# the value VALUES holds on purpose that no rebuild can restore (its forward does not use it)
UNREBUILDABLE = {"model.fc.lock": "_thread.lock"}


@pytest.fixture(scope="session")
def zoo_runs(tmp_path_factory):
    """name -> the row bench/zoo.py's run_model writes for it, plus the work dir and library."""
    site = zoo.ensure_site()
    work = tmp_path_factory.mktemp("zoo")
    library = work / "zoo.sqlite"
    rows = {}
    for name in SAMPLE:
        if zoo.library_of(name) != "transformers" and site is None:
            continue
        rows[name] = zoo.run_model(name, work, library, str(site) if site else None, zoo.FORKS.get(name))
    yield work, library, rows, site
    shutil.rmtree(work, ignore_errors=True)


def _row(zoo_runs, name):
    work, _, rows, site = zoo_runs
    if name not in rows:
        pytest.skip(f"torchvision/timm could not be installed into {zoo.zoo_site()} (pip --no-deps --target)")
    row = rows[name]
    assert "error" not in row, row["error"]
    assert not list(work.glob(f"{name}.core")), "the image must be deleted once recovered"
    return row


@pytest.mark.parametrize("name", SAMPLE)
def test_recovered_bit_exact(zoo_runs, name):
    row = _row(zoo_runs, name)
    assert row["tensors"] > 0 and row["exact"] == row["tensors"]
    assert row["modules"] == row["modules_truth"]


@pytest.mark.parametrize("mode", ["base", "sc"])
@pytest.mark.parametrize("name", SAMPLE)
def test_rebuilt_bit_identical_in_a_fresh_process(zoo_runs, name, mode):
    row = _row(zoo_runs, name)
    r = row[f"reuse_{mode}"]
    assert "error" not in r, r["error"]
    print(f"\n{name} {mode}: {r['cls']} values={r['values_checked']} imported={r['imported']}")
    assert r["equal"], r
    assert r["mro_mismatch"] == []
    assert r["values_checked"] > 0
    expected = set(UNREBUILDABLE) if name == VALUES else set()
    assert {p.split(":", 1)[0] for p in r["problems"]} == expected, r["problems"]
    assert {"model." + k for k in r["values_differ"]} == expected, r["values_differ"]
    if mode == "sc":
        assert r["cls"].startswith("zen_rebuilt.")
    elif name != FORK:
        assert r["cls"] == row.get("cls_truth", r["cls"]) and not r["cls"].startswith("zen_rebuilt.")


def test_partials_are_rebuilt(zoo_runs):
    """torchvision's VisionTransformer keeps `norm_layer = partial(nn.LayerNorm, eps=1e-6)`."""
    work, _, _, _ = zoo_runs
    _row(zoo_runs, PARTIAL)
    mr = json.loads((work / f"case_{PARTIAL}" / "mr.json").read_text())
    enc = mr["modules"][0]["state"]["norm_layer"]
    assert enc["partial"] == "functools:partial" and enc["func"] == {"cls": "torch.nn.modules.normalization:LayerNorm"}
    assert enc["keywords"]["dict"] == [[{"lit": "'eps'"}, {"lit": "1e-06"}]]


def test_config_objects_are_rebuilt(zoo_runs):
    work, _, rows, _ = zoo_runs
    row = _row(zoo_runs, CONFIG)
    mr = json.loads((work / f"case_{CONFIG}" / "mr.json").read_text())
    assert mr["modules"][0]["state"]["config"]["obj"] == "transformers.models.bert.configuration_bert:BertConfig"
    for mode in ("base", "sc"):  # the config's every field compared with the deployed one's (values_differ)
        assert row[f"reuse_{mode}"]["values_checked"] > 0 and row[f"reuse_{mode}"]["values_differ"] == []


def test_every_kind_of_value_or_a_clear_problem(zoo_runs):
    """VALUES' head holds a partial, enum and Flag members, a frozen dataclass, a namedtuple, a class,
    a lambda, a closure, a builtin, a bound method, torch dtype/device/Size/memory_format, a slice,
    Ellipsis, a frozenset, shared and cyclic containers (its forward uses each), a class made inside a
    function (made again from its bases and `__dict__`), and a lock, which is reported by path and type at
    load time; load() itself never fails on it."""
    row = _row(zoo_runs, VALUES)
    for mode in ("base", "sc"):
        r = row[f"reuse_{mode}"]
        assert r["equal"]
        for path, type_name in UNREBUILDABLE.items():
            line = next(p for p in r["problems"] if p.startswith(path + ":"))
            assert type_name in line
        assert r["manifest_problems"] == [] and not any(p.startswith("model.fc.local_cls") for p in r["problems"])
    # a partial as a class attribute, a partial, a lambda and a slice as a method's defaults: encoded
    # by what they are in the PR too (not as opaque instances), so the self-contained rebuild has them
    work = zoo_runs[0]
    pr = json.loads((work / f"case_{VALUES}" / "pr.json").read_text())
    head = next(c for c in pr["classes"] if c["qualname"] == "Head")
    assert head["attributes"]["clamp_hi"]["partial"] == "functools:partial"
    post = next(c for c in pr["codes"] if c["qualname"] == "Head.post")
    op, f = post["defaults_enc"]["tuple"]
    assert op["partial"] == "functools:partial" and op["func"] == {"func": "torch:mul"}
    assert f["function"] == "zoo_values:Head.<lambda>" and f["code"]
    assert post["kwdefaults_enc"]["dict"][0][1] == {"slice": [{"lit": "None"}] * 3}
    # a class made inside a function, which no name reaches: carried by its bases and __dict__
    mr = json.loads((work / f"case_{VALUES}" / "mr.json").read_text())
    local = next(m for m in mr["modules"] if m["path"] == "fc")["state"]["local_cls"]
    assert local["cls"] == "zoo_values:make_local_class.<locals>.Local" and local["local_class"]["name"] == "Local"
    res = zoo.zen("reuse", work / f"case_{VALUES}", "-o", work / "pkg_values_again")
    assert res.returncode == 0 and "not rebuildable" not in res.stderr


def test_obfuscated_fork_with_renamed_methods_on_its_base(zoo_runs):
    """The fork renames `_forward_impl`/`_make_layer`, adds a property and a class attribute used by
    forward, and derives BasicBlock from a new class whose method its forward calls: the patch
    carries all of it onto torchvision's classes, and every MRO is the image's."""
    row = _row(zoo_runs, FORK)
    r = row["reuse_base"]
    assert row["base"] == FORK_BASE and r["equal"]
    assert r["cls"] == "torchvision.models.resnet.ResNet"
    assert r["rebased"] == ["torchvision.models.resnet:BasicBlock"] and r["mro_mismatch"] == []


def test_attribution(zoo_runs):
    work, library, _, _ = zoo_runs
    _row(zoo_runs, FORK)
    own = zoo.attribute(work / f"case_{CONFIG}", library)
    assert own["attributed"] == CONFIG and own["ur"] >= 0.99, own
    fork = zoo.attribute(work / f"case_{FORK}", library)
    assert fork["attributed"] in (FORK, FORK_BASE) and fork["ur"] >= 0.99, fork  # both are in the library
    assert fork["runner_up"] in (FORK, FORK_BASE) and fork["margin"] < 0.2  # the fork and its base are close
