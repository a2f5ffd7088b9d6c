"""The case directory: the contract between `zen recover` and every later command.

    manifest.json        evidence (image path, size, sha256), versions, profiles, status, file hashes
    mr.json              the mathematical representation (module tree, tensors, graph)
    pr.json              the programmatic representation (model code, Table I counts, context E)
    ur.json              the mapping ϕ from module-tree nodes to classes and code
    code.marshal         the model's code objects, rebuilt (zen's own output; reuse loads it)
    requirements.txt     packages (with versions) the model code comes from and calls into
    weights.safetensors  every readable parameter and buffer, keyed by state_dict key
    inputs.safetensors   tensors found in the heap that fit the model's first layer
    extra.safetensors    tensors the model holds outside state_dict (non-persistent buffers, attributes)

Everything but manifest.json's "run" section (start time, durations) is deterministic: the same
image gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from zen.errors import ZenError
from zen.represent.mr import ModelMR

CASE_FORMAT = 1
MANIFEST, MR_FILE, WEIGHTS, INPUTS = "manifest.json", "mr.json", "weights.safetensors", "inputs.safetensors"
PR_FILE, UR_FILE, CODE_FILE, REQUIREMENTS = "pr.json", "ur.json", "code.marshal", "requirements.txt"
EXTRA = "extra.safetensors"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(16 << 20):
            h.update(block)
    return h.hexdigest()


def prepare(case_dir: Path) -> Path:
    """Create the case directory; refuse to mix a new case into a different existing one."""
    case_dir = Path(case_dir)
    if case_dir.exists() and not case_dir.is_dir():
        raise ZenError(f"case path {case_dir} exists and is not a directory")
    if case_dir.is_dir() and any(case_dir.iterdir()) and not (case_dir / MANIFEST).exists():
        raise ZenError(f"{case_dir} is a non-empty directory that is not a zen case", "choose a new or empty directory")
    case_dir.mkdir(parents=True, exist_ok=True)
    return case_dir


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def load_manifest(case_dir: Path) -> dict:
    p = Path(case_dir) / MANIFEST
    if not p.is_file():
        raise ZenError(f"{case_dir} is not a zen case (no {MANIFEST})", "create one with `zen recover IMAGE -o CASE`")
    try:
        m = json.loads(p.read_text())
    except ValueError as exc:
        raise ZenError(f"{p} is not valid JSON: {exc}") from None
    if m.get("kind") != "zen-case" or m.get("format") != CASE_FORMAT:
        raise ZenError(f"{p} is not a zen case manifest (format {CASE_FORMAT})")
    return m


def load_mr(case_dir: Path) -> ModelMR:
    p = Path(case_dir) / MR_FILE
    if not p.is_file():
        raise ZenError(f"{case_dir} has no {MR_FILE}", "the recovery did not find a model; see manifest.json")
    try:
        return ModelMR.from_json(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ZenError(f"{p} is not a valid MR: {exc}") from None


def load_pr(case_dir: Path):
    from zen.represent.pr import ProgrammaticRepresentation

    p = Path(case_dir) / PR_FILE
    if not p.is_file():
        raise ZenError(f"{case_dir} has no {PR_FILE}", "recover the case again with this version of zen")
    try:
        return ProgrammaticRepresentation.from_json(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ZenError(f"{p} is not a valid PR: {exc}") from None


def load_ur(case_dir: Path):
    from zen.represent.pr import UnifiedRepresentation

    p = Path(case_dir) / UR_FILE
    if not p.is_file():
        raise ZenError(f"{case_dir} has no {UR_FILE}", "recover the case again with this version of zen")
    try:
        return UnifiedRepresentation.from_json(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ZenError(f"{p} is not a valid UR: {exc}") from None
