"""Everything a forensic report says, gathered from a case (and a library, a base, a reuse package).

The result is plain JSON-able data (`report.json` beside the rendered report), so the HTML and
Markdown renderers only lay it out. Every number comes from the case files; nothing recovered is
executed here (a reuse package's verification is read from the `verify.json` that `zen verify`
wrote, which records that it ran in its own process).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from zen import __version__
from zen.represent import case
from zen.reuse.package import package_hashes
from zen.runtime.errors import ZenError

MAX_MODULE_ROWS = 300


def _evidence(case_dir: Path, manifest: dict) -> dict:
    ev = manifest.get("evidence") or {}
    acq = ev.get("acquisition") or {}
    return {
        "image": ev.get("image"), "size": ev.get("size"), "sha256": ev.get("sha256"), "producer": ev.get("producer"),
        # the recorded path may be gone (the demo deletes its images): the report says so, the sha256 still names it
        "image_gone": bool(ev.get("image")) and isinstance(ev.get("image"), str) and not Path(ev["image"]).exists(),
        "acquired_at": acq.get("acquired_at"), "pid": ev.get("pid") or acq.get("pid"),
        "acquisition_mode": acq.get("mode") or ("whole-machine image" if ev.get("system") else None),
        "command": ev.get("command"), "python": manifest.get("python"), "torch": manifest.get("torch"),
        "profiles": manifest.get("profiles"), "status": manifest.get("status"), "problems": manifest.get("problems", []),
        "files": manifest.get("files", {}), "case": str(case_dir.resolve()),
        "recovered_by": " ".join(str(v) for v in (manifest.get("tool") or {}).values()) or None,
        "system": (_system(ev.get("system")) or []) + _gpu(ev.get("gpu")) or None, "notes": ev.get("notes") or [],
        "source": (manifest.get("case") or {}).get("source") or "process image",
        "integrity": _integrity(case_dir, manifest),
    }  # fmt: skip


def _integrity(case_dir: Path, manifest: dict) -> dict:
    """The report verifies the evidence it prints: every case file against the manifest's hash
    (the manifest's own hash is printed so that a copy of the report pins it too)."""
    verdicts = case.verdicts(case_dir, manifest, code=True)
    problems = [r for v in verdicts.values() if v.status != "unchecked" for r in v.reasons]
    files = {n: (_verified(v) if v.status == "ok" else "; ".join(v.reasons[:3]) if v.status != "unchecked"
                 else f"sha256 verified; contents not checked: {v.reasons[0]}")
             for n, v in sorted(verdicts.items()) if v.status != "missing" or n in (manifest.get("files") or {})}  # fmt: skip
    sig = _signature(case_dir)
    if sig["status"] in ("invalid", "untrusted"):
        problems = [f"manifest.json: {sig['reason']}", *problems]
    return {"verified": not problems, "problems": problems, "files": files,
            "manifest_sha256": case.verified_sha256(case_dir / case.MANIFEST), "signature": sig}  # fmt: skip


def _verified(v) -> str:
    """A sound file, and where its digests came from when this run did not compute them (zen.evidence.digest_cache)."""
    return f"verified (its digests {v.how})" if v.how else "verified"


def _signature(case_dir: Path) -> dict:
    """Whether the manifest is signed and the signature holds (who signed is the key's fingerprint)."""
    from zen.represent.signature import check_signature
    from zen.runtime.errors import ZenError

    try:
        return check_signature(case_dir)
    except ZenError as exc:
        return {"status": "not checked", "reason": exc.message}


def _gpu(gpu: list | None) -> list[tuple[str, str]]:
    """Rows describing each GPU image the tensors on a GPU were read from: file, digest, devices, how collected."""
    rows = []
    for g in gpu or []:
        devs = ", ".join(f"cuda:{d.get('index')} {d.get('name')} ({d.get('sm_type')})" for d in g.get("devices") or [])
        acq = g.get("acquisition") or {}
        meta = g.get("meta") or {}
        how = acq.get("how") or (f"CUDA driver {meta.get('driver')} core dump ({meta.get('generator')})" if meta else "?")
        mem = g.get("global_memory") or {}
        rows.append(("GPU image", f"{g.get('path')} ({g.get('size'):,} bytes, sha256 {g.get('sha256')}); devices: "
                     f"{devs or 'not listed'}; {mem.get('segments')} memory segments, {mem.get('bytes', 0):,} bytes; "
                     f"collected by {how}"))  # fmt: skip
    return rows


def _system(sy: dict | None) -> list[tuple[str, str]] | None:
    """Rows describing a whole-machine image: the kernel, its symbols, the process and why."""
    if not sy:
        return None
    sym, proc = sy.get("symbols") or {}, sy.get("process") or {}
    return [
        ("machine image", str(sy.get("container"))),
        ("kernel", str(sy.get("banner"))),
        ("kernel symbols", f"{sym.get('file')} (sha256 {sym.get('sha256')}; {sym.get('source')})"),
        ("KASLR", f"virtual shift {sy.get('kaslr_virtual_shift')}, physical shift {sy.get('kaslr_physical_shift')}"),
        ("process chosen", f"PID {proc.get('pid')} (parent {proc.get('ppid')}, uid {proc.get('uid')}): {proc.get('chosen_by')}"),
    ]


def _summary(mr, pr) -> dict:
    model_codes = [c for c in pr.codes if c.parent is None]
    return {
        "root_class": mr.root.cls, "root_address": mr.root.address, "referenced_from": mr.root.referenced_from,
        "tensors": len(mr.tensors), "layers": len(mr.modules), "weights": mr.summary.get("parameter_elements"),
        "dtypes": mr.summary.get("dtypes"), "functions": len(model_codes), "code_objects": len(pr.codes),
        "classes": len(pr.classes), "modules": len(pr.modules), "layer_types": mr.layer_types, "counts": pr.counts,
        "tied": mr.tied, "roots": len(mr.roots), "deployed_as": deployed_as(mr), "unread": len(mr.unread),
    }  # fmt: skip


def deployed_as(mr) -> str:
    """One line on the form the model was deployed in (torch.compile and its backend, tensor subclasses read in
    parts), "eager" when nothing says otherwise."""
    parts = []
    dep = mr.deployment or {}
    if dep.get("form") == "torchscript":
        parts.append(
            f"TorchScript ({dep.get('script_class')}: the C++ module tree and its tensors were read; "
            "no runnable copy is written for TorchScript yet)"
        )
    elif dep.get("form"):
        how = dep.get("how") or f"wrapped by {dep.get('wrapper', '?')}"
        parts.append(f"{dep['form']} (backend {dep.get('backend', '?')}; {how}); rebuilt as the eager model")
    classes = sorted({t.python_type for t in mr.tensors if t.subclass})
    if classes:
        parts.append(f"tensor subclasses read in parts: {', '.join(classes[:6])}")
    if mr.unread:
        parts.append(f"{len(mr.unread)} object(s) whose state zen did not read (see the problems)")
    return "; ".join(parts) or "eager"


def _modules(mr) -> list[dict]:
    rows = []
    for m in mr.modules[:MAX_MODULE_ROWS]:
        hp = {k: v for k, v in m.hyperparameters.items() if k != "training"}
        rows.append({"path": m.path or "<root>", "class": m.cls, "hyperparameters": hp,
                     "parameters": m.parameters, "buffers": m.buffers})  # fmt: skip
    return rows


def _artefacts(pr, base_pr, pairs) -> dict:
    """What the suspect model shares with the base: identical code, classes, modules (ZEN Table IV)."""
    identical = sorted({f"{p.recovered.module}:{p.recovered.qualname}" for p in pairs if p.exact})
    base_classes = {c.qualname for c in base_pr.classes}
    classes = sorted({c.qualname for c in pr.classes if c.qualname in base_classes})
    base_modules = set(base_pr.modules)
    modules = sorted(m for m in pr.modules if m in base_modules)
    return {"identical_functions": identical, "shared_classes": classes, "shared_modules": modules}


def gather(case_dir: Path, *, library: str | Path | None = None, base: str | None = None, reuse_dir: Path | None = None,
           decompile: bool = True, timeout: float = 600.0, analysis_dir: Path | None = None,
           drift_dir: Path | None = None) -> dict[str, Any]:  # fmt: skip
    case_dir = Path(case_dir)
    manifest = case.load_manifest(case_dir, signature=False)  # a broken signature is reported, in the banner too
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    data: dict[str, Any] = {
        "kind": "zen-report", "format": 1, "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool": f"zen {__version__}", "evidence": _evidence(case_dir, manifest), "summary": _summary(mr, pr),
        "modules": _modules(mr), "modules_total": len(mr.modules), "context": pr.context,
        "requirements": (pr.context or {}).get("requirements", []), "attribution": None, "diff": None,
        "artefacts": None, "verification": None, "analysis": None, "drift": None,
    }  # fmt: skip
    if library is not None or base is not None:
        _attribution(data, case_dir, mr, pr, library, base, decompile, timeout)
    if reuse_dir is not None:
        data["verification"] = _verification(Path(reuse_dir), data["evidence"].get("sha256"))
    if analysis_dir is not None or drift_dir is not None:
        from zen.report import findings

        if analysis_dir is not None:
            data["analysis"] = findings.analysis(Path(analysis_dir), data["evidence"].get("sha256"), mr.root.address)
        if drift_dir is not None:
            data["drift"] = findings.drift(Path(drift_dir), data["evidence"].get("sha256"))
    return data


def _attribution(data: dict, case_dir: Path, mr, pr, library, base, decompile: bool, timeout: float) -> None:
    import marshal

    from zen.attribute.algorithm import attribute_case, primary_modules
    from zen.attribute.pr_similarity import code_similarity, views
    from zen.diff.decompile import DECOMPILE_CALLS
    from zen.diff.view import change_summary, function_views
    from zen.library.backends import open_library
    from zen.reuse.package import diff_case

    with open_library(library, create=False) as lib:
        n = len(lib)
        if n == 0:
            raise ZenError(f"the library {lib.path} is empty", "add base models with `zen library add`")
        # a zen serve computes it there, from the case's mr.json and pr.json
        att = attribute_case(case_dir, lib, loaded=(mr, pr), parallel=True)
        data["attribution"] = {**att, "library": str(lib.path), "library_models": n}
        chosen = base or att["attributed"]
        if chosen is None:
            return
        entry = lib.get(chosen)
        base_blob = lib.code(chosen)
    data["base"] = chosen
    if att.get("basis") == "mr-only":  # a decompiled executable: no code to set beside the base's
        data["diff"] = {"error": "no code to compare: the model was decompiled from a compiled executable"}
        return
    rec_views = [v for v in views(pr, primary_modules(mr)) if v.model_code]
    base_views = [v for v in views(entry.pr, primary_modules(entry.mr)) if v.model_code]
    data["artefacts"] = _artefacts(pr, entry.pr, code_similarity(rec_views, base_views, optimal=False).pairs)
    try:
        _, d, rec_code = diff_case(case_dir, entry)  # another Python's image: listings, no rebuilt code
    except ZenError as exc:
        data["diff"] = {"error": exc.message}
        return
    try:
        base_code = marshal.loads(base_blob) if base_blob else None
    except (ValueError, EOFError, TypeError, SystemError):  # SystemError: a code object CPython refuses to build
        base_code = None
    fviews = function_views(d, rec_code, base_code, decompile=decompile, timeout=timeout)
    total = d.unchanged + len(d.changed) + len(d.added) + len(d.added_class_methods)
    edited = len(d.changed) + len(d.added) + len(d.added_class_methods)
    data["diff"] = {
        **d.summary(), "added_class_methods": len(d.added_class_methods), "class_changes": d.class_changes,
        "changed_percent": round(100.0 * edited / total, 1) if total else 0.0,
        "functions": [{**v.to_json(), "summary": change_summary(v.changes)} for v in fviews],
        **({"limits": {"decompile_calls": DECOMPILE_CALLS}} if decompile else {}),
    }  # fmt: skip


def _package_json(path: Path) -> dict:
    """reuse.json / verify.json of a package: bounded JSON that must be an object (a package handed
    over with a case is as untrusted as the case)."""
    from zen.represent.schema import CaseFileError, parse_json

    if not path.is_file():
        raise CaseFileError(f"{path} is not a regular file")
    data = parse_json(path, str(path))
    if type(data) is not dict:
        raise CaseFileError(f"{path}: expected an object", "write the package again with `zen reuse`")
    return data


def _verification(reuse_dir: Path, evidence_sha256: str | None) -> dict:
    info_path, verify_path = reuse_dir / "reuse.json", reuse_dir / "verify.json"
    if not info_path.exists():
        raise ZenError(f"{reuse_dir} is not a zen reuse package (no reuse.json)", "write one with `zen reuse CASE -o DIR`")
    out: dict[str, Any] = {"package": str(reuse_dir.resolve()), "reuse": _package_json(info_path)}
    reuse = out["reuse"]
    problems = []
    if evidence_sha256 and reuse.get("evidence_sha256") not in (evidence_sha256, None):
        problems.append(f"the package was rebuilt from another image (sha256 {reuse.get('evidence_sha256')})")
    if verify_path.exists():
        out["verify"] = _package_json(verify_path)
        recorded = out["verify"].get("package_sha256")
        recorded = recorded if isinstance(recorded, dict) else {}
        now = package_hashes(reuse_dir)
        changed = sorted(str(k) for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
        if not recorded:
            problems.append("verify.json does not record the package's file hashes (written by an older zen)")
        elif changed:
            problems.append(f"files changed since verification: {', '.join(changed)}")
        results = out["verify"].get("results")
        kept = [r for r in results if isinstance(r, dict) and "input" in r] if isinstance(results, list) else []
        if not isinstance(results, list) or len(kept) != len(results):
            problems.append("verify.json's results are not all well-formed (those that are not are left out)")
        out["verify"]["results"] = kept
    else:
        out["verify"] = None
        out["note"] = f"not verified: run `zen verify {reuse_dir} --inputs ... --expect ...`"
    out["problems"] = problems
    return out
