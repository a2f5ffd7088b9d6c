"""The house (issue 35): imports flow one way through the rooms, no module imports itself back, no file is too long.

`ruff check` and `ruff format --check` hold over the whole tree (pyproject.toml's settings), so style is one thing
the suite enforces rather than a review comment. The import graph of src/zen (and tools/) is built with the
standard library's `ast`, function-level imports and `if TYPE_CHECKING:` imports included: a type-only import still
says one room depends on another. Rooms are ranked in the order of the pipeline, lowest first (DESIGN.md); a module
may import its own room or a lower one.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "zen"
MAX_LINES = 500

# rank of each room: top-level utility modules at the bottom, the commands and workflows at the top
RANKS = {
    "zen": 0, "zen.errors": 0, "zen.console": 0, "zen.forking": 0, "zen.childproc": 0, "zen.digest_cache": 0,
    "zen.image_digest": 0, "zen.outpaths": 0,
    "zen.memory": 1,
    "zen.represent": 2,
    "zen.cpython": 3,
    "zen.frontends": 4, "zen.compiled": 4,
    "zen.library": 5,
    "zen.attribute": 6,
    "zen.diff": 7,
    "zen.patch": 8,
    "zen.reuse": 9,
    "zen.analyze": 10,
    "zen.report": 11,
}  # fmt: skip
TOP = 12  # every other top-level module: cli*, recover*, acquire*, info, demo, limits, the library's build workflow


def _modules(base: Path, prefix: str) -> dict[str, Path]:
    out = {}
    for p in base.rglob("*.py"):
        rel = p.relative_to(base).with_suffix("")
        parts = [prefix, *rel.parts] if prefix else list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _graph(mods: dict[str, Path], top: str) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod, *(f"{mod}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                r = resolve(t) if t.split(".")[0] == top else None
                if r and r != name:
                    edges[name].add(r)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _rank(module: str) -> int:
    parts = module.split(".")
    for n in (2, 1):
        room = ".".join(parts[:n])
        if room in RANKS and (n == 2 or module == "zen"):
            return RANKS[room]
    return TOP


def test_no_import_circle_in_zen():
    assert _cycles(_graph(_modules(SRC, "zen"), "zen")) == []


def test_imports_flow_down_the_pipeline():
    edges = _graph(_modules(SRC, "zen"), "zen")
    upward = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs if _rank(b) > _rank(a))
    assert upward == [], upward


def test_no_import_circle_in_tools():
    tools = ROOT / "tools" / "guestvm"
    assert _cycles(_graph(_modules(tools, "guestvm"), "guestvm")) == []


def test_no_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for base in ("src", "tests", "bench", "tools") for p in (ROOT / base).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}, long


@pytest.mark.parametrize("what", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_holds(what):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    res = subprocess.run([ruff, *what, "src", "tests", "bench", "tools"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
