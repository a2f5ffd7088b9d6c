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

# Each package is a floor, ranked in the order of the pipeline (lowest first, DESIGN.md): a module may import its own
# package or a lower one. The process plumbing and the evidence's bookkeeping are the ground floors; the commands
# (`cli/`) are the roof, and only `__main__` stands above them.
RANKS = {
    "runtime": 0, "native": 0, "evidence": 1, "memory": 2, "represent": 3, "cpython": 4, "frontends": 5, "compiled": 5,
    "recover": 6, "acquire": 7, "library": 8, "attribute": 9, "diff": 10, "patch": 11, "reuse": 12, "analyze": 13,
    "report": 14, "serve": 15, "demo": 16, "cli": 17,
}  # fmt: skip
MAIN = 18  # zen.__main__
MAX_MODULES = 13  # modules at one package's top level (subpackages not counted)


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
    if module == "zen":
        return 0
    if module == "zen.__main__":
        return MAIN
    return RANKS[parts[1]]


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


def test_top_level_is_the_pipeline():
    """`ls src/zen` shows only the stages: packages, each ranked, plus `__init__.py` and `__main__.py`."""
    entries = {p.name for p in SRC.iterdir() if p.name != "__pycache__"}
    loose = sorted(e for e in entries if e.endswith(".py") and e not in {"__init__.py", "__main__.py"})
    assert loose == [], f"loose modules at the top of src/zen: {loose}"
    packages = {e for e in entries if (SRC / e / "__init__.py").is_file()}
    assert packages == set(RANKS), (sorted(packages - set(RANKS)), sorted(set(RANKS) - packages))


def test_no_package_is_crowded():
    crowded = {}
    for init in SRC.rglob("__init__.py"):
        n = sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
        if n > MAX_MODULES:
            crowded[str(init.parent.relative_to(SRC))] = n
    assert crowded == {}, crowded


def test_only_main_imports_the_cli():
    """The commands are the roof: nothing in the pipeline may reach up into `cli/`, so every stage stays a library."""
    edges = _graph(_modules(SRC, "zen"), "zen")
    into_cli = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                      if b.startswith("zen.cli") and not (a.startswith("zen.cli") or a == "zen.__main__"))  # fmt: skip
    assert into_cli == [], into_cli
