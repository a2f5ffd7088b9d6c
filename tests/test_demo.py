"""The README's second command: the demo runs end to end and checks itself against the processes.

It is run as an investigator would run it where evidence lies: the `zen` command in a directory full of
booby-trapped modules (`depyf.py`, `numpy.py`, `torch.py`, `sitecustomize.py`, a `zen/` package, ...). The demo
starts three child interpreters (the base and deployed model processes and the verifier) and `zen diff` one more
(depyf): none may import anything from the working directory (issue 38).
"""

from __future__ import annotations

import json
import os

from conftest import booby_trapped, start_target, zen, zen_command


def test_demo_runs(tmp_path):
    evidence, markers = booby_trapped(tmp_path)
    res = zen_command("demo", "--dir", tmp_path / "demo", cwd=evidence)
    out = " ".join(res.stdout.split())  # rich wraps long lines
    assert "OK: demo finished" in out
    assert "module classes match: True" in out
    assert "tensors bit-exact: 21/21" in out  # every recovered tensor hashes like the process's own
    assert "helper code recovered: True" in out and "channel_shuffle" in out
    assert "attributed to tiny-base" in out and "attributed to the base: True" in out
    assert "+ zen.demo.tiny_base:channel_shuffle" in out  # the diff names the fork's new helper
    assert "rebuilt output bit-identical: True" in out  # the patched base reproduced the deployed response
    assert (tmp_path / "demo" / "case" / "weights.safetensors").exists()
    assert (tmp_path / "demo" / "rebuilt_model" / "patch.json").exists()
    report = (tmp_path / "demo" / "report.html").read_text()
    assert "tiny-base" in report and "bit-identical" in report and "channel_shuffle" in report
    assert not (tmp_path / "demo" / "deployed.core").exists()  # images are not left behind
    assert not (tmp_path / "demo" / "base.core").exists()
    assert sorted(p.name for p in markers.iterdir()) == []

    # the first thing a new user tries next: the demo's library is found beside the case, and said so (issue 37)
    res = zen_command("attribute", tmp_path / "demo" / "case", "--json", cwd=evidence,
                      env={**os.environ, "ZEN_LIBRARY": str(tmp_path / "no-library.sqlite")})  # fmt: skip
    assert json.loads(res.stdout)["attributed"] == "tiny-base" and "library.sqlite" in res.stderr

    # zen diff decompiles changed functions with depyf in a child: it must run (source, not the listing
    # fallback a failed child gives) and import nothing from here
    res = zen_command("diff", tmp_path / "demo" / "case", "--base", "tiny-base", "--library",
                      tmp_path / "demo" / "library.sqlite", "--json", cwd=evidence)  # fmt: skip
    views = json.loads(res.stdout)["functions"]
    assert views and {v["shown_as"] for v in views} == {"source"}, [(v["target"], v["shown_as"]) for v in views]
    assert sorted(p.name for p in markers.iterdir()) == []

    # a traced (TorchScript) fork of the library's base (issue 48): read from its C++ module, its PR from the classes it was
    # scripted from, attributed to the base
    target = start_target("scripted_fork.py", tmp_path / "scripted")
    try:
        zen("acquire", "--pid", target.pid, "-o", tmp_path / "scripted.core", "--lean")
    finally:
        target.stop()
    res = zen("recover", tmp_path / "scripted.core", "-o", tmp_path / "scripted-case")
    (tmp_path / "scripted.core").unlink()
    mr = json.loads((tmp_path / "scripted-case" / "mr.json").read_text())
    assert mr["deployment"]["form"] == "torchscript", res.stderr
    assert mr["root"]["cls"] == "zen.demo.deployed_model.TinyClassifier"
    truth = json.loads((tmp_path / "scripted" / "truth.json").read_text())["state_sha256"]
    got = {t["key"]: t["sha256"] for t in mr["tensors"]}
    assert got == truth
    res = zen("attribute", tmp_path / "scripted-case", "--library", tmp_path / "demo" / "library.sqlite", "--json")
    assert json.loads(res.stdout)["attributed"] == "tiny-base", res.stdout[-2000:]

    # on an 80-column terminal or a pipe the candidates' table is printed as one block per candidate, never "0.…"
    import subprocess
    import sys

    narrow = subprocess.run([sys.executable, "-m", "zen", "attribute", tmp_path / "demo" / "case", "--library",
                             tmp_path / "demo" / "library.sqlite"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "80"}, timeout=300)  # fmt: skip
    assert narrow.returncode == 0 and "…" not in narrow.stdout and "\n  UR " in narrow.stdout, narrow.stdout[:800]

    # a later `zen verify` with nothing to compare keeps the demo's comparison with the served request (issue 51)
    pkg = tmp_path / "demo" / "rebuilt_model"
    zen("verify", pkg, "--inputs", tmp_path / "demo" / "deployed-process" / "request.safetensors")
    v = json.loads((pkg / "verify.json").read_text())
    assert v["expect_sha256"] and [bool(r["expect_sha256"]) for r in v["runs"]] == [True, False], v.get("runs")

    # one rule for the library (issue 51): zen diff and zen report find the library beside the case too, and say so
    nowhere = {**os.environ, "ZEN_LIBRARY": str(tmp_path / "no-library.sqlite")}
    res = zen_command("diff", tmp_path / "demo" / "case", "--base", "tiny-base", "--json", "--listing", cwd=evidence,
                      env=nowhere)  # fmt: skip
    assert json.loads(res.stdout)["base"] == "tiny-base" and "the library beside the case" in res.stderr, res.stderr
    res = zen_command("report", tmp_path / "demo" / "case", "-o", tmp_path / "r.md", "--listing", cwd=evidence, env=nowhere)
    assert "tiny-base" in (tmp_path / "r.md").read_text() and "the library beside the case" in res.stderr
