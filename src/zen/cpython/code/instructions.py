"""Decode bytecode of any supported CPython version into instructions with resolved arguments.

Driven by the opcode data in the target's layout profile (names, cache sizes, how name and compare
arguments are packed, the base of relative jumps), never by the running interpreter's `dis`, so
code from a 3.13 image decodes correctly under zen's 3.11. Input is de-specialised bytecode
(`CodeInfo.code`): inline caches are skipped by size, EXTENDED_ARG prefixes are folded.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, NamedTuple

from zen import native
from zen.cpython.layout.profile import OpcodeTable

MAX_INSTRUCTIONS = 1 << 20


class Instruction(NamedTuple):
    """One decoded instruction. A named tuple, not a dataclass: hundreds of thousands are made
    per recovery, and a tuple is built several times faster than a frozen dataclass."""

    offset: int  # byte offset of the instruction (after any EXTENDED_ARG prefix)
    op: int
    name: str
    arg: int | None
    kind: str  # "name", "const", "local", "local_pair", "free", "compare", "binop", "jump", "other", "none"
    argval: Any  # resolved name / const display / local name / operator / jump target offset


# how an opcode's argument resolves (the order of `resolution order below)
_PAIR, _NAME, _CONST, _LOCAL, _FREE, _COMPARE, _BINOP, _JREL, _JABS, _OTHER = range(10)
_tables: dict[int, tuple[OpcodeTable, list]] = {}
_packed_tables: dict[int, tuple[OpcodeTable, tuple]] = {}


def _table(ops: OpcodeTable) -> list[tuple[str, int, int, int, bool]]:
    """Per opcode 0..255: (name, inline cache entries, resolution, name-argument shift, backward)."""
    hit = _tables.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    rows = []
    for op in range(256):
        name = ops.name(op)
        if op in ops.haslocal and pair_parts(name) is not None:
            how = _PAIR
        elif op in ops.hasname:
            how = _NAME
        elif op in ops.hasconst:
            how = _CONST
        elif op in ops.haslocal:
            how = _LOCAL
        elif op in ops.hasfree:
            how = _FREE
        elif op in ops.hascompare:
            how = _COMPARE
        elif name == "BINARY_OP":
            how = _BINOP
        elif op in ops.hasjrel:
            how = _JREL
        elif op in ops.hasjabs:
            how = _JABS
        else:
            how = _OTHER
        # interned: the listing's tables (literals, interned) then find a name by identity, not by comparing text
        name = sys.intern(name) if type(name) is str else name
        rows.append((name, ops.cache_entries.get(op, 0), how, ops.name_arg_shift.get(name, 0), op in ops.backward_jumps))
    _tables[id(ops)] = (ops, rows)
    return rows


def _packed(ops: OpcodeTable) -> tuple[tuple[str, ...], bytes]:
    """`_table(ops)` as the compiled decoder reads it: the names, and the four numbers of each row as int32 (a
    number that does not fit is left to the reference: the decoder answers None for a row out of its range)."""
    hit = _packed_tables.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    rows = _table(ops)
    fit = [(c, h, s, int(b)) if all(-(1 << 31) <= v < 1 << 31 for v in (c, s)) else (-1, h, 0, 0) for _, c, h, s, b in rows]
    packed = (tuple(r[0] for r in rows), struct.pack("<1024i", *(v for r in fit for v in r)))
    _packed_tables[id(ops)] = (ops, packed)
    return packed


def decode(
    code: bytes, names: tuple[str, ...], localsplus: tuple[str, ...], consts: list[str], ops: OpcodeTable, free_base: int = 0
) -> list[Instruction]:
    """Instructions of de-specialised `code`; `consts` are display strings for co_consts.
    `free_base` is `CodeInfo.free_base`: before 3.11 cell/free arguments count from the first
    cell variable, which `localsplus` lists after the plain locals.

    Table-driven (one lookup per opcode): a transformers model's code is some 200,000
    instructions, decoded once per recovery (`Runtime.instructions`; the listing adds the
    constants' displays with `with_consts`). The same loop compiled (`zen.native`) runs when built; this one is
    its reference, and decodes whatever it leaves (it answers None)."""
    if native.core is not None and type(code) is bytes:
        params = (ops.have_argument, ops.extended_arg, ops.jump_base == "after_caches", ops.jump_unit, free_base,
                  ops.compare_arg_shift, ops.cmp_op, ops.binary_ops, MAX_INSTRUCTIONS)  # fmt: skip
        got = native.core.decode(code, names, localsplus, consts, _packed(ops), params, Instruction)
        if got is not None:
            return got
    return decode_pure(code, names, localsplus, consts, ops, free_base)


def decode_pure(
    code: bytes, names: tuple[str, ...], localsplus: tuple[str, ...], consts: list[str], ops: OpcodeTable, free_base: int = 0
) -> list[Instruction]:
    """`decode` in Python: the reference the compiled loop is tested against, and its fallback."""
    out: list[Instruction] = []
    append = out.append
    new = tuple.__new__  # an Instruction without a call of its Python-level __new__ (hundreds of thousands)
    I = Instruction  # noqa: E741
    table = _table(ops)
    n = len(code) - 1
    i = 0
    ext = 0
    have_arg = ops.have_argument
    extended = ops.extended_arg
    after_caches = ops.jump_base == "after_caches"
    unit = ops.jump_unit
    nnames, nlocals, nconsts = len(names), len(localsplus), len(consts)
    while i < n and len(out) < MAX_INSTRUCTIONS:
        op = code[i]
        if op == extended:
            ext = ((ext | code[i + 1]) << 8) & 0xFFFFFFFF  # opargs are 32-bit; hostile prefix runs stay bounded
            i += 2
            continue
        name, ncache, how, shift, backward = table[op]
        if op < have_arg:
            ext = 0
            append(new(I, (i, op, name, None, "none", None)))
            i += 2 + 2 * ncache
            continue
        arg = ext | code[i + 1]
        ext = 0
        if how == _NAME:
            idx = arg >> shift
            ins = new(I, (i, op, name, arg, "name", names[idx] if idx < nnames else f"<name {idx}>"))
        elif how == _LOCAL:
            ins = new(I, (i, op, name, arg, "local", localsplus[arg] if arg < nlocals else f"<local {arg}>"))
        elif how == _CONST:
            ins = new(I, (i, op, name, arg, "const", consts[arg] if arg < nconsts else f"<const {arg}>"))
        elif how == _JREL:
            base = i + 2 + (2 * ncache if after_caches else 0)
            ins = new(I, (i, op, name, arg, "jump", base - unit * arg if backward else base + unit * arg))
        elif how == _OTHER:
            ins = new(I, (i, op, name, arg, "other", arg))
        elif how == _PAIR:
            a, b = arg >> 4, arg & 15
            pair = (localsplus[a] if a < nlocals else f"<local {a}>", localsplus[b] if b < nlocals else f"<local {b}>")
            ins = new(I, (i, op, name, arg, "local_pair", pair))
        elif how == _FREE:
            j = arg + free_base
            ins = new(I, (i, op, name, arg, "free", localsplus[j] if j < nlocals else f"<free {arg}>"))
        elif how == _COMPARE:
            idx = arg >> ops.compare_arg_shift
            ins = new(I, (i, op, name, arg, "compare", ops.cmp_op[idx] if idx < len(ops.cmp_op) else f"<cmp {arg}>"))
        elif how == _BINOP:
            ins = new(I, (i, op, name, arg, "binop", ops.binary_ops[arg] if arg < len(ops.binary_ops) else f"<op {arg}>"))
        else:  # _JABS
            ins = new(I, (i, op, name, arg, "jump", unit * arg))
        append(ins)
        i += 2 + 2 * ncache
    return out


def with_consts(instructions: list[Instruction], consts: list[str]) -> list[Instruction]:
    """`instructions` decoded without constants (`consts=[]`) as `decode` would have given them
    with `consts`: only a constant's display differs, so one decoding serves every caller."""
    n = len(consts)
    return [
        Instruction(i.offset, i.op, i.name, i.arg, "const", consts[i.arg] if i.arg < n else f"<const {i.arg}>")
        if i.kind == "const" else i
        for i in instructions
    ]  # fmt: skip


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
        return "jump", base - ops.jump_unit * arg if op in ops.backward_jumps else base + ops.jump_unit * arg
    if op in ops.hasjabs:
        return "jump", ops.jump_unit * arg
    return "other", arg
