"""CPython 3.8-3.10 instructions rewritten into their 3.11 shape, before a listing is normalised.

3.11 renamed or merged many instructions without the source changing: the 26 BINARY_*/INPLACE_*
opcodes became one BINARY_OP with an operator argument, CALL_FUNCTION/CALL_METHOD/
CALL_FUNCTION_KW became CALL (with PRECALL, which listings drop), DUP_TOP/ROT_TWO became
COPY/SWAP, a generator's GEN_START became RETURN_GENERATOR + POP_TOP, and exception handling moved
from SETUP_FINALLY/POP_BLOCK blocks into an exception table (no instructions, no jump labels).
3.10 and earlier also load a nested function's qualified name before MAKE_FUNCTION, which 3.11
takes from the code object, and compare with None by IS_OP where 3.11 jumps on None directly;
3.8 compares identity, membership and exception matches with COMPARE_OP (3.9: IS_OP, CONTAINS_OP,
JUMP_IF_NOT_EXC_MATCH) and 3.9 builds annotations as a dict. The opcode *names* decide (they
belong to the profile's opcode table, and none of them exists from 3.11 on), and the caller applies
this only to code of a profile without 3.11's code layout, so 3.11+ listings pass through unchanged.
Tuple assignments lose their ROT_TWO/ROT_THREE and store in reverse order, as 3.11 swaps them
statically. What stays different: 3.8's BEGIN_FINALLY/END_FINALLY/WITH_CLEANUP_* blocks, the cleanup blocks
3.11 adds at the end of handlers, and return paths the compilers lay out differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zen.cpython.code.instructions import Instruction
from zen.runtime.errors import ZenError

if TYPE_CHECKING:
    from zen.cpython.interp import Interpreter
    from zen.cpython.readers.code import CodeInfo

_OPS = {
    "ADD": "+",
    "AND": "&",
    "FLOOR_DIVIDE": "//",
    "LSHIFT": "<<",
    "MATRIX_MULTIPLY": "@",
    "MULTIPLY": "*",
    "MODULO": "%",
    "OR": "|",
    "POWER": "**",
    "RSHIFT": ">>",
    "SUBTRACT": "-",
    "TRUE_DIVIDE": "/",
    "XOR": "^",
}
BINARY = {f"BINARY_{k}": v for k, v in _OPS.items()} | {f"INPLACE_{k}": v + "=" for k, v in _OPS.items()}
_CALLS = frozenset(("CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW"))
_DROPPED = frozenset(("SETUP_FINALLY", "POP_BLOCK"))
_RENAMED = {"SETUP_WITH": "BEFORE_WITH", "SETUP_ASYNC_WITH": "BEFORE_ASYNC_WITH", "DUP_TOP": "COPY", "ROT_TWO": "SWAP"}


def as_311(instructions: list[Instruction]) -> list[Instruction]:
    """`instructions` of 3.10 bytecode in the shape 3.11 compiles the same source to."""
    handlers = {i.argval for i in instructions if i.name in _HANDLER_SETUPS and i.kind == "jump"}
    out: list[Instruction] = []
    n, k = len(instructions), 0
    while k < n:
        ins = instructions[k]
        name, off = ins.name, ins.offset
        k += 1
        if off in handlers:  # 3.11 enters every handler with PUSH_EXC_INFO (3.10 duplicates the type)
            out.append(Instruction(off, -1, "PUSH_EXC_INFO", None, "none", None))
            if name == "DUP_TOP":
                continue
            if _is_exc_triple(instructions, k - 1):  # bare `except:` pops type, value, traceback
                out.append(Instruction(-off - 1, -1, "POP_TOP", None, "none", None))
                k += 2
                continue
        rots = _static_swap(instructions, k - 1)
        if rots:  # `a, b = x, y`: 3.11 drops the swap and stores in the other order
            out += reversed(instructions[k - 1 + rots : k - 1 + rots + rots + 1])
            k += rots + rots
            continue
        if name in BINARY:
            out.append(Instruction(off, -1, "BINARY_OP", ins.arg, "binop", BINARY[name]))
        elif name in _CALLS:
            # a decorator or a comprehension applied to the function just made: 3.11 calls it with
            # the function in the `self` slot (CALL 0)
            prev = instructions[k - 2].name if k >= 2 else ""
            argc = 0 if ins.arg == 1 and name == "CALL_FUNCTION" and prev in ("MAKE_FUNCTION", "GET_ITER") else ins.arg
            if ins.arg == 3 and name == "CALL_FUNCTION" and _with_exit(out):  # __exit__(None, None, None)
                none = out[-3]
                out[-2:] = [Instruction(o.offset, none.op, none.name, none.arg, none.kind, none.argval) for o in out[-2:]]
                argc = 2  # 3.11 calls the bound __exit__ as a method
            out.append(Instruction(off, -1, "CALL", argc, "other", argc))
        elif name in _DROPPED:
            continue
        elif name in _RENAMED:
            out.append(Instruction(off, -1, _RENAMED[name], None, "none", None))
        elif name == "DUP_TOP_TWO":
            out += [Instruction(off, -1, "COPY", None, "none", None), Instruction(-off - 1, -1, "COPY", None, "none", None)]
        elif name == "GEN_START":
            out += [
                Instruction(off, -1, "RETURN_GENERATOR", None, "none", None),
                Instruction(-off - 1, -1, "POP_TOP", None, "none", None),
            ]
        elif name == "COMPARE_OP" and ins.argval in _COMPARE_AS:  # 3.8: identity and membership tests
            op, flag = _COMPARE_AS[ins.argval]
            out.append(Instruction(off, -1, op, flag, "other", flag))
        elif name == "JUMP_IF_NOT_EXC_MATCH" or (
            name == "COMPARE_OP" and ins.argval == "exception match" and k < n and instructions[k].name == "POP_JUMP_IF_FALSE"
        ):
            if name == "COMPARE_OP":  # 3.8: the match result, then the jump
                ins = instructions[k]
                k += 1
            out += [
                Instruction(off, -1, "CHECK_EXC_MATCH", None, "none", None),
                Instruction(-off - 1, -1, "POP_JUMP_IF_FALSE", ins.arg, "jump", ins.argval),
            ]
            if k + 2 < n and _is_exc_triple(instructions, k, middle_any=True):  # `as e`: only the value is kept
                middle = instructions[k + 1]
                out.append(Instruction(instructions[k].offset, middle.op, middle.name, middle.arg, middle.kind, middle.argval))
                k += 3
        elif name in ("POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE") and _none_test(out):
            is_not = out[-1].arg == 1
            out[-2:] = [Instruction(out[-2].offset, -1, _NONE_JUMPS[(name, is_not)], ins.arg, "jump", ins.argval)]
        elif name == "BUILD_CONST_KEY_MAP" and ins.arg and _annotations_map(instructions, k, ins.arg, out):
            continue  # 3.9: a function's annotations; 3.10+ load them as one flat tuple
        elif name == "MAKE_FUNCTION" and len(out) >= 2 and _qualname_load(out[-2], out[-1]):
            qual = out.pop()
            code = out.pop()
            # a class body's function gets the bare class name: its code's own qualname stays
            display = code.argval if out and out[-1].name == "LOAD_BUILD_CLASS" else f"<code {qual.argval[1:-1]}>"
            out += [Instruction(code.offset, code.op, code.name, code.arg, code.kind, display), ins]
        else:
            out.append(ins)
    return out


_COMPARE_AS = {"in": ("CONTAINS_OP", 0), "not in": ("CONTAINS_OP", 1), "is": ("IS_OP", 0), "is not": ("IS_OP", 1)}
_HANDLER_SETUPS = frozenset(("SETUP_FINALLY", "SETUP_WITH", "SETUP_ASYNC_WITH"))
_NONE_JUMPS = {
    ("POP_JUMP_IF_FALSE", False): "POP_JUMP_IF_NOT_NONE",  # `x is None` false: x is not None
    ("POP_JUMP_IF_TRUE", False): "POP_JUMP_IF_NONE",
    ("POP_JUMP_IF_FALSE", True): "POP_JUMP_IF_NONE",  # `x is not None` false: x is None
    ("POP_JUMP_IF_TRUE", True): "POP_JUMP_IF_NOT_NONE",
}


def _static_swap(instructions: list[Instruction], k: int) -> int:
    """Number of rotation instructions at `k` (ROT_TWO: 1; ROT_THREE, ROT_TWO: 2) when they only
    reorder the values of the 2 or 3 stores that follow: STORE_FAST of distinct names or POP_TOP,
    the instructions 3.11's compiler swaps statically (it emits the stores in reverse order and
    no swap). 0 when the pattern is not there."""
    names = [i.name for i in instructions[k : k + 5]]
    if names[:1] == ["ROT_TWO"]:
        rots = 1
    elif names[:2] == ["ROT_THREE", "ROT_TWO"]:
        rots = 2
    else:
        return 0
    stores = instructions[k + rots : k + rots + rots + 1]
    if len(stores) != rots + 1 or any(s.name not in ("STORE_FAST", "POP_TOP") or s.offset < 0 for s in stores):
        return 0
    targets = [s.argval for s in stores if s.name == "STORE_FAST"]
    return rots if len(set(targets)) == len(targets) else 0


def _annotations_map(instructions: list[Instruction], k: int, n: int, out: list[Instruction]) -> bool:
    """3.9 builds a function's annotations as a dict (n constant values, the key tuple,
    BUILD_CONST_KEY_MAP n) before LOAD_CONST code, LOAD_CONST qualname, MAKE_FUNCTION with the
    annotations flag (4); 3.10 loads one constant tuple (key, value, key, value...). Rewritten
    in `out` when the pattern is complete, with the displays of the key tuple parsed back."""
    import ast

    loads = out[-n - 1 :]
    after = instructions[k : k + 3]
    if len(loads) != n + 1 or any(x.name != "LOAD_CONST" or x.offset < 0 for x in loads) or len(after) != 3:
        return False
    if after[2].name != "MAKE_FUNCTION" or not (after[2].arg or 0) & 4:
        return False
    try:
        keys = ast.literal_eval(loads[-1].argval)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    if not isinstance(keys, tuple) or len(keys) != n or not all(isinstance(x, str) for x in keys):
        return False
    flat = ", ".join(f"{key!r}, {v.argval}" for key, v in zip(keys, loads[:-1]))
    first = loads[0]
    out[-n - 1 :] = [Instruction(first.offset, first.op, "LOAD_CONST", first.arg, "const", f"({flat})")]
    return True


def _with_exit(out: list[Instruction]) -> bool:
    """LOAD_CONST None, DUP_TOP, DUP_TOP (already COPY, COPY): 3.10's arguments to __exit__."""
    return len(out) >= 3 and out[-3].name == "LOAD_CONST" and out[-3].argval == "None" and out[-2].name == out[-1].name == "COPY"


