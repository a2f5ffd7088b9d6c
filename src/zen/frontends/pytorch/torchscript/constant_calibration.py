"""Measure how a `torch.jit.load`ed model's code finds its tensor constants (`zen profile torch`).

A saved TorchScript archive keeps tensors that appear in code (a traced `x * 2.5` multiplies by a 0-dim tensor) in
`constants.pkl`, and its code names them `CONSTANTS.c0`, `CONSTANTS.c1`, ... When torch compiles that code, each
use becomes a `prim::Constant` node holding the tensor, whose source range covers exactly the text `CONSTANTS.cN`
in the loaded file. So zen can give every constant its index back: measured here are the range's start and end
(byte offsets into the Source's text, after its Source pointer), the `prim::Constant` kind and the `attr::value`
name symbol (builtin symbols: compile-time numbers of a torch build), on a traced module saved and loaded here and
checked against the archive's own text and constants.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile

from zen.cpython.calibration.base import one

CONSTANT_TEXT = re.compile(rb"CONSTANTS\.c(\d+)")


def _loaded(torch):
    class CalibConst(torch.nn.Module):
        def forward(self, x):
            return x * 2.5 + torch.tensor([1.0, -2.0, 3.5])

    x = torch.ones(2, 3)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(CalibConst(), x, check_trace=False), buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        code = next(t for n in z.namelist() if "/code/" in n and n.endswith(".py") and b"CONSTANTS.c" in (t := z.read(n)))
    buf.seek(0)
    loaded = torch.jit.load(buf)
    loaded(x)
    return loaded, code


def measure_jit_constants(cal) -> None:
    import warnings

    torch, m = cal.torch, cal.m
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warning about torch.tensor in a trace: that is the point
        loaded, code = _loaded(torch)
    uses = [mt.group(0) for mt in CONSTANT_TEXT.finditer(code)]
    cal.check(sorted(set(uses)) == [b"CONSTANTS.c0", b"CONSTANTS.c1"], "the saved code uses two tensor constants")
    value = cal.off("pybind", "value")
    nodes = [n for n in loaded.forward.graph.nodes()
             if n.kind() == "prim::Constant" and n.output().type().kind() == "TensorType"]  # fmt: skip
    cal.check(len(nodes) == len(uses), "one prim::Constant node per use of a constant in the code")
    addrs = [m.word(id(n) + value) for n in nodes]
    src = cal.off("jitnode", "source")

    def ranges(o: int) -> list[bytes] | None:
        out = []
        for a in addrs:
            start, end = m.words(a + o, 2)
            if not start < end <= len(code):
                return None
            out.append(code[start:end])
        return out

    found = [o for o in range(src + 8, src + 64, 8) if sorted(ranges(o) or []) == sorted(uses)]
    start = cal.field("jitnode", "range_start", one("SourceRange start_", found), "u64")
    cal.field("jitnode", "range_end", start + 8, "u64", "measured: the range's end follows its start (checked)")
    u32 = lambda at: struct.unpack("<I", m.raw(at, 4))[0]  # noqa: E731
    kind = cal.off("jitnode", "kind")
    cal.constants["SYM_CONSTANT"] = u32(addrs[0] + kind)
    cal.provenance["constants.SYM_CONSTANT"] = "measured: the kind of a prim::Constant node (a builtin c10::Symbol)"
    attrs = m.words(addrs[0] + cal.off("jitnode", "attributes"), 2)
    cal.check(attrs[1] - attrs[0] == 8, "a tensor constant has one attribute")
    cal.constants["SYM_ATTR_VALUE"] = u32(m.word(attrs[0]) + cal.off("jitattr", "name"))
    cal.provenance["constants.SYM_ATTR_VALUE"] = "measured: the name symbol of a prim::Constant's attribute"
    # each range's index names the tensor its node holds: the archive's constants, in order (c0 = 2.5, c1 = [1, -2, 3.5])
    attr_off, value_off = cal.off("jitnode", "attributes"), cal.off("jitattr", "value")
    impls = {r: m.word(m.word(m.word(a + attr_off)) + value_off) for a, r in zip(addrs, ranges(start) or [])}

    def data(impl: int, n: int) -> bytes:
        return m.raw(m.word(m.word(impl + cal.off("tensorimpl", "storage")) + cal.off("storageimpl", "data")), n)

    cal.check(data(impls[b"CONSTANTS.c0"], 8) == struct.pack("<d", 2.5), "CONSTANTS.c0 holds the traced 2.5")
    cal.check(data(impls[b"CONSTANTS.c1"], 12) == struct.pack("<3f", 1.0, -2.0, 3.5), "CONSTANTS.c1 holds its values")
