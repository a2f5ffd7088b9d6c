"""Calibration of instrumented bytecode (3.12+ `sys.monitoring`): where the original opcodes go.

A process run under a debugger, profiler or coverage tool has INSTRUMENTED_* opcodes in its code
objects. Most stand for one base opcode (INSTRUMENTED_CALL for CALL); INSTRUMENTED_LINE and
INSTRUMENTED_INSTRUCTION replace an instruction whose original opcode the interpreter keeps in the
code object's monitoring data (`_co_monitoring`): per code unit in the line table (3.12 and 3.13.0-3.13.2:
an array of 2-byte entries; later 3.13 releases and 3.14: a `bytes_per_entry` byte, then the
entries; readers try both) and in the
per-instruction opcode array. We instrument a sample function with a monitoring tool of our own
and find those arrays by the opcodes we know were there.

Standard library only: run by the target version's interpreter.
"""

from __future__ import annotations

import opcode
import sys

from zen.cpython.calibration.base import CalibrationFailed, one

_SAMPLE = "def mon(a):\n    b = a + 1\n    c = b * 2\n    if c > 3:\n        c = c - a\n    return c\n"


class MonitoringMixin:
    def monitoring(self) -> None:
        mon = getattr(sys, "monitoring", None)
        names = ("INSTRUMENTED_LINE", "INSTRUMENTED_INSTRUCTION")
        if mon is None or not all(n in self._opmap_all() for n in names):
            return
        m = self.m
        ops = self._opmap_all()
        line_op, instr_op = ops["INSTRUMENTED_LINE"], ops["INSTRUMENTED_INSTRUCTION"]
        self.constants.update(INSTRUMENTED_LINE=line_op, INSTRUMENTED_INSTRUCTION=instr_op)
        self.provenance["constants.INSTRUMENTED_LINE"] = "opcode module"
        self.provenance["constants.INSTRUMENTED_INSTRUCTION"] = "opcode module"
        deopt = {int(k): v for k, v in self.opcodes()["deopt"].items()}

        def base(op: int) -> int:
            return deopt.get(op, op)

        ns: dict = {}
        exec(compile(_SAMPLE, "<zen-calibration-monitoring>", "exec"), ns)  # our own sample
        code = ns["mon"].__code__
        ns["mon"](1)
        start = self.off("code", "co_code_adaptive")
        n = len(code.co_code)
        words_before = m.words(id(code), start // 8)
        orig = m.raw(id(code) + start, n)
        tool = next((t for t in range(6) if mon.get_tool(t) is None), None)
        if tool is None:
            raise CalibrationFailed("no free sys.monitoring tool id to instrument a sample")
        ev = mon.events
        mon.use_tool_id(tool, "zen-calibration")
        try:
            mon.register_callback(tool, ev.LINE, lambda *a: None)
            mon.register_callback(tool, ev.INSTRUCTION, lambda *a: None)
            mon.set_local_events(tool, code, ev.LINE)
            now = m.raw(id(code) + start, n)
            lines_at = [i for i in range(0, n, 2) if now[i] == line_op]
            self.check(bool(lines_at), "line events put INSTRUMENTED_LINE into the code")
            words_after = m.words(id(code), start // 8)
            cands = [8 * i for i, (a, b) in enumerate(zip(words_before, words_after)) if a == 0 and b and m.readable(b, 64)]
            mon_off = one("code._co_monitoring", cands)
            self.field("code", "_co_monitoring", mon_off, "ptr", "measured: set when a tool instruments the code")
            md = m.word(id(code) + mon_off)
            self._line_table(md, lines_at, orig, base, n)
            mon.set_local_events(tool, code, ev.LINE | ev.INSTRUCTION)
            now = m.raw(id(code) + start, n)
            instr_at = [i for i in range(0, n, 2) if now[i] in (instr_op, line_op)]
            self.check(any(now[i] == instr_op for i in instr_at), "instruction events put INSTRUMENTED_INSTRUCTION in")
            hits = []
            lines_off = self.off("comonitoring", "lines")
            for off in range(8, 160, 8):
                p = m.word(md + off)
                if off == lines_off or not p or not m.readable(p, n // 2):
                    continue
                arr = m.raw(p, n // 2)
                if all(base(arr[i // 2]) == base(orig[i]) for i in instr_at if now[i] == instr_op):
                    hits.append(off)
            self.field("comonitoring", "per_instruction_opcodes", one("per_instruction_opcodes", hits), "ptr")
        finally:
            mon.set_local_events(tool, code, 0)
            mon.register_callback(tool, ev.LINE, None)
            mon.register_callback(tool, ev.INSTRUCTION, None)
            mon.free_tool_id(tool)

    def _line_table(self, md: int, lines_at: list[int], orig: bytes, base, n: int) -> None:
        """The line-instrumentation pointer and its entry layout."""
        m = self.m
        found = []
        for off in range(8, 160, 8):
            p = m.word(md + off)
            if not p or not m.readable(p, n + 8):
                continue
            raw = m.raw(p, 8 * n + 1) if m.readable(p, 8 * n + 1) else m.raw(p, n + 8)
            for stride in (2, 3, 4):  # 3.12/3.13: an array of {original_opcode, line_delta}
                if all(i // 2 * stride < len(raw) and base(raw[i // 2 * stride]) == base(orig[i]) for i in lines_at):
                    found.append((off, 1, stride))
            bpe = raw[0]  # 3.14: bytes_per_entry, then the entries
            if 1 <= bpe <= 8 and all(
                1 + i // 2 * bpe < len(raw) and base(raw[1 + i // 2 * bpe]) == base(orig[i]) for i in lines_at
            ):
                found.append((off, 2, bpe))
        if not found:
            raise CalibrationFailed("original opcodes of line-instrumented code not found in the monitoring data")
        off, layout, stride = found[0]
        self.field("comonitoring", "lines", off, "ptr", "measured")
        self.constants["LINE_DATA_LAYOUT"] = layout
        self.provenance["constants.LINE_DATA_LAYOUT"] = "measured: 1 = entry array, 2 = bytes_per_entry header"
        if layout == 1:
            self.constants["LINE_DATA_STRIDE"] = stride
            self.provenance["constants.LINE_DATA_STRIDE"] = "measured"

    @staticmethod
    def _opmap_all() -> dict:
        ops = dict(opcode.opmap)
        try:
            import _opcode_metadata  # type: ignore  # 3.13+

            ops.update(getattr(_opcode_metadata, "opmap", {}))
        except ImportError:
            pass
        return ops