def _none_test(out: list[Instruction]) -> bool:
    """The last two instructions compare with None (`LOAD_CONST None`, `IS_OP`): 3.11 jumps on
    None directly."""
    return len(out) >= 2 and out[-1].name == "IS_OP" and out[-2].name == "LOAD_CONST" and out[-2].argval == "None"


def _is_exc_triple(instructions: list[Instruction], k: int, middle_any: bool = False) -> bool:
    """POP_TOP, (POP_TOP | STORE_*), POP_TOP at `k`: 3.10 unpacking (type, value, traceback)."""
    if k + 2 >= len(instructions):
        return False
    a, b, c = instructions[k : k + 3]
    ok_middle = b.name == "POP_TOP" or (middle_any and b.name.startswith("STORE_"))
    return a.name == "POP_TOP" and ok_middle and c.name == "POP_TOP" and not any(x.offset < 0 for x in (a, b, c))


def prologue(
    cellvars: tuple[str, ...], varnames: tuple[str, ...], freevars: tuple[str, ...], generator: bool, first: str
) -> list[Instruction]:
    """What 3.11 puts before a function's first instruction and 3.10 does not: MAKE_CELL for each
    cell (argument cells first, in argument order) and COPY_FREE_VARS for a closure; for a
    generator or coroutine of 3.9 (no GEN_START, the first instruction `first` of 3.10's),
    RETURN_GENERATOR + POP_TOP."""
    cells = [c for c in varnames if c in cellvars] + [c for c in cellvars if c not in varnames]
    out = [Instruction(-100 - n, -1, "MAKE_CELL", None, "free", c) for n, c in enumerate(cells)]
    if freevars:
        out.append(Instruction(-99, -1, "COPY_FREE_VARS", len(freevars), "other", len(freevars)))
    if generator and first != "GEN_START":
        out += [Instruction(-98, -1, "RETURN_GENERATOR", None, "none", None), Instruction(-97, -1, "POP_TOP", None, "none", None)]
    return out


