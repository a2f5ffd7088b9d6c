"""Version-normalised instruction listings: the bytecode a fingerprint compares.

A listing is one line per instruction: the opcode under a version-neutral name, then its resolved
operand (a name, a constant, a local, an operator, or a jump label). It leaves out what varies
without the source changing — line numbers, inline caches, the RESUME/PRECALL/NOP/KW_NAMES
plumbing, forward-vs-backward jump variants, LOAD_METHOD vs LOAD_ATTR, 3.12's RETURN_CONST — so
the same source compiled by different CPython minor versions gives (as far as possible) the same
listing, and a file moved to another line or path gives exactly the same one.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from zen import native
from zen.cpython.code.instructions import Instruction, pair_parts, with_consts

# Bumped whenever normalisation changes what a listing says: fingerprints made by another
# listing version do not match exactly (attribution says so). 2: normalised across 3.11-3.14.
LISTING_VERSION = 2

DROP = frozenset({"CACHE", "RESUME", "PRECALL", "NOP", "EXTENDED_ARG", "PUSH_NULL", "RESUME_CHECK", "NOT_TAKEN", "TO_BOOL"})
RENAME = {
    "LOAD_METHOD": "LOAD_ATTR",
    "JUMP_FORWARD": "JUMP",
    "JUMP_BACKWARD": "JUMP",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "JUMP_ABSOLUTE": "JUMP",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "LOAD_FAST_CHECK": "LOAD_FAST",
    "LOAD_FAST_AND_CLEAR": "LOAD_FAST",
    "LOAD_FAST_BORROW": "LOAD_FAST",  # 3.14
    "LOAD_CLOSURE": "LOAD_FAST",  # 3.13 loads the cell with LOAD_FAST
    "POP_ITER": "POP_TOP",  # 3.14
    "KW_NAMES": "LOAD_CONST",  # 3.11/3.12 name the keywords of the next CALL; 3.13 loads them
    "CALL_KW": "CALL",  # 3.13: the CALL that takes those names
}
_WITH_ARG = frozenset(
    (
        "CALL",
        "BUILD_TUPLE",
        "BUILD_LIST",
        "BUILD_MAP",
        "BUILD_SET",
        "UNPACK_SEQUENCE",  # not CALL_FUNCTION_EX: 3.14 dropped its kwargs flag (a NULL on the stack instead)
        "BUILD_SLICE",
        "FORMAT_VALUE",
    )  # fmt: skip
)


_CLASS_BOOKKEEPING = frozenset(("__firstlineno__", "__static_attributes__"))
_OR_POP = {"JUMP_IF_FALSE_OR_POP": "POP_JUMP_IF_FALSE", "JUMP_IF_TRUE_OR_POP": "POP_JUMP_IF_TRUE"}
_UNCONDITIONAL = frozenset(("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"))


MAX_COPY = 4  # CPython 3.12+ copies exit blocks of at most this many instructions
_RETURNS = frozenset(("RETURN_VALUE", "RETURN_CONST"))


def _thread_jumps_to_return(instructions: list[Instruction]) -> list[Instruction]:
    """Replace an unconditional jump to a short block that returns by a copy of that block, as
    3.12+ compilers do (3.11 jumps to one shared tail, e.g. the `return` after an if/else)."""
    if not any(ins.name in _UNCONDITIONAL for ins in instructions):
        return instructions
    at = {ins.offset: n for n, ins in enumerate(instructions)}
    out: list[Instruction] = []
    copies = 0
    for ins in instructions:
        n = at.get(ins.argval) if ins.name in _UNCONDITIONAL and ins.kind == "jump" else None
        block = _exit_block(instructions, n) if n is not None else None
        if block is None:
            out.append(ins)
            continue
        for k, b in enumerate(block):
            copies += 1
            off = ins.offset if k == 0 else -copies  # copies are never jump targets
            out.append(Instruction(off, b.op, b.name, b.arg, b.kind, b.argval))
    return out


def _exit_block(instructions: list[Instruction], n: int) -> list[Instruction] | None:
    """The instructions from `n` up to and including a return, if there are few and none jumps."""
    block = []
    for ins in instructions[n : n + MAX_COPY]:
        if ins.kind == "jump" or ins.name in DROP:
            return None
        block.append(ins)
        if ins.name in _RETURNS:
            return block
    return None


def normalise(instructions: list[Instruction], consts: list[str] | None = None) -> list[str]:
    """The listing lines for decoded instructions; `consts`: the constants' displays, where the
    instructions were decoded without them (`with_consts`: one decoding serves every caller).

    Compiled (`zen.native`, listing.c) where the core is loaded: the same loop, which hands the
    instructions listed in `normalise_pure`'s docstring to the same Python (`_special`,
    `_Inlined.skip`); ~0.2 s of a GPT-2 recovery's critical path. `normalise_pure` is the
    reference and the fallback."""
    if native.core is not None:
        steps = _Steps()
        lines = native.core.listing(instructions, consts, _compiled_tables(), steps)
        if lines is not None:
            return lines if steps.comp is None else steps.comp.drop_handlers(lines)
    return normalise_pure(instructions if consts is None else with_consts(instructions, consts))


def normalise_pure(instructions: list[Instruction]) -> list[str]:
    """The listing lines for decoded instructions (the reference of `normalise`).

    Besides dropping and renaming, it undoes what minor versions changed without the source
    changing: 3.13's two-local superinstructions become their two instructions, 3.14's
    LOAD_SMALL_INT a LOAD_CONST, 3.12's loop-exit END_FOR (and 3.13's POP_TOP after it)
    disappears, 3.13's MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE fold back into one MAKE_FUNCTION
    with flags, CONVERT_VALUE + FORMAT_SIMPLE/FORMAT_WITH_SPEC into FORMAT_VALUE, 3.12's
    LOAD_SUPER_ATTR into the call of super() and a LOAD_ATTR, 3.14's BINARY_OP [] into
    BINARY_SUBSCR, 3.13's `__firstlineno__`/`__static_attributes__` in class bodies are left
    out, 3.11's JUMP_IF_*_OR_POP become 3.12's COPY/POP_JUMP_IF_*/POP_TOP, and a jump to a return
    becomes the return (3.12+ duplicates returns), and what 3.12+ adds around an inlined
    comprehension is left out (see `_Inlined`). What stays different: opcodes that have no
    counterpart."""
    instructions = _thread_jumps_to_return(instructions)
    targets = sorted({i.argval for i in instructions if i.kind == "jump" and isinstance(i.argval, int)})
    labels = {off: f"L{n}" for n, off in enumerate(targets, 1)}
    lines: list[str] = []
    state = _State()
    comp = _Inlined()
    append = lines.append
    for ins in instructions:
        offset, _, name, arg, kind, argval = ins
        if offset in labels:
            append(f"{labels[offset]}:")
        if name in DROP:
            continue
        # `comp.skip` changes or decides something only for these (checked first: it is called
        # for every instruction of every listing)
        if (comp.prologue or comp.restore or name in _Inlined.WATCH) and comp.skip(name):
            continue
        if state.after_end_for:
            state.after_end_for = False
            if name in ("POP_TOP", "POP_ITER"):
                continue
        if (name in _SPECIAL or kind == "local_pair") and _special(ins, lines, labels, state):
            continue
        # the common case: a renamed opcode and its operand
        name = RENAME.get(name, name)
        if kind == "jump":
            append(f"{name} {labels.get(argval, '?')}")
        elif kind in _OPERAND_KINDS:
            append(f"{name} {argval}")
        elif kind == "other" and name in _WITH_ARG:
            append(f"{name} {arg}")
        else:
            append(name)
    return comp.drop_handlers(lines)


class _Steps:
    """`normalise_pure`'s loop body from the comprehension's bookkeeping to `_special`, for the
    compiled loop, which calls it with the instructions it does not decide itself. Its state is
    made on the first call: most code objects have no instruction that needs it."""

    __slots__ = ("comp", "state")

    def __init__(self) -> None:
        self.state: _State | None = None
        self.comp: _Inlined | None = None

    def __call__(self, ins: Instruction, argval, lines: list[str], labels: dict[int, str]) -> int:
        """Bit 0 set where the instruction is handled (no common-case line), bit 1 where the state
        it leaves must see the next instruction, whatever its name."""
        if self.comp is None or self.state is None:
            self.state, self.comp = _State(), _Inlined()
        return _step(self.state, self.comp, ins, argval, lines, labels)


def _step(state: _State, comp: _Inlined, ins: Instruction, argval, lines: list[str], labels: dict[int, str]) -> int:
    name = ins.name
    handled = 0
    if (comp.prologue or comp.restore or name in _Inlined.WATCH) and comp.skip(name):
        handled = 1
    else:
        after_end_for, state.after_end_for = state.after_end_for, False
        if after_end_for and name in ("POP_TOP", "POP_ITER"):
            handled = 1
        elif name in _SPECIAL or ins.kind == "local_pair":
            if argval is not ins.argval:  # a constant's display (`with_consts`)
                ins = ins._replace(argval=argval)
            handled = 1 if _special(ins, lines, labels, state) else 0
    return handled | (2 if comp.prologue or comp.restore or state.after_end_for else 0)


_TABLES: tuple | None = None


def _compiled_tables() -> tuple:
    """What listing.c reads: the tables above, and which names it hands to `_step` (BINARY_OP and
    STORE_NAME only with the argvals `_special` treats)."""
    global _TABLES
    if _TABLES is None:
        hooked: dict[str, frozenset | None] = dict.fromkeys(_SPECIAL | _Inlined.WATCH)
        hooked["BINARY_OP"] = frozenset(("[]",))
        hooked["STORE_NAME"] = _CLASS_BOOKKEEPING
        _TABLES = (DROP, RENAME, _WITH_ARG, _OPERAND_KINDS, hooked, _UNCONDITIONAL, _RETURNS, MAX_COPY)
    return _TABLES


class _State:
    """What `normalise` carries from one instruction to a later one."""

    __slots__ = ("after_end_for", "conversion", "make_function")

    def __init__(self) -> None:
        self.make_function = -1  # index of the last MAKE_FUNCTION line (3.13 sets its attributes after it)
        self.conversion = 0  # 3.13: CONVERT_VALUE's conversion, for the FORMAT_* that follows
        self.after_end_for = False  # 3.12: the END_FOR just dropped (3.13 follows it with a POP_TOP)


def _special(ins: Instruction, lines: list[str], labels: dict[int, str], state: _State) -> bool:
    """Append the lines of an instruction that minor versions changed (see `normalise`); False
    where it is an ordinary one after all (its lines are then the common case's)."""
    name = ins.name
    if name == "END_FOR":
        state.after_end_for = True
    elif name == "RETURN_CONST":  # 3.12: LOAD_CONST + RETURN_VALUE in one instruction
        lines += [f"LOAD_CONST {ins.argval}", "RETURN_VALUE"]
    elif ins.kind == "local_pair":
        for part, local in zip(pair_parts(name) or (name, name), ins.argval):
            lines.append(f"{RENAME.get(part, part)} {local}")
    elif name == "LOAD_SMALL_INT":
        lines.append(f"LOAD_CONST {ins.arg}")
    elif name == "MAKE_FUNCTION":
        state.make_function = len(lines)
        lines.append(f"MAKE_FUNCTION {ins.arg or 0}")
    elif name == "SET_FUNCTION_ATTRIBUTE" and state.make_function >= 0:
        flags = int(lines[state.make_function].split()[1]) | (ins.arg or 0)
        lines[state.make_function] = f"MAKE_FUNCTION {flags}"
    elif name == "CONVERT_VALUE":
        state.conversion = ins.arg or 0
    elif name in ("FORMAT_SIMPLE", "FORMAT_WITH_SPEC"):
        lines.append(f"FORMAT_VALUE {state.conversion | (4 if name == 'FORMAT_WITH_SPEC' else 0)}")
        state.conversion = 0
    elif name == "LOAD_SUPER_ATTR":
        two_args = bool((ins.arg or 0) & 2)
        if not two_args and len(lines) >= 2:  # zero-argument super(): __class__ and self are implicit
            del lines[-2:]
        lines += [f"CALL {2 if two_args else 0}", f"LOAD_ATTR {ins.argval}"]
    elif name == "BINARY_OP" and ins.argval == "[]":
        lines.append("BINARY_SUBSCR")
    elif name in _OR_POP:  # 3.11; 3.12 compiles COPY, POP_JUMP_IF_*, POP_TOP
        lines += ["COPY", f"{_OR_POP[name]} {labels.get(ins.argval, '?')}", "POP_TOP"]
    elif name == "STORE_NAME" and ins.argval in _CLASS_BOOKKEEPING:
        if lines and lines[-1].startswith("LOAD_CONST "):  # 3.13 records these in every class body
            lines.pop()
    else:
        return False
    return True


_OPERAND_KINDS = frozenset(("name", "const", "local", "free", "compare", "binop"))


# opcode names `normalise` treats specially (instructions of a local pair are special by kind)
_SPECIAL = frozenset(("END_FOR", "RETURN_CONST", "LOAD_SMALL_INT", "MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE",
                      "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "LOAD_SUPER_ATTR", "BINARY_OP",
                      "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP", "STORE_NAME"))  # fmt: skip


class _Inlined:
    """What 3.12+ adds around an inlined comprehension (PEP 709), so that it can be left out:
    the comprehension's variables saved (LOAD_FAST_AND_CLEAR) and stack shuffles (SWAP) before
    its loop, the SWAP + STORE_FASTs that restore them after it, and the cleanup handler
    (SWAP, POP_TOP, SWAP, STORE_FAST..., RERAISE). What remains is the comprehension's own
    body, as 3.11 compiled it into a nested code object (which comparisons splice in)."""

    WATCH = frozenset(("LOAD_FAST_AND_CLEAR", "FOR_ITER", "END_FOR"))  # see `normalise`

    def __init__(self) -> None:
        self.saved = 0  # variables saved by the comprehension being entered
        self.prologue = False
        self.depth = 0  # loops entered (FOR_ITER) and not yet left (END_FOR)
        self.open: list[tuple[int, int]] = []  # (loop depth, saved) of comprehensions in progress
        self.restore = 0  # STORE_FASTs still to drop after a comprehension's loop (SWAP first)
        self.swap_pending = False
        self.handlers: list[int] = []  # saved counts of every comprehension seen

    def skip(self, name: str) -> bool:
        """Whether instruction `name` is comprehension bookkeeping to leave out; called in order."""
        if name == "LOAD_FAST_AND_CLEAR":
            self.saved += 1
            self.prologue = True
            return True
        if self.prologue:
            if name in ("SWAP", "GET_ITER"):  # 3.13 gets the iterator again after the shuffle
                return True
            if name == "FOR_ITER":
                self.prologue = False
                self.open.append((self.depth, self.saved))
                self.handlers.append(self.saved)
                self.saved = 0
        if name == "FOR_ITER":
            self.depth += 1
        elif name == "END_FOR":
            self.depth -= 1
            if self.open and self.open[-1][0] == self.depth:
                self.restore = self.open.pop()[1]
                self.swap_pending = True
        elif self.restore:
            if self.swap_pending and name == "SWAP":
                self.swap_pending = False
                return True
            if name == "STORE_FAST":
                self.restore -= 1
                return True
            if name == "STORE_FAST_STORE_FAST" and self.restore >= 2:  # 3.13 restores two at once
                self.restore -= 2
                return True
            if name not in ("POP_TOP", "POP_ITER"):
                self.restore = 0
        return False

    def drop_handlers(self, lines: list[str]) -> list[str]:
        """Leave out each comprehension's cleanup handler (one pass over the lines)."""
        if not self.handlers:
            return lines
        wanted = Counter(self.handlers)
        out: list[str] = []
        i, n = 0, len(lines)
        while i < n:
            if lines[i : i + 3] == ["SWAP", "POP_TOP", "SWAP"]:
                k = 0
                while i + 3 + k < n and lines[i + 3 + k].startswith("STORE_FAST ") and k <= 255:
                    k += 1
                if i + 3 + k < n and lines[i + 3 + k] == "RERAISE" and wanted[k] > 0:
                    wanted[k] -= 1
                    i += 4 + k
                    continue
            out.append(lines[i])
            i += 1
        return out


def listing_sha256(lines: list[str]) -> str:
    # surrogatepass: names read from an image may hold lone surrogates (CPython allows them in str)
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()
