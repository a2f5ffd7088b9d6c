"""`zen reuse` for Keras cases: write a package whose `load()` constructs the recovered Keras model again.

Writing executes nothing and imports no TensorFlow. The package holds the MR (layer classes, constructor
arguments, functional call records), the recovered variables, and, when the model has classes of its own
(a subclassed model, custom layers), a self-contained patch that synthesises those classes from the recovered
code, exactly as PyTorch reuse does; Keras's own classes are imported from the installed Keras instead.
`load()` runs `zen.reuse.keras_runtime` in the TF environment (zen's pure-Python modules must be importable
there: `zen verify --python EXE` arranges that for its child).

    PKG/__init__.py        load(), load_with_report()  (a fixed template, no recovered code)
    PKG/mr.json            what the model is rebuilt from
    PKG/weights.safetensors, extra.safetensors   the case's variables (optimizer state is not restored)
    PKG/patch.json         only for models with their own classes
    PKG/reuse.json         provenance (framework "keras", case, evidence sha256, user modules)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from zen import __version__
from zen.represent import case
from zen.runtime.errors import ZenError

TEMPLATE = '''"""{title}

Rebuilt by zen {version} from a memory image (evidence sha256 {sha}), for Keras {keras}.
Importing this package runs nothing. `load()` constructs the Keras model from mr.json (layer classes and
their recorded arguments, functional call records){code} and assigns the recovered variables from
weights.safetensors. It needs TensorFlow/Keras and zen's Python modules importable (PYTHONPATH).{warn}
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load():
    """The rebuilt Keras model (`model.predict(x)`, `model(x)`)."""
    return load_with_report()[0]


def load_with_report():
    """(model, report): how each variable was assigned, what was built how."""
    from zen.reuse.keras_runtime import load_package

    return load_package(HERE)
'''
WARN = " It EXECUTES CODE RECOVERED FROM THE IMAGE: run it in an isolated environment."
FRAMEWORK_PREFIXES = ("keras.", "tensorflow.", "tf_keras.")


def user_modules(mr) -> set[str]:
    """Modules of the model's own layer classes (everything not Keras/TensorFlow)."""
    return {m.cls_module for m in mr.modules if not m.cls_module.startswith(FRAMEWORK_PREFIXES)}


def write_keras_package(case_dir: Path, out: Path) -> tuple[Path, dict]:
    """(package directory, reuse.json contents)."""
    from zen.patch.format import build_self_contained, write_patch
    from zen.reuse.package import _code, _place

    case_dir, out = Path(case_dir), Path(out)
    manifest = case.load_manifest(case_dir)
    mr = case.load_mr(case_dir)
    if mr.framework != "keras":
        raise ZenError(f"{case_dir} holds a {mr.framework} model", "this writer is for Keras cases")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "reuse.json").exists())):
        raise ZenError(f"{out} exists and is not an empty directory or a zen reuse package", "choose a new directory")
    if not out.name.isidentifier():
        raise ZenError(f"package directory name {out.name!r} is not a Python identifier", "name it like rebuilt_model")
    if any("keras" not in m.state for m in mr.modules):
        raise ZenError(f"{case_dir} was recovered by a zen that did not record how to construct Keras layers",
                       "recover the image again with this zen, then run `zen reuse` on the new case")  # fmt: skip
    own = user_modules(mr)
    patch = None
    if own:
        pr, code = case.load_pr(case_dir), _code(case_dir, manifest)
        source = {"case": case_dir.name, "image_sha256": (manifest.get("evidence") or {}).get("sha256"),
                  "model": mr.root.cls, "python": (manifest.get("python") or {}).get("version"),
                  "keras": (manifest.get("keras") or {}).get("version")}  # fmt: skip
        patch = build_self_contained(pr, code, source, own)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("verify.json", "patch.json"):
        (out / stale).unlink(missing_ok=True)
    sha = (manifest.get("evidence") or {}).get("sha256") or "unknown"
    keras_v = (manifest.get("keras") or {}).get("version") or "?"
    code_note = f", with {', '.join(sorted(own))} synthesised from recovered code" if own else ""
    title = f"{mr.root.cls}: self-contained Keras rebuild"
    text = TEMPLATE.format(title=title, version=__version__, sha=sha, keras=keras_v, code=code_note, warn=WARN if own else "")
    (out / "__init__.py").write_text(text)
    if patch is not None:
        write_patch(patch, out / "patch.json")
    shutil.copyfile(case_dir / case.MR_FILE, out / case.MR_FILE)
    for name in (case.WEIGHTS, case.EXTRA, case.INPUTS):
        _place(case_dir / name, out / name)
    problems = [f"{t.key}: {t.status} ({t.note})" for t in mr.tensors if t.status != "ok"]
    info = {"kind": "zen-reuse", "format": 1, "tool": f"zen {__version__}", "framework": "keras",
            "case": str(case_dir.resolve()), "evidence_sha256": sha, "mode": "self-contained", "base": None,
            "python": (manifest.get("python") or {}).get("version"), "keras": keras_v,
            "tensorflow": (manifest.get("tensorflow") or {}).get("version"), "user_modules": sorted(own),
            "patch_sha256": patch["content_sha256"] if patch else None,
            "functions": len(patch["functions"]) if patch else 0, "classes": len(patch["classes"]) if patch else 0,
            "executes_recovered_code": bool(own), "problems": problems}  # fmt: skip
    (out / "reuse.json").write_text(json.dumps(info, indent=1) + "\n")
    return out, info


def is_keras_package(pkg: Path) -> bool:
    try:
        return json.loads((Path(pkg) / "reuse.json").read_text()).get("framework") == "keras"
    except (OSError, ValueError, AttributeError):
        return False


def run_verify(pkg: Path, python: str, inputs: Path, expect: Path | None, save: Path | None,
               timeout: float = 600.0) -> dict:  # fmt: skip
    """Verify a Keras package in a child process of the TF environment's `python` (zen never imports TF).

    The child runs isolated (zen.runtime.childproc): zen's modules and the caller's PYTHONPATH are put on its
    sys.path, the working directory is not; it prints one `ZEN-RESULT {json}` line."""
    import os
    import subprocess

    from zen.runtime import childproc

    exe = shutil.which(python) or python
    if not Path(exe).is_file():
        raise ZenError(f"no Python interpreter at {python}", "pass --python with the TF environment's python (tools/tf-venv.sh)")
    if not Path(inputs).is_file():
        raise ZenError(f"no input file {inputs}", "pass --inputs FILE.safetensors (the inputs the deployed model ran on)")
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = ["verify", str(Path(pkg).resolve()), "--inputs", str(Path(inputs).resolve())]
    if expect is not None:
        args += ["--expect", str(Path(expect).resolve())]
    if save is not None:
        args += ["--save", str(Path(save).resolve())]
    cmd = childproc.module_argv("zen.reuse.keras_runtime", args, python=exe)
    try:
        res = childproc.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise ZenError(f"verifying {pkg} took more than {timeout:.0f} s", "raise --timeout") from None
    except OSError as exc:
        raise ZenError(f"cannot run {exe}: {exc}", "pass --python with the TF environment's python") from None
    line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith("ZEN-RESULT ")), None)
    if line is None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise ZenError(f"{exe} did not run the Keras verifier (exit {res.returncode}): " + " | ".join(tail),
                       "pass --python with a Python 3 that has tensorflow and keras (tools/tf-venv.sh)")  # fmt: skip
    result = json.loads(line[len("ZEN-RESULT ") :])
    if "error" in result:
        raise ZenError(f"the Keras package could not be rebuilt: {result['error']}", result.get("hint") or None)
    return result
