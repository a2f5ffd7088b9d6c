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

import contextlib
import functools
import gc
import json
import os
import stat
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from zen.evidence.digest_cache import file_sha256  # noqa: F401 - case.file_sha256 for the readers of cases
from zen.represent import textio
from zen.represent.mr import ModelMR
from zen.runtime.errors import ZenError

CASE_FORMAT = 1
MANIFEST, MR_FILE, WEIGHTS, INPUTS = "manifest.json", "mr.json", "weights.safetensors", "inputs.safetensors"
PR_FILE, UR_FILE, CODE_FILE, REQUIREMENTS = "pr.json", "ur.json", "code.marshal", "requirements.txt"
EXTRA = "extra.safetensors"
SIG_FILE = "manifest.sig"  # zen.represent.signature
MAX_MANIFEST = 16 << 20  # a manifest is a few KB; its problem list can grow, but not to this


def prepare(case_dir: Path, *, force: bool = False) -> Path:
    """Create the case directory; refuse to mix a new case into a different existing one, and to replace an existing
    case unless `force` (issue 51): a case is evidence someone may already have cited, and a signed one is a record
    someone vouched for, whose signature would be gone."""
    case_dir = Path(case_dir)
    if case_dir.exists() and not case_dir.is_dir():
        raise ZenError(f"case path {case_dir} exists and is not a directory")
    if case_dir.is_dir() and any(case_dir.iterdir()) and not (case_dir / MANIFEST).exists():
        raise ZenError(f"{case_dir} is a non-empty directory that is not a zen case", "choose a new or empty directory")
    if (case_dir / SIG_FILE).exists() and not force:
        raise ZenError(f"{case_dir} is a signed case: recovering into it would replace it and remove its signature",
                       "write the new case elsewhere (-o), or give --force to replace it")  # fmt: skip
    if (case_dir / MANIFEST).exists() and not force:
        raise ZenError(f"{case_dir} already holds a zen case: recovering into it would replace it",
                       "write the new case elsewhere (-o), or give --force to replace it")  # fmt: skip
    case_dir.mkdir(parents=True, exist_ok=True)
    (case_dir / SIG_FILE).unlink(missing_ok=True)  # a signature of the case being replaced would no longer hold
    return case_dir


ALL_FILES = (MANIFEST, MR_FILE, WEIGHTS, INPUTS, PR_FILE, UR_FILE, CODE_FILE, REQUIREMENTS, EXTRA)


def discard(case_dir: Path, *, remove_dir: bool) -> None:
    """Remove a case's files (after a failed recovery: a half-written case must not look like one);
    the directory too when the failed run created it and nothing else is in it."""
    case_dir = Path(case_dir)
    for name in (*ALL_FILES, SIG_FILE):
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


TENSOR_FILES = (WEIGHTS, INPUTS, EXTRA)
_verdict_cache: dict[tuple, dict] = {}
_record_cache: dict[tuple, Any] = {}
# A command reads the files of one or two cases, several times (checked, then loaded): a few entries serve it. A
# process that reads many cases (a library built in one session, bench/fuzz.py's 30,000 inputs) kept every parsed
# file: 8.5 MB per case state, 16 GB by the end of the fuzz run. The oldest entry goes first.
CACHED_STATES = 8


def _remember(cache: dict, key: tuple, value: Any) -> None:
    cache[key] = value
    while len(cache) > CACHED_STATES:
        del cache[next(iter(cache))]


def _stat_key(path: Path) -> tuple | None:
    st = _stat_regular(path)
    # the file's identity and state, not its spelling: `case` and `/abs/case` are one file, parsed once
    return None if isinstance(st, str) else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def verdicts(case_dir: Path, manifest: dict, *, code: bool = False, rehash: bool = False) -> dict:
    """One `represent.verify.Verdict` per case file: its hash against the manifest, then its contents (typed,
    bounded, and checked against mr.json: each tensor's bytes against the sha256 recorded at recovery). With
    `code`, code.marshal is loaded in an isolated child too. Cached per file state within one run. A large tensor
    file's digests recorded for its present state are reused (`zen.represent.tensorfile`; the verdict's `how` says
    so) unless `rehash`."""
    from zen.represent.verify import Verdict

    case_dir = Path(case_dir)
    key = (str(case_dir.resolve()), code, rehash, json.dumps(manifest.get("files"), sort_keys=True),
           tuple(_stat_key(case_dir / n) for n in ALL_FILES))  # fmt: skip
    if key in _verdict_cache:
        return _verdict_cache[key]
    recorded = manifest.get("files") or {}
    out = {n: Verdict(n) for n in ALL_FILES if n != MANIFEST}
    code_check = _start_code_check(case_dir, manifest) if code and CODE_FILE in recorded else None
    try:
        _check_files(case_dir, manifest, out, code_check, rehash)
    finally:
        if code_check is not None:
            code_check.cancel()  # (nothing left to do when its verdict was taken)
    _remember(_verdict_cache, key, out)
    return out


