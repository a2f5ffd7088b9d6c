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

import functools
import hashlib
import json
import os
import stat
from importlib import resources
from pathlib import Path
from typing import Any

from zen.errors import ZenError
from zen.represent import textio
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


ALL_FILES = (MANIFEST, MR_FILE, WEIGHTS, INPUTS, PR_FILE, UR_FILE, CODE_FILE, REQUIREMENTS, EXTRA)


def discard(case_dir: Path, *, remove_dir: bool) -> None:
    """Remove a case's files (after a failed recovery: a half-written case must not look like one);
    the directory too when the failed run created it and nothing else is in it."""
    case_dir = Path(case_dir)
    for name in ALL_FILES:
        try:
            (case_dir / name).unlink(missing_ok=True)
        except OSError:
            pass
    if remove_dir:
        try:
            case_dir.rmdir()
        except OSError:
            pass


def write_json(path: Path, data: Any) -> None:
    textio.write_json(path, data, indent=1)


class CaseIntegrityError(ZenError):
    """A case file differs from the hash its manifest recorded, is missing, or is not a regular file."""


_hash_cache: dict[tuple, str] = {}


def _stat_regular(path: Path) -> os.stat_result | str:
    """The file's stat (symlinks followed) if it is a regular file; else why not."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file" + (" (a symlink)" if path.is_symlink() else "")
    return st


def verified_sha256(path: Path) -> str:
    """sha256 of a regular file; cached per (device, inode, size, mtime, ctime) within one run, so a
    command that checks every file and then reads one does not hash it twice."""
    st = _stat_regular(path)
    if isinstance(st, str):
        raise CaseIntegrityError(f"{path} is {st}")
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = file_sha256(path)
    return _hash_cache[key]


def integrity(case_dir: Path, manifest: dict) -> list[str]:
    """Every problem with the case's files against the manifest's `files` hashes: a file altered,
    replaced by something that is not a regular file, deleted, or present but never recorded."""
    case_dir = Path(case_dir)
    recorded = manifest.get("files") or {}
    problems = []
    for name in ALL_FILES:
        if name == MANIFEST:
            continue
        p = case_dir / name
        st = _stat_regular(p)
        if name not in recorded:
            if st != "missing":
                problems.append(f"{name} is in the case directory but not recorded in the manifest (added afterwards)")
            continue
        if isinstance(st, str):
            problems.append(f"{name} is {st}; the manifest records sha256 {recorded[name][:16]}…")
        elif verified_sha256(p) != recorded[name]:
            problems.append(f"{name} was altered after recovery: its sha256 differs from the manifest's")
    return problems


def require_intact(case_dir: Path, manifest: dict, names: tuple[str, ...]) -> None:
    """Refuse to use a file a command reads when it fails the integrity check."""
    bad = [p for p in integrity(case_dir, manifest) if p.split(" ", 1)[0] in names]
    if bad:
        raise CaseIntegrityError(f"{case_dir}: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                                 "the case is not the one zen wrote; recover it again from the image")  # fmt: skip


def load_manifest(case_dir: Path) -> dict:
    """The manifest, checked against `schemas/manifest.schema.json`."""
    from zen.represent.schema import CaseFileError, parse_json

    p = Path(case_dir) / MANIFEST
    if not Path(case_dir).is_dir():
        raise ZenError(f"{case_dir} is not a directory", "give a case directory written by `zen recover IMAGE -o CASE`")
    st = _stat_regular(p)
    if st == "missing":
        raise ZenError(f"{case_dir} is not a zen case (no {MANIFEST})", "create one with `zen recover IMAGE -o CASE`")
    if isinstance(st, str):
        raise CaseFileError(f"{p} is {st}", "recover the case again")
    m = parse_json(p, str(p))
    if type(m) is dict and m.get("kind") == "zen-decompile":
        raise CaseFileError(f"{case_dir} was written by `zen decompile` without probing its kernels: it has no case files",
                            "run `zen decompile MODEL.so -o DIR` where TVM is installed (not --static)")  # fmt: skip
    return check_manifest(m, str(p))


def check_manifest(m: Any, where: str) -> dict:
    """A parsed manifest checked against `schemas/manifest.schema.json` (a case's, or one uploaded to
    `zen serve` with a fingerprint); `where` names it in errors."""
    from zen.represent.schema import CaseFileError

    if type(m) is not dict or m.get("kind") != "zen-case" or m.get("format") != CASE_FORMAT:
        raise CaseFileError(f"{where} is not a zen case manifest (format {CASE_FORMAT})", "recover the case again")
    errors = sorted(_manifest_validator().iter_errors(m), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(x) for x in e.absolute_path) or "(top level)"
        raise CaseFileError(f"{where}: {path}: {e.message[:200]}", "recover the case again")
    return m


@functools.cache
def _manifest_validator():
    import jsonschema

    text = resources.files("zen.represent").joinpath("schemas", "manifest.schema.json").read_text()
    schema = json.loads(text)
    return jsonschema.Draft202012Validator(schema)


def _load_checked(case_dir: Path, name: str, missing_hint: str, cls: type, kind: str, fmt: int):
    from zen.represent.schema import load_record

    p = Path(case_dir) / name
    if not p.exists() and not p.is_symlink():
        raise ZenError(f"{case_dir} has no {name}", missing_hint)
    if not (Path(case_dir) / "reuse.json").is_file():
        # a case: the file must be the one the manifest recorded. A reuse package (reuse.json, no
        # manifest) carries a copy of mr.json whose hash its verify.json records instead.
        require_intact(case_dir, load_manifest(case_dir), (name,))
    return load_record(p, cls, kind, fmt)


def load_mr(case_dir: Path) -> ModelMR:
    from zen.represent.mr import MR_FORMAT

    return _load_checked(case_dir, MR_FILE, "the recovery did not find a model; see manifest.json", ModelMR, "zen-mr", MR_FORMAT)


def load_pr(case_dir: Path):
    from zen.represent.pr import PR_FORMAT, ProgrammaticRepresentation

    return _load_checked(case_dir, PR_FILE, "recover the case again with this version of zen", ProgrammaticRepresentation,
                         "zen-pr", PR_FORMAT)  # fmt: skip


def load_ur(case_dir: Path):
    from zen.represent.pr import UR_FORMAT, UnifiedRepresentation

    return _load_checked(case_dir, UR_FILE, "recover the case again with this version of zen", UnifiedRepresentation,
                         "zen-ur", UR_FORMAT)  # fmt: skip
