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

from zen.cpython.instructions import Instruction

DROP = frozenset({"CACHE", "RESUME", "PRECALL", "NOP", "EXTENDED_ARG", "KW_NAMES", "PUSH_NULL", "RESUME_CHECK", "NOT_TAKEN"})
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
}


def normalise(instructions: list[Instruction]) -> list[str]:
    """The listing lines for decoded instructions."""
    targets = sorted({i.argval for i in instructions if i.kind == "jump" and isinstance(i.argval, int)})
    labels = {off: f"L{n}" for n, off in enumerate(targets, 1)}
    lines: list[str] = []
    for ins in instructions:
        if ins.offset in labels:
            lines.append(f"{labels[ins.offset]}:")
        name = ins.name
        if name in DROP:
            continue
        if name == "RETURN_CONST":  # 3.12: LOAD_CONST + RETURN_VALUE in one instruction
            lines.append(f"LOAD_CONST {ins.argval}")
            lines.append("RETURN_VALUE")
            continue
        name = RENAME.get(name, name)
        if ins.kind == "jump":
            lines.append(f"{name} {labels.get(ins.argval, '?')}")
        elif ins.kind in ("name", "const", "local", "free", "compare", "binop"):
            lines.append(f"{name} {ins.argval}")
        elif ins.kind == "other" and name in ("CALL", "BUILD_TUPLE", "BUILD_LIST", "BUILD_MAP", "BUILD_SET", "UNPACK_SEQUENCE",
                                              "CALL_FUNCTION_EX", "MAKE_FUNCTION", "BUILD_SLICE", "FORMAT_VALUE"):  # fmt: skip
            lines.append(f"{name} {ins.arg}")
        else:
            lines.append(name)
    return lines


def listing_sha256(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
