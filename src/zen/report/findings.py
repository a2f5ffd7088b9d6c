"""The report's sections on what was done with the model: `zen analyze` and `zen drift` results.

Read from the JSON files those commands write (analysis.json, drift.json) and the figures beside
them; nothing is rebuilt or run here. The directories are handed over with a case and are as
untrusted as the case: every value is taken by type into a fresh, bounded structure (a malformed
file is refused, exit 2), and a figure is embedded only if it is a PNG whose sha256 is the one the
JSON recorded (else the section says which file does not match). The analysis must be of this
case's image, and the drift must include it; otherwise the section opens with a warning.
"""

from __future__ import annotations

import base64
import hashlib
import math
from pathlib import Path
from typing import Any

from zen.represent.schema import parse_json
from zen.runtime.errors import ZenError

MAX_PNG = 8 << 20
MAX_ROWS = 200
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)[:2000]


def _list(v: Any) -> list:
    return v[:MAX_ROWS] if isinstance(v, list) else []


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _load(path: Path, kind: str, command: str) -> dict:
    if not path.is_file():
        raise ZenError(f"{path.parent} has no {path.name}", f"write one with `{command}`")
    data = parse_json(path)
    if type(data) is not dict or data.get("kind") != kind or data.get("format") != 1:
        raise ZenError(f"{path} is not a {command.split()[1]} result (kind {kind}, format 1)", f"write one with `{command}`")
    return data


def _figure(folder: Path, name: Any, recorded: dict, problems: list[str]) -> dict | None:
    """A PNG beside the JSON, embedded only when it is one and matches its recorded sha256."""
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        return None
    p = folder / name
    try:
        data = p.read_bytes() if p.is_file() and p.stat().st_size <= MAX_PNG else None
    except OSError:
        data = None
    if data is None:
        problems.append(f"figure {name} is missing")
        return None
    if not data.startswith(PNG_MAGIC) or hashlib.sha256(data).hexdigest() != recorded.get(name):
        problems.append(f"figure {name} does not match the sha256 recorded when it was written")
        return None
    return {"name": name, "png_base64": base64.b64encode(data).decode()}


def analysis(folder: Path, evidence_sha256: str | None, root_address: str | None = None) -> dict[str, Any]:
    """The `zen analyze` section: subject, inputs, robustness, Neural Cleanse, figures, problems. The
    analysed model must be this case's: same image, same model object in it (one image may hold several)."""
    folder = Path(folder)
    doc = _load(folder / "analysis.json", "zen-analysis", "zen analyze CASE -o DIR")
    files, problems = _dict(doc.get("files")), []
    subj = _dict(doc.get("subject"))
    if evidence_sha256 and subj.get("evidence_sha256") not in (evidence_sha256, None):
        problems.append(f"the analysis is of a model from another image (sha256 {_str(subj.get('evidence_sha256'))})")
    elif root_address and subj.get("root_address") not in (root_address, None):
        problems.append(
            f"the analysis is of another model of the same image (at {_str(subj.get('root_address'))}, "
            f"this case's is at {root_address})"
        )
    rob = _dict(doc.get("robustness"))
    robustness = None
    if rob:
        rows = []
        for name, items in sorted(_dict(rob.get("attacks")).items())[:10]:
            for r in _list(items):
                r = _dict(r)
                rows.append({"attack": _str(name), "eps": _num(r.get("eps")), "accuracy": _num(r.get("accuracy")),
                             "changed": _num(r.get("changed")), "max_linf": _num(r.get("max_linf")),
                             "mean_l2": _num(r.get("mean_l2"))})  # fmt: skip
        robustness = {"labelled": bool(rob.get("labelled")), "clean_accuracy": _num(rob.get("clean_accuracy")), "rows": rows,
                      "figure": _figure(folder, "robustness.png", files, problems)}  # fmt: skip
    bd = _dict(doc.get("backdoor"))
    backdoor = None
    if bd:
        classes = [{"class": _str(c.get("class")), "l1": _num(c.get("l1")), "anomaly_index": _num(c.get("anomaly_index")),
                    "flagged": bool(c.get("flagged"))} for c in map(_dict, _list(bd.get("classes")))]  # fmt: skip
        triggers = []
        for k, name in sorted(_dict(bd.get("trigger_images")).items())[:20]:
            fig = _figure(folder, name, files, problems)
            if fig is not None:
                triggers.append({**fig, "label": f"class {_str(k)}"})
        backdoor = {"detector": _str(bd.get("detector")), "threshold": _num(bd.get("threshold")),
                    "flagged": [_str(x) for x in _list(bd.get("flagged"))], "classes": classes,
                    "samples": _num(bd.get("samples")), "figure": _figure(folder, "anomaly.png", files, problems),
                    "triggers": triggers}  # fmt: skip
    inputs, model, params = _dict(doc.get("inputs")), _dict(doc.get("model")), _dict(doc.get("parameters"))
    return {
        "dir": str(folder.resolve()), "generated": _str(doc.get("generated")), "tool": _str(doc.get("tool")),
        "subject": {k: _str(subj.get(k)) for k in ("kind", "model", "case", "package", "evidence_sha256", "root_address",
                                                    "mode")},
        "inputs": _str(inputs.get("describe")), "inputs_sha256": _str(inputs.get("sha256_data")),
        "classes": _num(model.get("classes")), "input_shape": _str(model.get("input_shape")),
        "versions": {k: _str(v) for k, v in list(_dict(doc.get("versions")).items())[:5]},
        "parameters": {k: _str(v) for k, v in list(params.items())[:20]},
        "robustness": robustness, "backdoor": backdoor, "problems": problems,
        "load_problems": [_str(p) for p in _list(doc.get("load_problems"))],
    }  # fmt: skip