def _start_code_check(case_dir: Path, manifest: dict):
    """code.marshal's check in its child, started before the other files are hashed and parsed (`CodeCheck`)."""
    from zen.represent.verify import CodeCheck, python_matches

    if isinstance(_stat_regular(case_dir / CODE_FILE), str):
        return None  # missing, or a FIFO or device: never opened; the hash check below says what it is
    return CodeCheck(case_dir / CODE_FILE, python_matches(manifest))


def _check_files(case_dir: Path, manifest: dict, out: dict, code_check, rehash: bool) -> None:
    """Each file's hash against the manifest, then the contents of those present (`_check_contents`).

    The JSON files are parsed first, while a thread hashes the files (`_hash_meanwhile`): hashing and reading
    release the GIL, so a transformers case's ~60 MB of hashing overlaps its pr.json parse (0.06 s of
    `zen attribute`). The verdicts are then formed in their usual order from those results, so they and their
    reasons are the same as one after the other."""
    from zen.represent.verify import check_json

    recorded = manifest.get("files") or {}
    hashing = _hash_meanwhile([case_dir / n for n in out if n in recorded and n not in TENSOR_FILES])
    ahead = {n: check_json(case_dir, n, load) for n, load in _JSON_LOADERS
             if n in recorded and not isinstance(_stat_regular(case_dir / n), str)}  # fmt: skip
    hashing.join()  # (not on an interrupt: the daemon thread is then left to end with the process)
    tensor_files = {}
    for name, v in out.items():
        p = case_dir / name
        st = _stat_regular(p)
        if name not in recorded:
            if st != "missing":
                v.add("unrecorded", f"{name} is in the case directory but not recorded in the manifest (added afterwards)")
            else:
                v.status = "missing"
            continue
        if isinstance(st, str):
            v.add("missing", f"{name} is {st}; the manifest records sha256 {recorded[name][:16]}…")
            continue
        digest = None
        if name in TENSOR_FILES:
            from zen.represent.tensorfile import TensorFileError, read_tensor_file

            try:
                tensor_files[name] = tf = read_tensor_file(p, reuse=not rehash)
                digest, v.how = tf.sha256, tf.reused
            except TensorFileError as exc:
                v.add("malformed", f"{name} is not a well-formed safetensors file: {exc}")
        if (digest or verified_sha256(p)) != recorded[name]:
            v.add("altered", f"{name} was altered after recovery: its sha256 differs from the manifest's")
    _check_contents(case_dir, manifest, out, tensor_files, code_check, rehash, ahead)


def _hash_meanwhile(paths: list[Path]) -> threading.Thread:
    """A started thread computing `verified_sha256` of each regular file among `paths` into its cache. A failure
    is left to the check, which hashes that file again in turn and says what is wrong."""

    def run() -> None:
        for p in paths:
            if not isinstance(_stat_regular(p), str):  # a FIFO or device is never opened
                with contextlib.suppress(Exception):
                    verified_sha256(p)

    t = threading.Thread(target=run, name="zen-case-hash", daemon=True)
    t.start()
    return t


def _check_contents(case_dir: Path, manifest: dict, out: dict, tensor_files: dict, code_check, rehash: bool,
                    ahead: dict | None = None) -> None:  # fmt: skip
    """The contents of the files present; `ahead`: JSON files' `check_json` results computed before (same file)."""
    from zen.represent.tensorfile import cross_check
    from zen.represent.verify import check_json, check_mr_values, check_requirements

    present = {n for n, v in out.items() if v.status not in ("missing", "unrecorded")}
    parsed = {}
    for name, loader in _JSON_LOADERS:
        if name in present:
            v, parsed[name] = (ahead or {}).get(name) or check_json(case_dir, name, loader)
            if v.reasons:
                out[name].add(v.status, v.reasons[0])
    mr = parsed.get(MR_FILE)
    if mr is not None:
        for problem in check_mr_values(mr):
            out[MR_FILE].add("malformed", problem)
        compiled = _compiled_state_dict(case_dir, manifest, out, rehash)
        for name, records in ((WEIGHTS, mr.tensors), (INPUTS, mr.inputs), (EXTRA, mr.extra_tensors)):
            tf = tensor_files.get(name)
            if name == WEIGHTS and compiled is not None:
                name, tf = COMPILED_STATE_DICT, compiled  # a decompiled case: weights are keyed by kernel constant
            if tf is not None:
                for problem in cross_check(name, tf, records):
                    out[WEIGHTS if name == COMPILED_STATE_DICT else name].add("inconsistent", problem)
    if REQUIREMENTS in present:
        v = check_requirements(case_dir / REQUIREMENTS)
        if v.reasons:
            out[REQUIREMENTS].add(v.status, v.reasons[0])
    if code_check is not None and CODE_FILE in present and out[CODE_FILE].status == "ok":
        pr = parsed.get(PR_FILE)
        addresses = {c.address for c in pr.codes} if pr is not None else None
        v = code_check.verdict(addresses)
        out[CODE_FILE].status = v.status if v.status != "ok" else out[CODE_FILE].status
        out[CODE_FILE].reasons += v.reasons


