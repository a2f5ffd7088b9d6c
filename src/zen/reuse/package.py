"""`zen reuse`: write an importable package that rebuilds the recovered model (AiP §3.4).

Writing the package executes nothing: it computes the patch (differential analysis against a
base from the library, or a self-contained rebuild) and copies the case's tensors. Loading it
(`import PKG; PKG.load()`) applies the patch, which EXECUTES code recovered from the image.

    PKG/__init__.py        load(), load_with_report(), inputs()  (a fixed template, no recovered code)
    PKG/patch.json         the patch (zen.patch.format), hash-protected
    PKG/mr.json            the MR the object graph is rebuilt from
    PKG/weights.safetensors, extra.safetensors, inputs.safetensors   the case's tensors
    PKG/reuse.json         provenance: case, image sha256, base, diff summary, Python/torch versions
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
from pathlib import Path
from typing import Any

from zen import __version__
from zen.patch.decode import describe
from zen.represent import case
from zen.runtime.errors import ZenError

TEMPLATE = '''"""{title}

Rebuilt by zen {version} from a memory image (evidence sha256 {sha}).
Importing this package runs nothing. `load()` applies patch.json to the code importable here and
rebuilds the model from mr.json and the safetensors files: it EXECUTES CODE RECOVERED FROM THE
IMAGE. Run it in an isolated environment, one rebuilt model per Python process.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


DEQUANTIZE = {dequantize}  # `zen reuse --dequantize`: load() returns a float copy of a quantized model


def load(*, eval_mode=True, device="cpu", dequantize=DEQUANTIZE):
    """The rebuilt model (an nn.Module; in eval mode unless eval_mode=False), on `device` ("cpu", or
    "cuda:0" where a GPU is present; the deployed model's device is in mr.json). dequantize=True: every
    quantized layer (torchao, quanto, bitsandbytes) becomes its float torch.nn layer (outputs then differ from
    the deployed ones by the integer kernels' rounding)."""
    return load_with_report(eval_mode=eval_mode, device=device, dequantize=dequantize)[0]


def load_with_report(*, eval_mode=True, device="cpu", dequantize=DEQUANTIZE):
    """(model, report): what the patch created/replaced/verified and what could not be restored."""
    from zen.reuse.runtime import load_package

    return load_package(HERE, eval_mode=eval_mode, device=device, dequantize=dequantize)


def inputs():
    """Tensors found in the image that fit the model's first layer (name -> tensor)."""
    from zen.reuse.runtime import load_tensors

    return load_tensors(HERE / "inputs.safetensors")
