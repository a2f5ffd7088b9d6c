"""Bytecode de-specialisation: turn a code object's adaptive bytecode back into `co_code`.

From 3.11 the interpreter rewrites instructions in place as it runs (LOAD_ATTR ->
LOAD_ATTR_INSTANCE_VALUE, ...) and stores counters and cached pointers in the CACHE entries that
follow them. What `code.co_code` returns in Python is the de-specialised form: every opcode mapped
to its base opcode and every inline cache entry zeroed. We do exactly that, with the opcode tables
of the *target's* version taken from its layout profile, so the result equals the live `co_code`
and hashes of it are comparable across processes.

Implementation: `bytes.translate` maps all opcodes at C speed; a loop over *instructions* (not
code units) finds the cache runs to blank. This beats numpy here: code objects are small and
numpy's per-call overhead dominated.
"""

from __future__ import annotations

from zen import native
from zen.cpython.layout.profile import OpcodeTable

_tables: dict[int, tuple[bytes, list[int], int, bytes | None]] = {}


def _lookup(ops: OpcodeTable) -> tuple[bytes, list[int], int, bytes | None]:
    """(opcode -> base opcode, opcode -> cache entries, CACHE, the cache counts as 256 bytes for the compiled
    loop: None where one does not fit a byte, which leaves the profile to the reference)."""
    key = id(ops)
    t = _tables.get(key)
    if t is None:
        deopt = bytearray(range(256))
        for spec, base in ops.deopt.items():
            if 0 <= spec < 256:
                deopt[spec] = base
        caches = [0] * 256
        for op, n in ops.cache_entries.items():
            if 0 <= op < 256:
                caches[op] = n
        cache_op = ops.opmap.get("CACHE", 0)
        small = all(0 <= c < 256 for c in caches) and 0 <= cache_op < 256
        t = (bytes(deopt), caches, cache_op, bytes(caches) if small else None)
        _tables[key] = t
    return t


def deoptimize(adaptive: bytes, ops: OpcodeTable) -> bytes:
    """The de-specialised bytecode of `adaptive` (16-bit code units: opcode, oparg): the compiled loop
    (`zen.native`) where built, `deoptimize_pure` (the reference) otherwise."""
    deopt, _caches, cache_op, small = _lookup(ops)
    if native.core is not None and small is not None:
        return native.core.deoptimize(adaptive, deopt, small, cache_op)
    return deoptimize_pure(adaptive, ops)


def deoptimize_pure(adaptive: bytes, ops: OpcodeTable) -> bytes:
    n = len(adaptive) // 2
    if n == 0:
        return b""
    deopt, caches, cache_op, _ = _lookup(ops)
    out = bytearray(adaptive[: 2 * n])
    base = adaptive[0 : 2 * n : 2].translate(deopt)
    out[0::2] = base
    i = 0
    while i < n:
        c = caches[base[i]]
        if c:
            j = min(n, i + 1 + c)
            out[2 * i + 2 : 2 * j] = bytes((cache_op, 0)) * (j - i - 1)
            i = j
        else:
            i += 1
    return bytes(out)