COMPILED_STATE_DICT = "state_dict.safetensors"  # zen.compiled.case: the MR's tensors under their PyTorch keys


def _compiled_state_dict(case_dir: Path, manifest: dict, out: dict, rehash: bool = False):
    """For a case `zen decompile` wrote (its manifest's `case.state_dict` names that file and its digest), the file
    read and hashed once: mr.json's tensors describe it, not weights.safetensors (keyed by kernel constant).
    None for any other case."""
    from zen.represent.tensorfile import TensorFileError, read_tensor_file

    sd = manifest.get("case", {}).get("state_dict") if isinstance(manifest.get("case"), dict) else None
    if not isinstance(sd, dict) or sd.get("file") != COMPILED_STATE_DICT:
        return None
    p = case_dir / COMPILED_STATE_DICT
    st = _stat_regular(p)
    if isinstance(st, str):  # a FIFO or device is never opened
        out[WEIGHTS].add("missing", f"{COMPILED_STATE_DICT} is {st}; the manifest records its sha256")
        return None
    try:
        tf = read_tensor_file(p, reuse=not rehash)
    except (TensorFileError, OSError) as exc:
        out[WEIGHTS].add("inconsistent", f"{COMPILED_STATE_DICT} cannot be read: {exc}")
        return None
    if tf.sha256 != sd.get("sha256"):
        out[WEIGHTS].add("altered", f"{COMPILED_STATE_DICT} was altered: its sha256 differs from the manifest's")
    return tf


def _cached_record(path: Path, cls: type, kind: str, fmt: int):
    from zen.represent.schema import load_record

    key = _stat_key(path)
    if key is None or key not in _record_cache:
        obj = load_record(path, cls, kind, fmt)
        if key is not None:
            _remember(_record_cache, key, obj)
            if key[2] > FREEZE_ABOVE:
                gc.freeze()
        return obj
    return _record_cache[key]


# A cached record lives as long as the command. A transformers pr.json is a million objects, and every full
# collection of the cyclic collector after it was loaded walked them all (0.2 s each, paid in the next imports
# and in attribution: `zen attribute` of a GPT-2 case 3.0 -> 1.9 s). Frozen, the collector leaves them (and what
# else is alive then) alone; reference counting still frees them.
FREEZE_ABOVE = 1 << 20


def _parse_mr(p: Path):
    from zen.represent.mr import MR_FORMAT

    return _cached_record(p, ModelMR, "zen-mr", MR_FORMAT)


def _parse_pr(p: Path):
    from zen.represent.pr import PR_FORMAT, ProgrammaticRepresentation

    return _cached_record(p, ProgrammaticRepresentation, "zen-pr", PR_FORMAT)


def _parse_ur(p: Path):
    from zen.represent.pr import UR_FORMAT, UnifiedRepresentation

    return _cached_record(p, UnifiedRepresentation, "zen-ur", UR_FORMAT)


_JSON_LOADERS = ((MR_FILE, _parse_mr), (PR_FILE, _parse_pr), (UR_FILE, _parse_ur))


def integrity(case_dir: Path, manifest: dict, *, code: bool = False, rehash: bool = False) -> list[str]:
    """Every problem with the case's files: altered against the manifest's hashes, replaced by something that is
    not a regular file, deleted, present but never recorded, malformed, or contradicting mr.json. Each problem
    starts with the name of the file it concerns."""
    return [
        r for v in verdicts(case_dir, manifest, code=code, rehash=rehash).values() for r in v.reasons if v.status != "unchecked"
    ]


