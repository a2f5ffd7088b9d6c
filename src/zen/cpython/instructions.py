"""Decode bytecode of any supported CPython version into instructions with resolved arguments.

Driven by the opcode data in the target's layout profile (names, cache sizes, how name and compare
arguments are packed, the base of relative jumps), never by the running interpreter's `dis`, so
code from a 3.13 image decodes correctly under zen's 3.11. Input is de-specialised bytecode
(`CodeInfo.code`): inline caches are skipped by size, EXTENDED_ARG prefixes are folded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zen.cpython.profile import OpcodeTable

MAX_INSTRUCTIONS = 1 << 20


@dataclass(frozen=True, slots=True)
class Instruction:
    offset: int  # byte offset of the instruction (after any EXTENDED_ARG prefix)
    op: int
    name: str
    arg: int | None
    kind: str  # "name", "const", "local", "local_pair", "free", "compare", "binop", "jump", "other", "none"
    argval: Any  # resolved name / const display / local name / operator / jump target offset


def decode(
    code: bytes, names: tuple[str, ...], localsplus: tuple[str, ...], consts: list[str], ops: OpcodeTable
) -> list[Instruction]:
    """Instructions of de-specialised `code`; `consts` are display strings for co_consts."""
    out: list[Instruction] = []
    n = len(code) - 1
    i = 0
    ext = 0
    caches = ops.cache_entries
    have_arg = ops.have_argument
    after_caches = ops.jump_base == "after_caches"
    while i < n and len(out) < MAX_INSTRUCTIONS:
        op, raw = code[i], code[i + 1]
        if op == ops.extended_arg:
            ext = ((ext | raw) << 8) & 0xFFFFFFFF  # opargs are 32-bit; hostile prefix runs stay bounded
            i += 2
            continue
        arg = (ext | raw) if op >= have_arg else None
        ext = 0
        name = ops.name(op)
        ncache = caches.get(op, 0)
        kind, val = "none", None
        if arg is not None:
            kind, val = _resolve(op, name, arg, i, ncache, names, localsplus, consts, ops, after_caches)
        out.append(Instruction(i, op, name, arg, kind, val))
        i += 2 + 2 * ncache
    return out


_PAIR_PARTS = ("LOAD_FAST_BORROW", "LOAD_FAST", "STORE_FAST")


def pair_parts(name: str) -> tuple[str, str] | None:
    """The two instructions a 3.13+ superinstruction (LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST,
    LOAD_FAST_BORROW_LOAD_FAST_BORROW, ...) stands for; None for other opcodes. Its argument
    packs two local indices, four bits each."""
    for first in _PAIR_PARTS:
        if name.startswith(first + "_"):
            rest = name[len(first) + 1 :]
            if rest in _PAIR_PARTS:
                return first, rest
    return None


def _resolve(op, name, arg, offset, ncache, names, localsplus, consts, ops: OpcodeTable, after_caches: bool):
    pair = pair_parts(name) if op in ops.haslocal else None
    if pair is not None:
        a, b = arg >> 4, arg & 15
        n = len(localsplus)
        return "local_pair", (localsplus[a] if a < n else f"<local {a}>", localsplus[b] if b < n else f"<local {b}>")
    if op in ops.hasname:
        idx = arg >> ops.name_arg_shift.get(name, 0)
        return "name", names[idx] if idx < len(names) else f"<name {idx}>"
    if op in ops.hasconst:
        return "const", consts[arg] if arg < len(consts) else f"<const {arg}>"
    if op in ops.haslocal:
        return "local", localsplus[arg] if arg < len(localsplus) else f"<local {arg}>"
    if op in ops.hasfree:
        return "free", localsplus[arg] if arg < len(localsplus) else f"<free {arg}>"
    if op in ops.hascompare:
        idx = arg >> ops.compare_arg_shift
        return "compare", ops.cmp_op[idx] if idx < len(ops.cmp_op) else f"<cmp {arg}>"
    if name == "BINARY_OP":
        return "binop", ops.binary_ops[arg] if arg < len(ops.binary_ops) else f"<op {arg}>"
    if op in ops.hasjrel:
        base = offset + 2 + (2 * ncache if after_caches else 0)
        return "jump", base - 2 * arg if op in ops.backward_jumps else base + 2 * arg
    if op in ops.hasjabs:
        return "jump", 2 * arg
    return "other", arg
