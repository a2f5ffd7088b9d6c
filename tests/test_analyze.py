"""`zen analyze` (issue 33): ART on a model rebuilt from a memory image, against the process's own ART.

One real process (tests/targets/analysis_target.py) trains a small CNN and a trojaned twin, runs
ART's FGSM and PGD on the clean one itself and saves the adversarial examples, then waits to be
imaged. zen recovers both models from one image; ART run by `zen analyze` on the rebuilt model
must give exactly the process's adversarial examples (same seed), its accuracies and rates, and
Neural Cleanse must flag the trojan's target class, with the trigger where the patch was, and
nothing on the clean twin.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import TARGETS, booby_trapped, imaged, zen, zen_command
from safetensors.torch import load_file, save_file

pytest.importorskip("art")
sys.path.insert(0, str(TARGETS))
import analysis_models as am  # noqa: E402

NC_STEPS = "60"  # enough for this model (its triggers converge in fewer); the default is 100


@pytest.fixture(scope="module")
def analysis_cases(tmp_path_factory):
    """(target, {"clean_model": case, "trojan_model": case}) from one image of the analysis target."""
    where = tmp_path_factory.mktemp("analyze")
    image = where / "analysis.core"
    t = imaged("analysis_target.py", where / "target", image)
    cases = {}
    for name in ("clean_model", "trojan_model"):
        cases[name] = where / f"case_{name}"
        zen("recover", image, "-o", cases[name], "--model", name)
    image.unlink()
    yield t, cases
    shutil.rmtree(where, ignore_errors=True)


def _analysis(out) -> dict:
    return json.loads((out / "analysis.json").read_text())


def test_art_on_the_rebuilt_model_gives_the_process_own_adversarial_examples(analysis_cases, tmp_path):
    t, cases = analysis_cases
    truth = t.truth
    own = load_file(str(t.outdir / "adversarial.safetensors"))
    # the case, on the inputs recovered from the image (no labels: ART attacks the model's predictions)
    out = tmp_path / "clean"
    res = zen("analyze", cases["clean_model"], "-o", out, "--clip", "0,1", "--seed", truth["seed"])
    assert "EXECUTES code recovered from the image" in res.stderr
    doc = _analysis(out)
    assert doc["inputs"]["source"] == "recovered" and doc["inputs"]["key"] == "input_0"
    assert doc["inputs"]["sha256_data"] == truth["input_sha256"]  # the batch the process last fed its model
    assert doc["executed_recovered_code"] and doc["model"] == {"classes": am.CLASSES, "input_shape": [1, am.SIDE, am.SIDE]}
    assert doc["parameters"]["eps"] == truth["eps"] and doc["parameters"]["pgd_steps"] == truth["max_iter"]
    ours = load_file(str(out / "adversarial.safetensors"))
    assert sorted(ours) == sorted(k for k in own if "/" not in k) and len(ours) == 6
    for key, adv in ours.items():
        assert torch.equal(adv, own[key]), key  # bit for bit, PGD's random start included
    rows = {r["key"]: r for rs in doc["robustness"]["attacks"].values() for r in rs}
    assert {k: r["changed"] for k, r in rows.items()} == {k: v["changed"] for k, v in truth["adversarial"].items()}
    assert doc["robustness"]["labelled"] is False and doc["robustness"]["clean_accuracy"] is None
    assert any(r["changed"] > 0.5 for r in rows.values())  # the attack does something the comparison can see
    assert all(r["max_linf"] <= r["eps"] + 1e-6 for r in rows.values())
    assert set(doc["files"]) == {"adversarial.safetensors", "robustness.png"}

    # a reuse package, on the labelled batch the process saved: accuracies equal the process's
    pkg = tmp_path / "rebuilt_clean"
    zen("reuse", cases["clean_model"], "-o", pkg)
    out2 = tmp_path / "labelled"
    zen("analyze", pkg, "-o", out2, "--clip", "0,1", "--inputs", t.outdir / "val.safetensors")
    doc2 = _analysis(out2)
    assert doc2["subject"]["kind"] == "package" and doc2["inputs"]["source"] == "given" and doc2["inputs"]["labels_key"]
    assert doc2["robustness"]["clean_accuracy"] == truth["clean_accuracy"]
    rows2 = {r["key"]: r for rs in doc2["robustness"]["attacks"].values() for r in rs}
    assert {k: r["accuracy"] for k, r in rows2.items()} == {k: v["accuracy"] for k, v in truth["adversarial"].items()}
    for key, adv in load_file(str(out2 / "adversarial.safetensors")).items():
        assert torch.equal(adv, own[f"{key}/labels"]), key


def test_neural_cleanse_flags_the_trojan_and_not_its_clean_twin(analysis_cases, tmp_path):
    t, cases = analysis_cases
    assert t.truth["trojan_attack_success"] > 0.95  # the planted backdoor works in the deployed model
    out = tmp_path / "trojan"
    zen("analyze", cases["trojan_model"], "-o", out, "--clip", "0,1", "--backdoor", "--nc-steps", NC_STEPS)
    doc = _analysis(out)
    bd = doc["backdoor"]
    assert bd["flagged"] == [am.TARGET], bd["classes"]
    index = {c["class"]: c["anomaly_index"] for c in bd["classes"]}
    assert index[am.TARGET] > 2 * bd["threshold"] and min(bd["classes"], key=lambda c: c["l1"])["class"] == am.TARGET
    # the reverse-engineered trigger lies where the patch was planted
    mask = load_file(str(out / "triggers.safetensors"))[f"mask_{am.TARGET}"].double()
    around = mask[am.PATCH[0].start - 1 : am.PATCH[0].stop + 1, am.PATCH[1].start - 1 : am.PATCH[1].stop + 1]
    assert around.sum() / mask.sum() > 0.6, mask
    assert f"trigger_class_{am.TARGET}.png" in doc["files"] and "anomaly.png" in doc["files"]
    assert doc["backdoor"]["trigger_images"] == {str(am.TARGET): f"trigger_class_{am.TARGET}.png"}
    # another model's adversarial examples: the comparison of the test above can fail
    own = load_file(str(t.outdir / "adversarial.safetensors"))
    assert not torch.equal(load_file(str(out / "adversarial.safetensors"))["fgsm@0.1"], own["fgsm@0.1"])

    clean = tmp_path / "clean"
    zen("analyze", cases["clean_model"], "-o", clean, "--clip", "0,1", "--backdoor", "--attack", "none",
        "--nc-steps", NC_STEPS)  # fmt: skip
    bd2 = _analysis(clean)["backdoor"]
    assert bd2["flagged"] == [] and all(c["anomaly_index"] < bd2["threshold"] for c in bd2["classes"]
                                        if c["l1"] <= np.median([x["l1"] for x in bd2["classes"]]))  # fmt: skip
    assert all(c["reached_threshold"] for c in bd2["classes"] + bd["classes"])  # every class got a working trigger
    assert "robustness" not in _analysis(clean)["files"] and (clean / "anomaly.png").is_file()

    # the report shows it: verdict, tables, figures embedded (PNG data URIs); a tampered figure is not embedded
    html = tmp_path / "report.html"
    zen("report", cases["trojan_model"], "-o", html, "--analysis", out, "--no-attribute")
    text = html.read_text()
    assert "White-box analysis (ART)" in text and f"backdoor suspected at class {am.TARGET}" in text
    assert text.count("data:image/png;base64,") >= 3
    md = tmp_path / "report.md"
    zen("report", cases["clean_model"], "-o", md, "--analysis", out, "--no-attribute")
    assert "the analysis is of another model of the same image" in md.read_text()  # the trojan's analysis, the clean case
    png = out / f"trigger_class_{am.TARGET}.png"
    png.write_bytes(png.read_bytes() + b"tampered")
    res = zen("report", cases["trojan_model"], "-o", html, "--analysis", out, "--no-attribute")
    assert f"trigger_class_{am.TARGET}.png does not match the sha256" in res.stderr
    assert html.read_text().count("data:image/png;base64,") == text.count("data:image/png;base64,") - 1


def test_inputs_from_the_input_spec_and_refusals(analysis_cases, tmp_path):
    _t, cases = analysis_cases
    pkg = tmp_path / "no_inputs"
    zen("reuse", cases["clean_model"], "-o", pkg)
    (pkg / "inputs.safetensors").unlink()
    out = tmp_path / "spec"
    # run where the evidence lies, beside modules planted to be imported: the child must import none of them
    evidence, markers = booby_trapped(tmp_path / "traps")
    zen_command("analyze", pkg, "-o", out, "--attack", "fgsm", "--eps", "0.05", "--samples", "8", cwd=evidence)
    assert sorted(p.name for p in markers.iterdir()) == []
    doc = _analysis(out)
    assert doc["inputs"]["source"] == "spec" and doc["inputs"]["sample_shape"] == [1, am.SIDE, am.SIDE]
    assert doc["inputs"]["probed_sides"][-1] == am.SIDE and 224 in doc["inputs"]["probed_sides"]
    assert "input spec" in doc["inputs"]["describe"] and doc["inputs"]["samples"] == 8

    def refused(*args, says: str):
        res = zen("analyze", *args, check=False)
        assert res.returncode == 2, res.stderr
        assert says in res.stderr and "hint:" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert "EXECUTES" not in res.stderr  # refused before anything recovered ran

    # weights that do not fit the architecture the package describes
    bad = tmp_path / "bad_weights"
    shutil.copytree(pkg, bad)
    state = load_file(str(bad / "weights.safetensors"))
    state["head.weight"] = torch.zeros(5, state["head.weight"].shape[1])
    save_file(state, str(bad / "weights.safetensors"))
    refused(bad, "-o", tmp_path / "x1", says="does not match the model's architecture: head.weight")
    # inputs that are not a batch of real values; not a case or package; an unknown attack
    ids = tmp_path / "ids.safetensors"
    save_file({"x": torch.zeros(4, 16, dtype=torch.int64)}, str(ids))
    refused(pkg, "-o", tmp_path / "x2", "--inputs", ids, says="are integers (token ids?)")
    refused(tmp_path, "-o", tmp_path / "x3", says="is neither a zen case nor a reuse package")
    refused(pkg, "-o", tmp_path / "x4", "--attack", "cw", says="unknown attack 'cw'")
    # without ART (Python's own mark for a module that cannot be imported): what to install, exit 2
    boot = (f"import sys; sys.modules['art'] = None; sys.argv = ['zen', 'analyze', {str(pkg)!r}, '-o', "
            f"{str(tmp_path / 'x6')!r}]; from zen.cli import main; main()")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", boot], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "needs adversarial-robustness-toolbox" in res.stderr, res.stderr
    assert "pip install 'zen-forensics[analysis]'" in res.stderr and not (tmp_path / "x6").exists()
    # inputs of the wrong shape fail inside the child: still one line and exit 2
    wrong = tmp_path / "wrong.safetensors"
    save_file({"x": torch.zeros(4, 3, 8, 8)}, str(wrong))
    res = zen("analyze", pkg, "-o", tmp_path / "x5", "--inputs", wrong, check=False)
    assert res.returncode == 2 and "the rebuilt model failed on the inputs [4, 3, 8, 8]" in res.stderr, res.stderr


def test_a_model_larger_than_the_memory_is_refused_before_it_is_built(analysis_cases):
    """Issue 49.4: the analysis child builds the model (ART needs it whole), holding its tensors once;
    on a machine without that much memory the kernel would kill it without a word. zen refuses first, saying how much
    it needs and what is available; exactly enough is accepted."""
    from zen.analyze.run import BASELINE, check_memory
    from zen.represent.case import load_mr
    from zen.runtime.errors import ZenError

    mr = load_mr(analysis_cases[1]["clean_model"])
    need = sum(t.nbytes for t in mr.tensors) + BASELINE
    check_memory(mr, available=need)
    with pytest.raises(ZenError, match="needs about .* GB of memory, and this machine has .* GB available"):
        check_memory(mr, available=need - 1)
