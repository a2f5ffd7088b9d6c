"""The system-wide code table of a PR: one compact row for every code object in the image.

[address, module, qualname, first line, bytecode sha256] for ~80,000 code objects of a process that imported
transformers, gathered with numpy and read in bulk; the model-specific code records are programmatic.py's.
"""

from __future__ import annotations

import hashlib

import numpy as np

from zen.cpython.code.bytecode import _lookup, deoptimize
from zen.cpython.readers.code import read_code_brief, uninstrumented
from zen.cpython.runtime import Runtime
from zen.runtime.errors import ZenError


def system_table(rt: Runtime) -> list[list]:
    """[address, module, qualname, first line, bytecode sha256] for every code object in the image.

    A process that imported transformers holds ~80,000 code objects and ~60,000 functions: their
    fields are gathered with numpy and their names read in bulk (`zen.cpython.bulk`); a code
    object the vectorised checks do not accept is read by `read_code_brief`, as before."""
    from zen.cpython import bulk

    ip = rt.ip
    F = ip.P.function
    module_of_code: dict[int, str] = {}
    names: dict[int, str] = {}
    fa = bulk.as_array(rt.function_addrs)
    fcode, ok1 = bulk.gather_field(ip, fa, F.func_code, "ptr")
    fmod, ok2 = bulk.gather_field(ip, fa, F.func_module, "ptr")
    readable = (ok1 & ok2).tolist()
    mod_strs = bulk.strs(ip, sorted({m for m, r in zip(fmod.tolist(), readable) if r and m}))
    for code, mod, r in zip(fcode.tolist(), fmod.tolist(), readable):
        if not r or code in module_of_code:
            continue
        m = names.get(mod)
        if m is None:
            if mod and mod_strs.get(mod) is None:
                try:  # not a readable str: the reader tells "not a str" ("?") from an error (skipped)
                    if rt.kind(mod) == "str":
                        continue
                except ZenError:
                    continue
                m = names[mod] = "?"
            else:
                m = names[mod] = mod_strs[mod] if mod else "?"  # type: ignore[assignment]
        module_of_code[code] = m
    return [r for r in _code_rows(rt, module_of_code) if r is not None]


def _code_rows(rt: Runtime, module_of_code: dict[int, str]) -> list[list | None]:
    from zen.cpython import bulk

    ip = rt.ip
    C, c = ip.P.code, ip.P.constants
    if C.has("co_code"):  # before 3.11: bytecode in a bytes object, nothing to gather in bulk
        return [_legacy_code_row(rt, a, module_of_code) for a in rt.code_addrs]
    from zen.memory.scan import Located

    types = C.fields()
    ca = bulk.as_array(rt.code_addrs)
    offsets = [ip.P.object.ob_type, ip.P.varobject.ob_size, C.co_qualname, C.co_filename, C.co_firstlineno]
    if C.has("co_warmup"):
        offsets.append(C.co_warmup)
    at = Located(ip.space, ca, max(offsets) + 8)  # each code object's chunk found once for all its fields
    good = bulk.plain_headers(ip, ca, ip.wk.types["code"], at)
    units, ok = bulk.gather_field(ip, ca, ip.P.varobject.ob_size, "i64", at)
    good &= ok & (units > 0) & (units <= ip.limits.max_code_units)
    qual, ok = bulk.gather_field(ip, ca, C.co_qualname, "ptr", at)
    good &= ok
    fname, ok = bulk.gather_field(ip, ca, C.co_filename, "ptr", at)
    good &= ok
    first, ok = bulk.gather_field(ip, ca, C.co_firstlineno, types["co_firstlineno"][1], at)
    good &= ok
    quickened = [True] * len(ca)  # 3.11 after warm-up; always from 3.12
    if C.has("co_warmup"):
        warm, ok = bulk.gather_field(ip, ca, C.co_warmup, types["co_warmup"][1], at)
        good &= ok
        quickened = (warm >= 0).tolist()
    unit = c.get("CODE_UNIT_SIZE", 2)
    adaptive = bulk.byte_slices(ip, ca + np.uint64(C.co_code_adaptive), np.where(good, units * unit, -1))
    good_l = good.tolist()
    sel = [i for i, g in enumerate(good_l) if g and adaptive[i] is not None]
    qs = bulk.strs(ip, [int(x) for x in qual[sel].tolist()])
    fs = bulk.strs(ip, [int(x) for x in fname[sel].tolist()])
    columns = (rt.code_addrs, adaptive, good_l, qual.tolist(), fname.tolist(), first.tolist(), quickened)
    rows = _compiled_rows(ip, columns, qs, fs, module_of_code)
    if rows is None:  # the reference: every row here
        return [_row(ip, *c, qs, fs, module_of_code) for c in zip(*columns)]
    return rows


def _compiled_rows(ip, columns, qs: dict, fs: dict, module_of_code: dict[int, str]) -> list[list | None] | None:
    """The rows by the compiled loop (`native/code_rows.c`), the reference's `_row` making those it leaves to it
    (a code object the vectorised checks refused, instrumented bytecode); None without the compiled core or
    where a table does not fit its bytes."""
    from zen import native
    from zen.evidence import hashing

    deopt, _caches, cache_op, small = _lookup(ip.P.opcodes)
    if native.core is None or small is None or not hasattr(native.core, "code_rows"):
        return None
    c, ops = ip.P.constants, ip.P.opcodes
    ops_of = [c.get("INSTRUMENTED_LINE"), c.get("INSTRUMENTED_INSTRUCTION"), ops.enter_executor]
    if any(o is not None and not 0 <= o < 256 for o in ops_of):
        return None
    tables = (deopt, small, cache_op, *(-1 if o is None else o for o in ops_of))
    addrs, codes, good, quals, fnames, lines, quick = (x if type(x) is list else list(x) for x in columns)
    rows, fallback = native.core.code_rows(addrs, codes, good, quals, qs, fnames, fs, lines, quick, module_of_code,
                                           tables, hashing.sha256)  # fmt: skip
    for i in fallback:
        rows[i] = _row(ip, *(col[i] for col in columns), qs, fs, module_of_code)
    return rows


def _row(ip, addr: int, code: bytes | None, g: bool, q: int, fn: int, line: int, quick: bool, qs: dict, fs: dict,
         module_of_code: dict[int, str]) -> list | None:  # fmt: skip
    """One code object's row from its gathered fields (the reference of `native/code_rows.c`); None: no row."""
    if code is None or not g:
        try:
            qualname, _filename, line, code = read_code_brief(ip, addr)
        except ZenError:
            return None
    else:
        qualname = qs[q]
        if qualname is None or fs[fn] is None:
            return None
        if quick:
            try:
                code = deoptimize(uninstrumented(ip, addr, code), ip.P.opcodes)
            except ZenError:
                return None
    return [hex(addr), module_of_code.get(addr, "?"), qualname, line, hashlib.sha256(code).hexdigest()[:32]]


def _legacy_code_row(rt: Runtime, addr: int, module_of_code: dict[int, str]) -> list | None:
    try:
        qualname, _filename, line, code = read_code_brief(rt.ip, addr)
    except ZenError:
        return None
    return [f"{addr:#x}", module_of_code.get(addr, "?"), qualname, line, hashlib.sha256(code).hexdigest()[:32]]
