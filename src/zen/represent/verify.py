"""Case verification beyond hashes: every file parsed, typed, bounded and checked against the others.

A manifest's hashes only prove that files are the ones the manifest names; anyone can rewrite both. So before a
command trusts a case, each file must also be what zen writes: the manifest small and typed, mr.json / pr.json /
ur.json typed by their dataclasses with bounded nesting and string lengths, each safetensors file well formed
with every tensor's bytes hashing to the sha256 mr.json recorded when the tensor was read from the image, and
code.marshal a mapping of code objects — checked by loading it in an isolated child process, since `marshal` is
not safe against crafted data (a crash there must not take zen down). `zen verify-case` prints one verdict per
file; every other command refuses a failing file it reads (exit 2) and reports the others (exit 5).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from zen.runtime.errors import ZenError

MAX_JSON_FILE = 4 << 30  # bytes of one JSON case file (pr.json of the largest models is a few hundred MB)
MAX_REQUIREMENTS = 1 << 20
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*(\[[A-Za-z0-9,._\-]*\])?(==[^\s#]+)?(\s+#.*)?$")
CODE_CHECK_TIMEOUT = 300.0  # seconds for the child that loads code.marshal (a safety net: it takes ~0.1 s)

_CODE_CHECK = (
    "import json, marshal, sys, types\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "try:\n"
    "    d = marshal.loads(data)\n"
    "except Exception as exc:\n"
    "    print(json.dumps({'error': f'{type(exc).__name__}: {exc}'[:200]})); sys.exit(0)\n"
    "if not isinstance(d, dict):\n"
    "    print(json.dumps({'error': f'a {type(d).__name__}, not a mapping of code objects'})); sys.exit(0)\n"
    "bad = [k for k, v in d.items() if not isinstance(k, str) or not isinstance(v, types.CodeType)]\n"
    "print(json.dumps({'count': len(d), 'bad': len(bad), 'keys': sorted(k for k in d if isinstance(k, str))}))\n"
)


@dataclass
class Verdict:
    """What is wrong with one case file (nothing: it is sound)."""

    name: str
    status: str = "ok"  # ok, missing, unrecorded, altered, malformed, inconsistent, unchecked
    reasons: list[str] = field(default_factory=list)
    how: str | None = None  # where the digests came from when not computed in this run (zen.evidence.digest_cache)

    def add(self, status: str, reason: str) -> None:
        if self.status in ("ok", "unchecked"):
            self.status = status
        self.reasons.append(reason)


def check_code(path: Path, pr_addresses: set[str] | None, python_matches: bool) -> Verdict:
    """code.marshal loaded in an isolated child: a mapping of address -> code object, keyed like pr.json."""
    return CodeCheck(path, python_matches).verdict(pr_addresses)


class CodeCheck:
    """`check_code` started now, answered by `verdict`: the case check starts the child (~0.1 s: a Python
    starting and loading a transformers model's 4 MB of code) before it hashes and parses the other files,
    which it does meanwhile, instead of waiting for it at the end (`zen attribute` of a GPT-2 case waited
    0.08 s). A file that then turns out altered or missing is never judged by it: `cancel`."""

    def __init__(self, path: Path, python_matches: bool) -> None:
        from zen.runtime import childproc

        self.path, self.child, self.failed = path, None, None
        self.python_matches = python_matches
        if not python_matches:
            return
        try:
            self.child = childproc.Started(childproc.code_argv(_CODE_CHECK, [str(path.resolve())], with_pythonpath=False),
                                           text=True)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a failed start is a verdict, not a crash
            self.failed = type(exc).__name__

    def verdict(self, pr_addresses: set[str] | None) -> Verdict:
        path, v = self.path, Verdict(self.path.name)
        if not self.python_matches:
            v.status = "unchecked"
            v.reasons.append("written for another Python version than the one running zen: its code objects cannot be "
                             "loaded here (its sha256 is checked)")  # fmt: skip
            return v
        child, self.child = self.child, None
        try:
            if child is None:
                raise RuntimeError(self.failed)
            proc = child.finish(CODE_CHECK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a timeout or a failed start is a verdict, not a crash
            v.add("malformed", f"{path.name} could not be checked: {self.failed or type(exc).__name__}")
            return v
        try:
            got = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            v.add("malformed", f"{path.name} crashed the interpreter that loaded it (exit {proc.returncode}): crafted or corrupt")
            return v
        if "error" in got:
            v.add("malformed", f"{path.name} is not a marshalled mapping of code objects: {got['error']}")
        elif got["bad"]:
            v.add("malformed", f"{path.name}: {got['bad']} of {got['count']} entries are not address -> code object")
        elif pr_addresses is not None and not set(got["keys"]) <= pr_addresses:
            odd = sorted(set(got["keys"]) - pr_addresses)
            v.add("inconsistent", f"{path.name} holds {len(odd)} code object(s) pr.json does not record, e.g. {odd[0][:40]}")
        return v

    def cancel(self) -> None:
        if self.child is not None:
            self.child.cancel()
            self.child = None


def check_mr_values(mr) -> list[str]:
    """Values in mr.json that no recovery writes: unknown dtypes, impossible shapes, byte counts that do not
    follow from shape and dtype (a record claiming a 10^24-element tensor of 1,728 bytes)."""
    from zen.represent.tensorfile import CODE_OF, ITEMSIZE, MAX_DIMS

    problems = []
    for kind, records in (("tensors", mr.tensors), ("extra_tensors", mr.extra_tensors)):
        for i, t in enumerate(records):
            where = f"mr.json: {kind}[{i}] ({t.key[:60]!r})"
            if len(t.shape) > MAX_DIMS or any(type(d) is not int or d < 0 or d > 1 << 62 for d in t.shape):
                problems.append(f"{where} has an impossible shape")
                continue
            code = CODE_OF.get(t.dtype.replace("torch.", ""))
            if t.status == "ok" and code is None and t.dtype not in ("complex128", "string", "?"):
                problems.append(f"{where} has dtype {t.dtype[:30]!r}, which no recovered tensor has")
            elif t.status == "ok" and code is not None and math.prod(t.shape) * ITEMSIZE[code] != t.nbytes:
                problems.append(f"{where}: {t.nbytes:,} bytes do not follow from shape {t.shape[:8]} and {t.dtype}")
    return problems + graph_problems(mr.graph)


def graph_problems(graph) -> list[str]:
    """The module graph's edges as zen writes them: hierarchy [parent, child, index], data flow [source, target],
    names as strings. Attribution builds the graph from them unchecked (a hand-made [1, "a", 0] or [null, null,
    null] made `zen attribute` fail with an internal error, exit 70), as `library.bundle.bounded` refuses for an
    upload."""
    if type(graph) is not dict:
        return [f"mr.json: graph is {type(graph).__name__}, not an object"]
    for key, width in (("hierarchy", 3), ("dataflow", 2)):
        edges = graph.get(key, [])
        if type(edges) is not list:
            return [f"mr.json: graph.{key} is {type(edges).__name__}, not a list of edges"]
        bad = next((i for i, e in enumerate(edges) if type(e) is not list or len(e) != width
                    or type(e[0]) is not str or type(e[1]) is not str), None)  # fmt: skip
        if bad is not None:
            shape = "[parent, child, index]" if width == 3 else "[source, target]"
            return [f"mr.json: graph.{key}[{bad}] is not {shape} with names as strings"]
    return []


def check_requirements(path: Path) -> Verdict:
    v = Verdict(path.name)
    size = path.stat().st_size
    if size > MAX_REQUIREMENTS:
        v.add("malformed", f"{path.name} is {size:,} bytes: not a requirements file zen writes")
        return v
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError:
        v.add("malformed", f"{path.name} is not UTF-8 text")
        return v
    odd = [ln for ln in lines if ln.strip() and not ln.startswith("#") and not _REQUIREMENT.match(ln)]
    if odd:
        v.add("malformed", f"{path.name}: line {odd[0][:60]!r} is not NAME[==VERSION] [# note]")
    return v


def check_json(case_dir: Path, name: str, loader) -> tuple[Verdict, object | None]:
    """Parse one JSON case file with its typed, bounded loader."""
    from zen.represent.schema import CaseFileError

    v = Verdict(name)
    p = case_dir / name
    size = p.stat().st_size
    if size > MAX_JSON_FILE:
        v.add("malformed", f"{name} is {size:,} bytes (more than {MAX_JSON_FILE:,})")
        return v, None
    try:
        return v, loader(p)
    except CaseFileError as exc:
        v.add("malformed", f"{name} is malformed: {exc.message}")
    except ZenError as exc:
        v.add("malformed", f"{name}: {exc.message}")
    except (RecursionError, MemoryError, OSError) as exc:
        v.add("malformed", f"{name} cannot be read: {type(exc).__name__}")
    return v, None


def python_matches(manifest: dict) -> bool:
    import sys

    version = str((manifest.get("python") or {}).get("version", ""))
    return version.split(".")[:2] == [str(sys.version_info.major), str(sys.version_info.minor)]
