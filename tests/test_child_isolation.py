"""Child interpreters zen starts never import from the directory zen runs in (issue 38).

Investigators run zen where the evidence lies; a planted `bisect.py` or `sitecustomize.py` there must never run.
Every child Python zen starts is built by zen.runtime.childproc (isolated mode, explicit sys.path, scratch cwd). Here the
builders run children *in* a booby-trapped directory, and the commands that start children (`profile`, `library
build`; `demo`/`diff` in test_demo.py, `decompile` in test_decompile.py, Keras `verify` in test_keras.py) run there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import booby_trapped, zen_command

from zen.runtime import childproc

PROBE = "import json, sys, bisect, runpy, tomllib; print(json.dumps({'path': sys.path, 'argv': sys.argv}))"


def _markers(markers):
    return sorted(p.name for p in markers.iterdir())


def test_every_builder_runs_isolated_even_in_the_trap(tmp_path, monkeypatch):
    evidence, markers = booby_trapped(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(PROBE + "\nassert __name__ == '__main__' and __file__.endswith('script.py')\n")
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "probe_mod.py").write_text(PROBE)
    # "" is the working directory: dropped; the explicit entry is forwarded (read by the builder, not the child)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", str(tmp_path / "mods")]))
    for argv in (childproc.code_argv(PROBE, ["a", "b"]), childproc.module_argv("probe_mod", ["a", "b"]),
                 childproc.script_argv(script, ["a", "b"])):  # fmt: skip
        proc = subprocess.run(argv, cwd=evidence, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["argv"][1:] == ["a", "b"]
        assert "" not in got["path"] and str(evidence) not in got["path"] and "." not in got["path"]
        assert childproc.zen_root() in got["path"] and str(tmp_path / "mods") in got["path"]
    assert _markers(markers) == []


def test_pythonpath_entries_forwarded_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", "rel", "/abs/dir", "  "]))
    assert childproc.forwarded_pythonpath() == [str(tmp_path / "rel"), "/abs/dir"]
    assert childproc.child_path(with_pythonpath=False) == [childproc.zen_root()]


def test_profile_and_recipe_build_in_the_trap(tmp_path):
    evidence, markers = booby_trapped(tmp_path)
    zen_command("profile", "python", "--python", sys.executable, "-o", tmp_path / "p.json", cwd=evidence)
    assert json.loads((tmp_path / "p.json").read_text())["python"]
    recipe = tmp_path / "r.toml"
    recipe.write_text("[[model]]\nname = \"tiny\"\ncode = '''\nimport torch\n"
                      "model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())\n"
                      "inputs = torch.ones(1, 4)\n'''\n")  # fmt: skip
    res = zen_command("library", "build", recipe, "--library", tmp_path / "lib.sqlite", cwd=evidence)
    assert "tiny: added" in res.stdout + res.stderr
    assert _markers(markers) == []


def test_child_text_output_that_is_not_utf8_is_decoded_leniently():
    """A child's message may quote bytes of the evidence (TVM's symbol error on a damaged library did: exit 70 in
    `zen decompile`, found by bench/fuzz_cli.py, tvm input 634); text output never fails to decode."""
    code = "import sys; sys.stderr.buffer.write(b'undefined symbol: erf\\xd5\\xd5_x\\n'); sys.stdout.write('ok')"
    proc = childproc.run(childproc.code_argv(code), capture_output=True, text=True, timeout=60)
    assert proc.stdout == "ok" and "erf\\xd5\\xd5_x" in proc.stderr
