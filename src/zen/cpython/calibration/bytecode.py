"""Calibration of bytecode facts: opcode tables, de-specialisation map, cache sizes, and how
arguments are encoded (name/compare packing, jump offsets) — measured on compiled samples with
`dis`, so the decoder never hard-codes a version's quirks.
"""

from __future__ import annotations

import dis
import opcode

from zen.cpython.calibration.base import CalibrationFailed

_SAMPLE = """
def sample(a, b, *items):
    total = 0
    for i in items:
        if i < a and i > b:
            total += abs(i) @ a - b
        while total <= a:
            total = total + len(str(i))
    return obj.attr.method(total) + mod.name


class Sample(Base):
    def method(self):
        return super().attr + super().other(1)
"""


class BytecodeMixin:
    @staticmethod
    def opcodes() -> dict:
        ops = {
            "opname": list(opcode.opname),
            "opmap": dict(opcode.opmap),
            "have_argument": opcode.HAVE_ARGUMENT,
            "extended_arg": opcode.EXTENDED_ARG,
            "hasjrel": list(getattr(opcode, "hasjrel", [])),
            "hasjabs": list(getattr(opcode, "hasjabs", [])),
            "hasconst": list(opcode.hasconst),
            "hasname": list(opcode.hasname),
            "haslocal": list(opcode.haslocal),
            "hasfree": list(opcode.hasfree),
            "hascompare": list(opcode.hascompare),
        }
        specs = getattr(opcode, "_specializations", None)
        if specs is None:
            try:
                from _opcode_metadata import _specializations as specs  # type: ignore  # 3.13+
            except ImportError:
                specs = {}
        specialized = {}
        import dis

        specialized.update(getattr(dis, "_all_opmap", {}))  # 3.11/3.12: specialised ops fill free slots
        try:
            import _opcode_metadata  # type: ignore

            specialized.update(getattr(_opcode_metadata, "_specialized_opmap", {}))
        except ImportError:
            pass
        name_to_op = dict(opcode.opmap)
        name_to_op.update(specialized)
        for name in getattr(opcode, "_specialized_instructions", ()):
            name_to_op.setdefault(name, None)
        names = list(opcode.opname)
        for op, name in enumerate(names):
            name_to_op.setdefault(name, op)
        deopt = {}
        for base, variants in specs.items():
            for v in variants:
                if name_to_op.get(v) is not None and base in name_to_op:
                    deopt[name_to_op[v]] = name_to_op[base]
        # 3.12+ `sys.monitoring` rewrites instructions as INSTRUMENTED_<base>: the base is the
        # de-instrumented opcode (LINE and INSTRUCTION keep theirs in the monitoring data).
        for name, op in name_to_op.items():
            base = name[len("INSTRUMENTED_") :]
            if op is not None and name.startswith("INSTRUMENTED_") and name_to_op.get(base) is not None:
                deopt.setdefault(op, name_to_op[base])
        ops["deopt"] = {str(k): v for k, v in sorted(deopt.items())}
        ops["enter_executor"] = name_to_op.get("ENTER_EXECUTOR")
        ops["opname_full"] = {str(op): name for name, op in name_to_op.items() if op is not None}
        cache = getattr(opcode, "_inline_cache_entries", None)
        if isinstance(cache, dict):
            ops["cache_entries"] = {str(name_to_op[n]): c for n, c in cache.items() if n in name_to_op}
        elif cache is not None:
            ops["cache_entries"] = {str(i): c for i, c in enumerate(cache) if c}
        else:
            ops["cache_entries"] = {}
        ops["stack_effects"] = stack_effects()
        ops.update(measure_arguments(ops))
        return ops


def stack_effects() -> dict:
    """Net stack effect (not jumping) of every real opcode for arguments 0..15, from this
    version's `dis.stack_effect`: what a reader of another version's bytecode needs to follow
    the value stack without that version's `dis`."""
    out = {}
    for op, name in enumerate(opcode.opname):
        if name.startswith("<"):
            continue
        try:
            if op < opcode.HAVE_ARGUMENT:
                out[str(op)] = [dis.stack_effect(op, jump=False)]
            else:
                out[str(op)] = [dis.stack_effect(op, arg, jump=False) for arg in range(16)]
        except ValueError:
            continue
    return out


def measure_arguments(ops: dict) -> dict:
    """Argument encodings of this version, measured against `dis` on a compiled sample."""
    code = compile(_SAMPLE, "<zen-calibration>", "exec")
    todo, codes = [code], []
    while todo:
        c = todo.pop()
        codes.append(c)
        todo += [k for k in c.co_consts if hasattr(k, "co_code")]
    shifts: dict[str, set] = {}
    jump_base = set()
    units = set()  # bytes per unit of a jump argument: 2 (3.10+: instructions) or 1 (bytes)
    cmp_shift = set()
    for fn, ins in ((c, i) for c in codes for i in dis.get_instructions(c)):
        if ins.arg is None:
            continue
        if ins.opcode in opcode.hasname:
            idx = fn.co_names.index(ins.argval)
            cands = {s for s in (0, 1, 2, 4) if ins.arg >> s == idx}
            shifts[ins.opname] = shifts[ins.opname] & cands if ins.opname in shifts else cands
        if ins.opcode in opcode.hascompare:
            ok = [s for s in (0, 4, 5) if ins.arg >> s < len(opcode.cmp_op) and opcode.cmp_op[ins.arg >> s] == ins.argval]
            cmp_shift.update(ok)
        if ins.opcode in opcode.hasjrel:
            caches = ops["cache_entries"].get(str(ins.opcode), 0)
            back = -1 if "BACKWARD" in ins.opname else 1
            for base, extra in (("next", 0), ("after_caches", caches)):
                for unit in (2, 1):
                    if ins.offset + 2 + 2 * extra + back * unit * ins.arg == ins.argval:
                        jump_base.add(base)
                        units.add(unit)
        if ins.opcode in getattr(opcode, "hasjabs", ()):
            units.update(u for u in (2, 1) if u * ins.arg == ins.argval)
    name_shift = {}
    for name, cands in shifts.items():
        pick = min(cands) if cands else None
        if pick is None:
            raise CalibrationFailed(f"name argument encoding of {name} not found")
        name_shift[name] = pick
    if len(jump_base) != 1:
        if jump_base == {"next", "after_caches"}:
            jump_base = {"next"}  # no jump in the sample had caches: both readings agree
        else:
            raise CalibrationFailed(f"jump offset base ambiguous: {jump_base}")
    nb_ops = [sym for _name, sym in getattr(dis, "_nb_ops", [])]
    if len(units) != 1:
        raise CalibrationFailed(f"jump argument unit ambiguous: {sorted(units)}")
    unit = units.pop()
    return {
        **({"jump_unit": unit} if unit != 2 else {}),  # 3.8/3.9 count jumps in bytes
        "name_arg_shift": name_shift,
        "compare_arg_shift": min(cmp_shift) if cmp_shift else 0,
        "cmp_op": list(opcode.cmp_op),
        "binary_ops": nb_ops,
        "jump_base": jump_base.pop(),
        "backward_jumps": sorted(op for name, op in opcode.opmap.items() if "BACKWARD" in name),
    }