def _qualname_load(code: Instruction, qual: Instruction) -> bool:
    """LOAD_CONST <code ...>, LOAD_CONST '<qualified name>': 3.10's prologue of MAKE_FUNCTION."""
    return (
        code.name == "LOAD_CONST"
        and isinstance(code.argval, str)
        and code.argval.startswith("<code ")
        and qual.name == "LOAD_CONST"
        and isinstance(qual.argval, str)
        and len(qual.argval) >= 2
        and qual.argval[0] == qual.argval[-1]
        and qual.argval[0] in "'\""
    )


def qualnames_in(ip: Interpreter, ci: CodeInfo) -> dict[int, str]:
    """Qualified names 3.10 bytecode states: code constant -> the string loaded right after it
    for MAKE_FUNCTION, and this code -> the `__qualname__` its class body stores (a class body's
    MAKE_FUNCTION gets the bare class name, which is skipped)."""
    ops = ip.P.opcodes.opmap
    load, make, build = ops.get("LOAD_CONST"), ops.get("MAKE_FUNCTION"), ops.get("LOAD_BUILD_CLASS")
    store = ops.get("STORE_NAME")
    code, out = ci.code, {}
    consts, n = ci.consts, len(ci.consts)

    def const(i: int, kind: str) -> int | None:
        try:
            return consts[i] if i < n and ip.kind(consts[i]) == kind else None
        except ZenError:
            return None

    for i in range(0, len(code) - 5, 2):
        if code[i] == load and code[i + 2] == load and code[i + 4] == make and not (i and code[i - 2] == build):
            c, q = const(code[i + 1], "code"), const(code[i + 3], "str")
            if c is not None and q is not None:
                out[c] = ip.str(q)
    # class body: LOAD_NAME __name__, STORE_NAME __module__, LOAD_CONST qualname, STORE_NAME __qualname__
    names = ci.names
    if len(code) >= 8 and code[4] == load and code[6] == store and code[7] < len(names) and names[code[7]] == "__qualname__":
        q = const(code[5], "str")
        if q is not None:
            out[ci.addr] = ip.str(q)
    return out
