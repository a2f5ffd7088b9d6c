"""Bytecode de-specialisation: turn a code object's adaptive bytecode back into `co_code`.

From 3.11 the interpreter rewrites instructions in place as it runs (LOAD_ATTR ->
LOAD_ATTR_INSTANCE_VALUE, ...) and stores counters and cached pointers in the CACHE entries that
follow them. What `code.co_code` returns in Python is the de-specialised form: every opcode mapped
to its base opcode and every inline cache entry zeroed. We do exactly that, with the opcode tables
of the *target's* version taken from its layout profile, so the result equals the live `co_code`
and hashes of it are comparable across processes.
"""

from __future__ import annotations

import numpy as np

from zen.cpython.profile import OpcodeTable

_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _lookup(ops: OpcodeTable) -> tuple[np.ndarray, np.ndarray]:
    key = id(ops)
    t = _tables.get(key)
    if t is None:
        deopt = np.arange(256, dtype=np.uint8)
        for spec, base in ops.deopt.items():
            if 0 <= spec < 256:
                deopt[spec] = base
        caches = np.zeros(256, dtype=np.int64)
        for op, n in ops.cache_entries.items():
            if 0 <= op < 256:
                caches[op] = n
        t = (deopt, caches)
        _tables[key] = t
    return t


def deoptimize(adaptive: bytes, ops: OpcodeTable) -> bytes:
    """The de-specialised bytecode of `adaptive` (16-bit code units: opcode, oparg)."""
    n = len(adaptive) // 2
    if n == 0:
        return b""
    deopt, caches = _lookup(ops)
    units = np.frombuffer(adaptive[: 2 * n], dtype=np.uint8).reshape(n, 2).copy()
    base = deopt[units[:, 0]]
    ncache = caches[base]
    if not ncache.any():
        units[:, 0] = base
        return units.tobytes()
    # Walk instruction starts: cache entries may hold any bytes, so they must be skipped, not mapped.
    is_cache = np.zeros(n, dtype=bool)
    nc = ncache.tolist()
    i = 0
    while i < n:
        c = nc[i]
        if c:
            is_cache[i + 1 : i + 1 + c] = True
            i += 1 + c
        else:
            i += 1
    units[:, 0] = np.where(is_cache, ops.opmap.get("CACHE", 0), base)
    units[is_cache, 1] = 0
    return units.tobytes()
