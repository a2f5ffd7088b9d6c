"""The TorchScript code a `torch.jit.load`ed model was compiled from, read from the image.

`torch.jit.load` compiles the archive's `code/__torch__/**.py` files into one `CompilationUnit`; each file's text
stays alive as a `torch::jit::Source` that every graph node compiled from it points to. Reached here through the
layout `zen profile torch` measured (`source_calibration.py`): each module's ClassType -> its CompilationUnit ->
every function -> its graph's nodes (nested blocks too) -> each node's Source -> file name and text.

A node may hold a stale word where it keeps no source range (measured: there is no flag beside it), so a Source
is taken only when everything checks: a plausible piece vector, readable UTF-8 text, and a file name of the form
the archive writer uses (`code/__torch__/a/b.py`). A Python file's text (a model scripted in this process) never
has that form. Two different texts for one file name are a conflict: neither is taken, and the file is named.
Every walk is bounded (compilation units, functions, nodes, pieces, bytes).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from zen.frontends.pytorch.torchscript.reader import JitReader
from zen.runtime.errors import ZenError

SOURCE_FIELDS = {"classtype": ("compilation_unit",), "compilationunit": ("functions",), "graphfunction": ("graph",),
                 "jitgraph": ("block",), "jitblock": ("input", "output"), "jitnode": ("next", "blocks", "source"),
                 "jitsource": ("pieces", "filename")}  # fmt: skip
CONSTANT_FIELDS = {"jitnode": ("range_start", "range_end", "kind", "attributes", "outputs"), "jitattr": ("name", "value"),
                   "jitvalue": ("type",), "jittype": ("kind",)}  # fmt: skip
CONSTANT_TEXT = re.compile(rb"CONSTANTS\.c(\d{1,6})")
FILE_NAME = re.compile(r"code/__torch__(/[A-Za-z_][A-Za-z0-9_]*)*\.py")
REFERENCE = re.compile(r"__torch__(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
MAX_UNITS = 64  # compilation units (one per jit.load)
MAX_FUNCTIONS = 200_000
MAX_NODES = 2_000_000  # graph nodes walked in all
MAX_PIECES = 4096
MAX_FILE = 16 << 20  # bytes of one code file
MAX_TOTAL = 64 << 20  # bytes of code in all
MAX_CONSTANTS = 100_000  # tensor constant nodes


@dataclass
class CodeFiles:
    """What was read: file name -> text, the files two texts claim (conflicts), and why the walk stopped early."""

    files: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # `CONSTANTS.cN` of the code -> the TensorImpl its prim::Constant nodes hold (indices two tensors claim: conflicts)
    tensor_constants: dict[int, int] = field(default_factory=dict)
    constant_conflicts: list[int] = field(default_factory=list)


def has_source_layout(jr: JitReader) -> bool:
    return all(s in jr.tp.structs and all(f in jr.tp.structs[s]._fields for f in fs) for s, fs in SOURCE_FIELDS.items())


def file_of(qualified: str) -> str:
    """`__torch__.torch.nn.modules.linear.___torch_mangle_0.Linear` -> its archive file
    `code/__torch__/torch/nn/modules/linear/___torch_mangle_0.py` (the qualifier's path)."""
    return "code/" + "/".join(qualified.split(".")[:-1]) + ".py"


def needed_files(class_names: list[str], files: dict[str, str]) -> list[str]:
    """Every file the classes' code needs: their own, and, transitively, each file whose names their code uses
    (a `__torch__.a.b.name` reference needs `code/__torch__/a/b.py`, or, for a class's method, the class's file)."""
    want = {file_of(n) for n in class_names}
    todo = [f for f in want if f in files]
    seen = set(todo)
    while todo:
        for ref in set(REFERENCE.findall(files[todo.pop()])):
            atoms = ref.split(".")
            cands = ["code/" + "/".join(atoms[:i]) + ".py" for i in range(len(atoms) - 1, 0, -1)]
            hit = next((c for c in cands if c in files), cands[0])  # the longest qualifier that is a file
            want.add(hit)
            if hit in files and hit not in seen:
                seen.add(hit)
                todo.append(hit)
    return sorted(want)


class SourceReader:
    """Reads the code files behind the ClassTypes of a TorchScript model."""

    def __init__(self, jr: JitReader) -> None:  # noqa: D107
        self.jr, self.ip, self.tp = jr, jr.ip, jr.tp
        self._sources: dict[int, tuple[str, str] | None] = {}
        c, st = self.tp.constants, self.tp.structs
        self.const = all(k in c for k in ("SYM_CONSTANT", "SYM_ATTR_VALUE", "TYPE_TENSOR")) and all(
            s in st and all(f in st[s]._fields for f in fs) for s, fs in CONSTANT_FIELDS.items())  # fmt: skip
        self._constant_nodes: list[tuple[int, int, int, int]] = []  # (Source, range start, range end, TensorImpl)

    def code(self, class_types: list[int]) -> CodeFiles:
        out = CodeFiles()
        units = list(dict.fromkeys(self.ip.ptr(ct + self.tp.classtype.compilation_unit) for ct in class_types))
        units = [u for u in units if u][:MAX_UNITS]
        texts: dict[str, set[str]] = {}
        budget = [MAX_NODES, MAX_TOTAL]
        for cu in units:
            try:
                functions = self._vector(cu + self.tp.compilationunit.functions, MAX_FUNCTIONS)
            except ZenError as exc:
                out.problems.append(f"compilation unit at {cu:#x} not read: {exc}")
                continue
            for fn in functions:
                for src in self._graph_sources(fn, budget):
                    got = self._source(src, budget)
                    if got is not None:
                        texts.setdefault(got[0], set()).add(got[1])
            if budget[0] <= 0:
                out.problems.append(f"more than {MAX_NODES:,} graph nodes: the code walk stopped")
                break
        for name, found in sorted(texts.items()):
            if len(found) == 1:
                out.files[name] = next(iter(found))
            else:
                out.conflicts.append(name)
        self._constants(out)
        return out

    def _constants(self, out: CodeFiles) -> None:
        """Give each tensor constant node its `CONSTANTS.cN` index: the text its source range covers, in a Source
        that checked (a range that is not exactly such a name is not taken)."""
        claims: dict[int, set[int]] = {}
        raw: dict[int, bytes] = {}
        for src, start, end, impl in self._constant_nodes:
            got = self._sources.get(src)
            if got is None or got[0] not in out.files:
                continue
            text = raw.setdefault(src, got[1].encode("utf-8"))
            m = CONSTANT_TEXT.fullmatch(text[start:end]) if 0 <= start < end <= len(text) and end - start <= 20 else None
            if m:
                claims.setdefault(int(m.group(1)), set()).add(impl)
        out.tensor_constants = {i: next(iter(s)) for i, s in sorted(claims.items()) if len(s) == 1}
        out.constant_conflicts = sorted(i for i, s in claims.items() if len(s) > 1)

    def _constant_node(self, node: int, src: int) -> None:
        """Keep a prim::Constant node holding a tensor (one `value` attribute, a Tensor-typed output)."""
        T, c = self.tp, self.tp.constants
        if self.ip.space.u32(node + T.jitnode.kind) != c["SYM_CONSTANT"] or len(self._constant_nodes) >= MAX_CONSTANTS:
            return
        attrs, outs = self._vector(node + T.jitnode.attributes, 64), self._vector(node + T.jitnode.outputs, 64)
        if len(attrs) != 1 or len(outs) != 1 or self.ip.space.u32(attrs[0] + T.jitattr.name) != c["SYM_ATTR_VALUE"]:
            return
        if self.ip.space.u32(self.ip.ptr(outs[0] + T.jitvalue.type) + T.jittype.kind) != c["TYPE_TENSOR"]:
            return
        start, end = self.ip.space.u64(node + T.jitnode.range_start), self.ip.space.u64(node + T.jitnode.range_end)
        self._constant_nodes.append((src, start, end, self.ip.ptr(attrs[0] + T.jitattr.value)))

    def _vector(self, at: int, most: int, elem: int = 8) -> list[int]:
        b, e = self.ip.space.u64(at), self.ip.space.u64(at + 8)
        n, rest = divmod(e - b, elem)
        if rest or not 0 <= n <= most:
            raise ZenError(f"implausible vector at {at:#x} ({e - b:,} bytes)")
        if elem != 8:
            return [b + i * elem for i in range(n)]
        return list(struct.unpack(f"<{n}Q", self.ip.space.read(b, 8 * n))) if n else []

    def _graph_sources(self, fn: int, budget: list[int]) -> set[int]:
        """The distinct Source words of a function's graph nodes (its top block and nested blocks)."""
        T = self.tp
        out: set[int] = set()
        try:
            graph = self.ip.ptr(fn + T.graphfunction.graph)
            stack = [self.ip.ptr(graph + T.jitgraph.block)] if graph else []
        except ZenError:
            return out
        seen_blocks: set[int] = set()
        while stack and budget[0] > 0:
            blk = stack.pop()
            if not blk or blk in seen_blocks:
                continue
            seen_blocks.add(blk)
            try:
                node, last = self.ip.ptr(blk + T.jitblock.input), self.ip.ptr(blk + T.jitblock.output)
                seen: set[int] = set()
                while node and node not in seen and budget[0] > 0:
                    seen.add(node)
                    budget[0] -= 1
                    src = self.ip.space.u64(node + T.jitnode.source)
                    if src:
                        out.add(src)
                        if self.const:
                            try:
                                self._constant_node(node, src)
                            except ZenError:
                                pass  # a stale or corrupt constant node: its index stays unread, and is named
                    stack += self._vector(node + T.jitnode.blocks, 64)
                    if node == last:
                        break
                    node = self.ip.ptr(node + T.jitnode.next)
            except ZenError:
                continue  # a corrupt block ends its own walk; the other graphs are still read
        return out

    def _source(self, src: int, budget: list[int]) -> tuple[str, str] | None:
        """(file name, text) of a Source that checks; None otherwise (a stale word, a Python file, corruption)."""
        if src in self._sources:
            return self._sources[src]
        got = None
        try:
            name = self.jr.string(src + self.tp.jitsource.filename, 4096)
            if FILE_NAME.fullmatch(name):
                parts = []
                size = 0
                for p in self._vector(src + self.tp.jitsource.pieces, MAX_PIECES, self.jr.c.get("PIECE_SIZE", 16)):
                    n, data = self.ip.space.u64(p), self.ip.space.u64(p + 8)
                    size += n
                    if size > MAX_FILE or size > budget[1]:
                        raise ZenError(f"code file {name} larger than {min(MAX_FILE, budget[1]):,} bytes")
                    parts.append(self.ip.space.read(data, n) if n else b"")
                budget[1] -= size
                got = (name, b"".join(parts).decode("utf-8"))
        except (ZenError, UnicodeDecodeError):
            got = None
        self._sources[src] = got
        return got