def _series(v: Any) -> dict:
    s = _dict(v)
    last = _dict((_list(s.get("snapshots")) or [{}])[-1])
    return {"name": _str(s.get("name")), "elements": _num(s.get("elements")), "first_changed": _num(s.get("first_changed")),
            "l2": _num(last.get("l2")), "relative": _num(last.get("relative")), "cosine": _num(last.get("cosine")),
            "changed": _num(last.get("changed"))}  # fmt: skip


def drift(folder: Path, evidence_sha256: str | None) -> dict[str, Any]:
    """The `zen drift` section: snapshots, per-layer drift (last snapshot against the first), timeline."""
    folder = Path(folder)
    doc = _load(folder / "drift.json", "zen-drift", "zen drift CASE1 CASE2 ... -o DIR")
    problems = [_str(p) for p in _list(doc.get("problems"))]
    snaps = [{"index": _num(s.get("index")), "case": _str(s.get("case")), "acquired_at": _str(s.get("acquired_at")),
              "image_sha256": _str(s.get("image_sha256"))} for s in map(_dict, _list(doc.get("snapshots")))]  # fmt: skip
    if evidence_sha256 and evidence_sha256 not in {s["image_sha256"] for s in snaps}:
        problems.insert(0, "this case's image is not one of the drift's snapshots")
    return {
        "dir": str(folder.resolve()), "generated": _str(doc.get("generated")), "model": _str(doc.get("model")),
        "snapshots": snaps, "model_drift": _series(doc.get("model_drift")),
        "layers": [_series(v) for v in _list(doc.get("layers"))], "counters": [_series(v) for v in _list(doc.get("counters"))],
        "optimizer": _str(_dict(doc.get("optimizer")).get("note")),
        "hyperparameters_changed": [f"{_str(h.get('module'))}.{_str(h.get('name'))}: {_str(h.get('values'))}"
                                    for h in map(_dict, _list(doc.get("hyperparameters_changed")))],
        "not_compared": [_str(k) for k in _list(doc.get("not_compared"))],
        "figure": _figure(folder, "drift_timeline.png", _dict(doc.get("files")), problems), "problems": problems,
    }  # fmt: skip