def require_intact(case_dir: Path, manifest: dict, names: tuple[str, ...]) -> None:
    """Refuse to use a file a command reads when it fails verification."""
    bad = [p for p in integrity(case_dir, manifest, code=CODE_FILE in names) if p.split(" ", 1)[0].rstrip(":") in names]
    if bad:
        raise CaseIntegrityError(f"{case_dir}: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                                 "the case is not the one zen wrote; recover it again from the image")  # fmt: skip


def load_manifest(case_dir: Path, *, signature: bool = True, memo: bool = True) -> dict:
    """The manifest, checked against `schemas/manifest.schema.json` (`memo`: see `check_manifest`); a signed case's
    manifest must also match its signature (manifest.sig), else the case is refused: a signed case is never believed
    after a rewrite."""
    from zen.represent.schema import CaseFileError, parse_json

    p = Path(case_dir) / MANIFEST
    if not Path(case_dir).is_dir():
        raise ZenError(f"{case_dir} is not a directory", "give a case directory written by `zen recover IMAGE -o CASE`")
    st = _stat_regular(p)
    if st == "missing":
        raise ZenError(f"{case_dir} is not a zen case (no {MANIFEST})", "create one with `zen recover IMAGE -o CASE`")
    if isinstance(st, str):
        raise CaseFileError(f"{p} is {st}", "recover the case again")
    if st.st_size > MAX_MANIFEST:
        raise CaseFileError(f"{p} is {st.st_size:,} bytes: not a zen case manifest (they are a few KB)", "recover the case again")
    m = parse_json(p, str(p))
    if type(m) is dict and m.get("kind") == "zen-decompile":
        raise CaseFileError(f"{case_dir} was written by `zen decompile` without probing its kernels: it has no case files",
                            "run `zen decompile MODEL.so -o DIR` where TVM is installed (not --static)")  # fmt: skip
    m = check_manifest(m, str(p), memo=memo)
    if signature and (Path(case_dir) / SIG_FILE).exists():
        from zen.represent.signature import check_signature

        sig = check_signature(case_dir)
        if sig["status"] != "valid":
            raise CaseIntegrityError(f"{p}: the case is signed but {sig['reason']}",
                                     "the case is not the one that was signed; `zen verify-case` shows every file")  # fmt: skip
    return m


def check_manifest(m: Any, where: str, *, memo: bool = True) -> dict:
    """A parsed manifest checked against `schemas/manifest.schema.json` (a case's, or one uploaded to
    `zen serve` with a fingerprint); `where` names it in errors.

    Validity is a function of the manifest's content and the schema alone, so a manifest that passed once is known
    by its digest (`digest_cache.passed`): importing jsonschema and building the validator took 0.05-0.1 s of every
    command that reads a case. `memo=False` (`zen verify-case`) checks afresh."""
    from zen.represent.schema import CaseFileError

    if type(m) is not dict or m.get("kind") != "zen-case" or m.get("format") != CASE_FORMAT:
        raise CaseFileError(f"{where} is not a zen case manifest (format {CASE_FORMAT})", "recover the case again")
    import hashlib

    from zen.evidence import digest_cache

    what = f"manifest.schema.json {_manifest_schema()[1]}"
    digest = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
    if memo and digest_cache.passed(what, digest):
        return m
    errors = sorted(_manifest_validator().iter_errors(m), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(x) for x in e.absolute_path) or "(top level)"
        raise CaseFileError(f"{where}: {path}: {e.message[:200]}", "recover the case again")
    digest_cache.remember_passed(what, digest)
    return m


@functools.cache
def _manifest_schema() -> tuple[dict, str]:
    """The manifest's JSON Schema and the sha256 of its text (which names the check in the memo)."""
    import hashlib

    text = resources.files("zen.represent").joinpath("schemas", "manifest.schema.json").read_text()
    return json.loads(text), hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _manifest_validator():
    import jsonschema

    return jsonschema.Draft202012Validator(_manifest_schema()[0])


def _load_checked(case_dir: Path, name: str, missing_hint: str, cls: type, kind: str, fmt: int):
    p = Path(case_dir) / name
    if not p.exists() and not p.is_symlink():
        raise ZenError(f"{case_dir} has no {name}", missing_hint)
    if not (Path(case_dir) / "reuse.json").is_file():
        # a case: the file must be the one the manifest recorded. A reuse package (reuse.json, no
        # manifest) carries a copy of mr.json whose hash its verify.json records instead.
        require_intact(case_dir, load_manifest(case_dir, signature=False), (name,))  # (the command checked it)
    return _cached_record(p, cls, kind, fmt)


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