'''


def _code(case_dir: Path, manifest: dict) -> dict:
    p = case_dir / case.CODE_FILE
    if not p.is_file():
        py = (manifest.get("python") or {}).get("version", "?")
        raise ZenError(f"{case_dir} has no rebuilt code ({case.CODE_FILE})",
                       f"the image runs Python {py}: recover the case with zen running under that Python version")  # fmt: skip
    try:
        data = marshal.loads(p.read_bytes())  # zen's own output: code objects are built, never run here
    except (ValueError, EOFError, TypeError, SystemError) as exc:  # SystemError: a code object with a non-str name
        raise ZenError(f"{p} is unreadable ({exc})", "recover the case again with this Python and zen version") from None
    if not isinstance(data, dict):
        raise ZenError(f"{p} is not a zen code file")
    return data


def make_patch(case_dir: Path, base=None) -> tuple[dict, Any]:
    """(patch document, DiffResult or None). `base`: a library Entry, or None for self-contained."""
    from zen.attribute.algorithm import primary_modules
    from zen.diff.differ import diff
    from zen.patch.format import build_patch, build_self_contained

    case_dir = Path(case_dir)
    manifest = case.load_manifest(case_dir)
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    code = _code(case_dir, manifest)
    source = {"case": case_dir.name, "image_sha256": (manifest.get("evidence") or {}).get("sha256"),
              "model": mr.root.cls, "python": (manifest.get("python") or {}).get("version"),
              "torch": (manifest.get("torch") or {}).get("version")}  # fmt: skip
    if base is None:
        return build_self_contained(pr, code, source, primary_modules(mr)), None
    d = diff(mr, pr, base.name, base.mr, base.pr, rebuilt=set(code))
    return build_patch(d, pr, code, source, base.pr), d


def diff_case(case_dir: Path, base: Any) -> tuple[dict | None, Any, dict]:
    """(patch document or None, DiffResult, rebuilt code objects) of a case against a library entry.

    A case recovered from another Python version's image has no rebuilt code (zen's interpreter
    cannot build that version's code objects): the diff is then computed from the PR alone (the
    listings, which is what Algorithm 2 compares), and there is no patch and no code."""
    from zen.diff.differ import diff

    case_dir = Path(case_dir)
    if (case_dir / case.CODE_FILE).is_file():
        data, d = make_patch(case_dir, base)
        return data, d, _code(case_dir, case.load_manifest(case_dir))
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    return None, diff(mr, pr, base.name, base.mr, base.pr, rebuilt=None), {}


def _place(src: Path, dst: Path) -> None:
    """Hard-link when possible (weights can be GBs), else copy."""
    if not src.is_file():
        return
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


PACKAGE_FILES = ("__init__.py", "patch.json", case.MR_FILE, case.WEIGHTS, case.EXTRA, "reuse.json", "model.pt")


def package_hashes(pkg: Path) -> dict[str, str]:
    """sha256 of the files that decide what a package rebuilds: `zen verify` records them so a
    report can tell whether the package it cites is the one that was verified."""
    return {name: case.file_sha256(pkg / name) for name in PACKAGE_FILES if (pkg / name).is_file()}


def is_archive(mr) -> bool:
    """A TorchScript model whose Python classes are not proven: rebuilt as a TorchScript archive."""
    deployed = getattr(mr, "deployment", None) or {}
    return deployed.get("form") == "torchscript" and not (deployed.get("eager") or {}).get("complete")


def require_rebuildable(mr, where: Path) -> None:
    """Refuse (exit 5) a model whose state was not all read: the state the audit of deployment forms named
    (`mr.unread`), tensor subclasses, and tensors on the meta device (offloaded: their data is in files the
    deployment's hooks would read at load time). A package must rebuild exactly or not be written."""
    from zen.runtime.errors import StateNotRead

    missing = [f"{u.get('where') or 'the root'} ({u.get('type')}): {u.get('why')}" for u in mr.unread]
    missing += [f"{t.key}: {t.note}" for t in mr.tensors if t.status in ("subclass", "offloaded")
                or (t.device == "meta" and t.status != "ok")]  # fmt: skip
    deployed = getattr(mr, "deployment", None) or {}
    if not missing and deployed.get("form") == "torchscript":
        eager = deployed.get("eager") or {}
        from zen.reuse.torchscript_archive import archive_problems

        why = archive_problems(mr) if not eager.get("complete") else []
        if why:
            raise StateNotRead(f"{where}: a TorchScript model ({deployed.get('script_class')}): its module tree and every "
                               "tensor were read (mr.json, weights.safetensors), but no TorchScript archive can be written "
                               f"({why[0]}), and the Python classes it was compiled from are not proven for "
                               f"{eager.get('missing_count', 'its')} module(s) ({eager.get('why') or 'no link'})",
                               "load weights.safetensors into the eager model's class with load_state_dict "
                               "(same keys)")  # fmt: skip
        missing = [f"{m.path or 'the root'}.{k}: {v['unsupported']}" for m in mr.modules for k, v in m.state.items()
                   if isinstance(v, dict) and "unsupported" in v]  # fmt: skip
    if missing:
        more = f" (and {len(missing) - 1} more; mr.json's `unread` and tensors list them)" if len(missing) > 1 else ""
        raise StateNotRead(f"{where}: the model holds state zen did not read, so no runnable copy is written: {missing[0]}{more}",
                           "see README 'Deployment forms' for what zen reads of each form")  # fmt: skip


def write_package(case_dir: Path, out: Path, patch: dict, diff_summary: dict | None, dequantize: bool = False) -> Path:
    from zen.patch.format import write_patch

    case_dir, out = Path(case_dir), Path(out)
    first = case.load_mr(case_dir)
    require_rebuildable(first, case_dir)
    files = _trace_files(first)  # before anything is written: a refusal leaves no half package
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "reuse.json").exists())):
        raise ZenError(f"{out} exists and is not an empty directory or a zen reuse package", "choose a new directory")
    if not out.name.isidentifier():
        raise ZenError(f"package directory name {out.name!r} is not a Python identifier", "name it like rebuilt_model")
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").unlink(missing_ok=True)  # a verification of the previous contents no longer holds
    manifest = case.load_manifest(case_dir)
    sha = (manifest.get("evidence") or {}).get("sha256") or "unknown"
    title = f"{patch['source'].get('model')}: " + (f"base {patch['base']} + patch" if patch["base"] else "self-contained rebuild")
    (out / "__init__.py").write_text(TEMPLATE.format(title=title, version=__version__, sha=sha, dequantize=bool(dequantize)))
    write_patch(patch, out / "patch.json")
    shutil.copyfile(case_dir / case.MR_FILE, out / case.MR_FILE)
    for name in (case.WEIGHTS, case.EXTRA, case.INPUTS):
        _place(case_dir / name, out / name)
    mr = case.load_mr(case_dir)
    (out / "model.pt").unlink(missing_ok=True)
    if is_archive(mr):  # traced or jit.load'ed: rebuilt as TorchScript, from its own code (reuse.torchscript_archive)
        from zen.reuse.torchscript_archive import write_archive

        write_archive(mr, case_dir / case.WEIGHTS, out, files)
    info = {"kind": "zen-reuse", "format": 1, "tool": f"zen {__version__}", "case": str(case_dir.resolve()),
            "evidence_sha256": sha, "mode": patch["mode"], "base": patch["base"], "python": patch["python"],
            "patch_sha256": patch["content_sha256"], "diff": diff_summary,
            "executes_recovered_code": True, "dequantize": bool(dequantize)}  # fmt: skip
    info["problems"] = value_problems(mr)
    if is_archive(mr):
        from zen.reuse.torchscript_archive import from_graphs

        code = ("TorchScript code torch printed from the traced graphs read from the image"
                if from_graphs(mr.deployment.get("torchscript") or {}) else "the deployed TorchScript code")  # fmt: skip
        info["torchscript_archive"] = f"model.pt: {code} and values; load() runs torch.jit.load"
    (out / "reuse.json").write_text(json.dumps(info, indent=1) + "\n")
    return out


def _trace_files(mr) -> dict[str, str] | None:
    """A model traced in the process: its archive's code, printed by torch from the graphs read from the image
    (reuse.trace_code); None for every other case."""
    from zen.reuse.torchscript_archive import from_graphs

    ts = (getattr(mr, "deployment", None) or {}).get("torchscript") or {}
    if not (is_archive(mr) and from_graphs(ts)):
        return None
    from zen.reuse.trace_code import trace_files

    return trace_files(ts["trace"])


def value_problems(mr) -> list[str]:
    """Values of the model's modules that `load()` will not be able to rebuild, known from their
    encodings alone (nothing is imported here): 'model.features.3.norm_layer: TYPE: why'. Values
    whose classes refuse to be created are only found at load time (`load_with_report()`)."""
    out: list[str] = []

    def walk(enc, where: str, depth: int = 0) -> None:
        if depth > 64 or len(out) > 1000:
            return
        if isinstance(enc, list):
            for i, x in enumerate(enc):
                walk(x, f"{where}[{i}]", depth + 1)
            return
        if not isinstance(enc, dict):
            return
        why = None
        if "unsupported" in enc:
            why = str(enc["unsupported"])
        elif "func" in enc and "<locals>" in str(enc["func"]):
            why = f"function {enc['func']} was made inside another function and its code is not in the case"
        elif "cls" in enc and "<locals>" in str(enc["cls"]) and "cls_of" not in enc and "local_class" not in enc:
            why = f"class {enc['cls']} was made inside a function"
        if why is not None:
            what = describe(enc)
            out.append(f"{where}: {why}" if what in why else f"{where}: {what}: {why}")
            return
        for k, v in enc.items():
            if k == "dict" and isinstance(v, list):
                for i, (_key, val) in enumerate(v):
                    walk(val, f"{where}[{i}]", depth + 1)
            elif k == "state" and isinstance(v, dict):
                for name, val in v.items():
                    walk(val, f"{where}.{name}", depth + 1)
            elif isinstance(v, (dict, list)):
                walk(v, where if k in ("tuple", "list", "set", "frozenset") else f"{where}.{k}", depth + 1)

    for m in mr.modules:
        for name, enc in m.state.items():
            if name.endswith("hooks") or "_hooks_" in name:
                continue
            walk(enc, f"model.{m.path}.{name}" if m.path else f"model.{name}")
    return out
