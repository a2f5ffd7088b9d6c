"""Reader for code objects (PyCodeObject): every field needed to rebuild or fingerprint one.

The bytecode in memory is the *adaptive* copy (`co_code_adaptive`): specialised opcodes and
inline caches filled by the running interpreter. `code` in the record is the de-specialised
bytecode, equal to what `co_code` returns in the live process. Local-variable names and kinds are
stored merged (`co_localsplusnames`/`co_localspluskinds`); varnames/cellvars/freevars are derived
from the kinds exactly as CPython derives them.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from zen.cpython.code.bytecode import deoptimize
from zen.cpython.readers.code_info import CodeInfo
from zen.runtime.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader

_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_stacksize",
    "co_firstlineno",
    "co_flags",
    "co_nlocals",
    "co_nlocalsplus",
    "co_consts",
    "co_names",
    "co_localsplusnames",
    "co_localspluskinds",
    "co_filename",
    "co_name",
    "co_qualname",
    "co_linetable",
    "co_exceptiontable",
)


_INTS = _FIELDS[:8]  # read as the profile types them; the rest are pointers
_SIZES = {"i8": 2, "u8": 2, "i16": 5, "u16": 4, "i32": 9, "u32": 8, "i64": 17, "u64": 16}  # size * 2 + signed


def _native_spec(ip: ImageReader) -> bytes | None:
    """The profile's code layout as the compiled reader takes it (native/code_object.c), made once per
    interpreter; None where it cannot read this layout (before 3.11, a field missing or typed otherwise:
    the reference then reads, and says what is wrong)."""
    memo = ip.census_memo
    if "code_spec" in memo:
        return memo["code_spec"]
    spec = None
    C, c = ip.P.code, ip.P.constants
    types = C.fields()
    if ip.fast is not None and not C.has("co_code") and all(C.has(n) for n in _FIELDS) and "co_code_adaptive" in types:
        ints = [x for n in _INTS for x in (types[n][0], _SIZES.get(types[n][1], 0))]
        if all(ints[1::2]) and all(types[n][1] in ("ptr", "u64") for n in _FIELDS[8:]):
            warm = types["co_warmup"][0] if "co_warmup" in types else -1
            words = [C.co_code_adaptive, c.get("CODE_UNIT_SIZE", 2), ip.limits.max_code_units, warm, *ints,
                     *(types[n][0] for n in _FIELDS[8:]), c["CO_FAST_LOCAL"], c["CO_FAST_CELL"], c["CO_FAST_FREE"]]  # fmt: skip
            spec = struct.pack(f"<{len(words)}q", *words)
    memo["code_spec"] = spec
    return spec


def read_code(ip: ImageReader, addr: int) -> CodeInfo:
    spec = ip.census_memo.get("code_spec", b"") if ip.fast is not None else None
    if spec == b"":
        spec = _native_spec(ip)
    got = ip.fast.code(addr, spec) if spec is not None else None  # type: ignore[union-attr]
    if got is not None:  # read in one call; what follows the reading is the reference's own
        adaptive = got[17]
        code = deoptimize(uninstrumented(ip, addr, adaptive), ip.P.opcodes) if got[18] else adaptive
        return CodeInfo(addr, *got[:18], code, got[19], got[20], got[21])
    kind = ip.kind(addr)
    if kind != "code":
        raise ObjectError(addr, f"expected a code object, found {kind}")
    C = ip.P.code
    if C.has("co_code"):
        from zen.cpython.readers.legacy_code import read_legacy_code

        return read_legacy_code(ip, addr)
    from zen.cpython.readers.containers import read_tuple
    from zen.cpython.readers.text import read_bytes

    try:
        units = ip.space.i64(addr + ip.P.varobject.ob_size)
        if not 0 < units <= ip.limits.max_code_units:
            raise ObjectError(addr, f"implausible code size of {units} units (limit max_code_units={ip.limits.max_code_units})")
        unit = ip.P.constants.get("CODE_UNIT_SIZE", 2)
        raw = ip.read_within(addr, C.co_code_adaptive + units * unit, addr, "code object")
    except MemoryReadError:
        raise ObjectError(addr, "code object not in the image") from None

    f = C.reader(*_FIELDS).unpack(raw)
    adaptive = raw[C.co_code_adaptive :]
    # 3.11 quickens code (rewrites opcodes, fills caches) only once its warm-up counter reaches
    # zero: before that the adaptive bytes are exactly co_code (see read_code_brief)
    quickened = True
    if C.has("co_warmup"):
        quickened = int.from_bytes(raw[C.co_warmup : C.co_warmup + 2], "little", signed=True) >= 0
    names = _names(ip, f.co_names)
    lp_names = _names(ip, f.co_localsplusnames)
    lp_kinds = read_bytes(ip, f.co_localspluskinds)
    if len(lp_kinds) != len(lp_names):
        raise ObjectError(addr, "local names and kinds differ in length")
    info = CodeInfo(
        addr=addr,
        argcount=f.co_argcount,
        posonlyargcount=f.co_posonlyargcount,
        kwonlyargcount=f.co_kwonlyargcount,
        stacksize=f.co_stacksize,
        firstlineno=f.co_firstlineno,
        flags=f.co_flags,
        nlocals=f.co_nlocals,
        nlocalsplus=f.co_nlocalsplus,
        consts=read_tuple(ip, f.co_consts),
        names=names,
        localsplusnames=lp_names,
        localspluskinds=lp_kinds,
        filename=ip.str(f.co_filename),
        name=ip.str(f.co_name),
        qualname=ip.str(f.co_qualname),
        linetable=read_bytes(ip, f.co_linetable),
        exceptiontable=read_bytes(ip, f.co_exceptiontable),
        adaptive=adaptive,
        code=deoptimize(uninstrumented(ip, addr, adaptive), ip.P.opcodes) if quickened else adaptive,
    )
    if not (0 <= info.argcount <= 1 << 16 and 0 <= info.nlocalsplus <= 1 << 20 and info.nlocalsplus == len(lp_names)):
        raise ObjectError(addr, "implausible code object counts")
    c = ip.P.constants
    local, cell, free = c["CO_FAST_LOCAL"], c["CO_FAST_CELL"], c["CO_FAST_FREE"]
    info.varnames = tuple(n for n, k in zip(lp_names, lp_kinds) if k & local)
    info.cellvars = tuple(n for n, k in zip(lp_names, lp_kinds) if k & cell)
    info.freevars = tuple(n for n, k in zip(lp_names, lp_kinds) if k & free)
    return info


def _names(ip: ImageReader, addr: int) -> tuple[str, ...]:
    """The strs of a tuple of names: in one call by the compiled reader where it can answer."""
    got = ip.fast.strs(addr) if ip.fast is not None else None
    if got is not None:
        return got
    from zen.cpython.readers.containers import read_tuple

    return tuple(ip.str(a) for a in read_tuple(ip, addr))


def read_code_brief(ip: ImageReader, addr: int) -> tuple[str, str, int, bytes]:
    """(qualname, filename, first line, de-specialised bytecode): what a system-wide table needs,
    without reading constants, names and local tables."""
    kind = ip.kind(addr)
    if kind != "code":
        raise ObjectError(addr, f"expected a code object, found {kind}")
    C = ip.P.code
    if C.has("co_code"):  # before 3.11: no qualname, co_code is a bytes object and never rewritten
        ci = read_code(ip, addr)
        return ci.qualname, ci.filename, ci.firstlineno, ci.code
    units = ip.space.i64(addr + ip.P.varobject.ob_size)
    if not 0 < units <= ip.limits.max_code_units:
        raise ObjectError(addr, f"implausible code size of {units} units (limit max_code_units={ip.limits.max_code_units})")
    raw = ip.read_within(addr, C.co_code_adaptive + units * ip.P.constants.get("CODE_UNIT_SIZE", 2), addr, "code object")
    f = C.reader("co_qualname", "co_filename", "co_firstlineno").unpack(raw)
    adaptive = raw[C.co_code_adaptive :]
    if C.has("co_warmup"):
        # 3.11 quickens code (rewrites opcodes, fills caches) only once its warm-up counter reaches
        # zero: before that the adaptive bytes are exactly co_code and need no de-specialisation.
        warm = int.from_bytes(raw[C.co_warmup : C.co_warmup + 2], "little", signed=True)
        if warm < 0:
            return ip.str(f.co_qualname), ip.str(f.co_filename), f.co_firstlineno, adaptive
    return (
        ip.str(f.co_qualname),
        ip.str(f.co_filename),
        f.co_firstlineno,
        deoptimize(uninstrumented(ip, addr, adaptive), ip.P.opcodes),
    )


def uninstrumented(ip: ImageReader, addr: int, adaptive: bytes) -> bytes:
    """`adaptive` with the instructions `sys.monitoring` replaced (3.12+) put back.

    INSTRUMENTED_LINE and INSTRUMENTED_INSTRUCTION hide the original opcode, which the code
    object's monitoring data keeps per code unit (line table first, then the per-instruction
    opcodes, as CPython resolves them); other INSTRUMENTED_* opcodes de-specialise like any other.
    An instruction handed to the tier-2 optimiser (ENTER_EXECUTOR, 3.13+) is refused with a clear
    error: its original lives in the executor, which zen does not read."""
    c, ops = ip.P.constants, ip.P.opcodes
    line_op, instr_op, enter = c.get("INSTRUMENTED_LINE"), c.get("INSTRUMENTED_INSTRUCTION"), ops.enter_executor
    if line_op is None and enter is None:  # 3.11: neither exists
        return adaptive
    units = adaptive[0::2]
    suspects = [x for x in (line_op, instr_op, enter) if x is not None and x in units]
    if not suspects:  # fast path: cache entries may hold these byte values too, instructions do not
        return adaptive

    def walk(lines: tuple[bytes, int], per_instr: bytes) -> bytes:
        out = bytearray(adaptive)
        n, i = len(units), 0
        while i < n:
            op = units[i]
            if op == enter:
                raise ObjectError(addr, "bytecode holds ENTER_EXECUTOR (the tier-2 optimiser/JIT was on): not supported")
            if op in (line_op, instr_op):
                data, step = lines
                if op == line_op:
                    if not step or i * step >= len(data):
                        raise ObjectError(addr, "INSTRUMENTED_LINE without line instrumentation data")
                    op = data[i * step]
                if op == instr_op:
                    if i >= len(per_instr):
                        raise ObjectError(addr, "INSTRUMENTED_INSTRUCTION without per-instruction data")
                    op = per_instr[i]
                if op in (line_op, instr_op) or op == 0 or ops.name(op).startswith("<"):
                    raise ObjectError(addr, f"instrumented instruction {i} resolves to no opcode ({op})")
                out[2 * i] = op
            i += 1 + ops.cache_entries.get(ops.base_op(op), 0)
        return bytes(out)

    if line_op not in units and instr_op not in units:
        return walk((b"", 0), b"")  # only ENTER_EXECUTOR candidates (or cache bytes that look alike)
    try:
        readings, per_instr = _monitoring_data(ip, addr, len(units))
        problem: ObjectError | None = None
    except ObjectError as exc:  # cache entries can hold those byte values: only real instructions need it
        readings, per_instr, problem = [], b"", exc
    for reading in readings or [(b"", 0)]:
        try:
            return walk(reading, per_instr)
        except ObjectError as exc:  # another reading of the line table may fit (3.13.0-3.13.2 vs later)
            problem = problem or exc
    raise problem or ObjectError(addr, "instrumented bytecode could not be read")


def _monitoring_data(ip: ImageReader, addr: int, n: int) -> tuple[list[tuple[bytes, int]], bytes]:
    """(readings of the line table as (entries, entry size), per-instruction opcodes) of an
    instrumented code object.

    The line table's layout changed within 3.13 (3.13.0-3.13.2: 2-byte entries; 3.13.3+: a
    `bytes_per_entry` byte first), so both readings are tried, the profile's first, and the one
    whose entries are real opcodes wherever the code says INSTRUMENTED_LINE is kept."""
    c, C = ip.P.constants, ip.P.code
    if not C.has("_co_monitoring") or "comonitoring" not in ip.P.structs:
        raise ObjectError(addr, "instrumented bytecode, but the layout profile has no monitoring data layout")
    M = ip.P.comonitoring
    try:
        md = ip.ptr(addr + C._co_monitoring)
        if not md:
            raise ObjectError(addr, "instrumented bytecode but no monitoring data")
        lines, per_instr = ip.ptr(md + M.lines), ip.ptr(md + M.per_instruction_opcodes)
        instr = ip.read_within(per_instr, n, addr, "instruction instrumentation") if per_instr else b""
    except MemoryReadError:
        raise ObjectError(addr, "monitoring data of instrumented code not in the image") from None
    if not lines:
        return [], instr
    readings = []
    for layout in (c.get("LINE_DATA_LAYOUT", 1), 3 - c.get("LINE_DATA_LAYOUT", 1)):
        try:
            if layout == 2:
                bpe = ip.space.read(lines, 1)[0]
                if 1 <= bpe <= 16:
                    readings.append((ip.read_within(lines + 1, bpe * n, addr, "line instrumentation"), bpe))
            else:
                stride = c.get("LINE_DATA_STRIDE", 2)
                readings.append((ip.read_within(lines, stride * n, addr, "line instrumentation"), stride))
        except (MemoryReadError, ObjectError):
            continue
    return readings, instr
