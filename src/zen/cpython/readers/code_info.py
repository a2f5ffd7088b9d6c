"""A code object as read from an image, whatever the CPython version (3.11+ by `code`, 3.8-3.10 by `legacy_code`).

Its own module so that both readers share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CodeInfo:
    addr: int
    argcount: int
    posonlyargcount: int
    kwonlyargcount: int
    stacksize: int
    firstlineno: int
    flags: int
    nlocals: int
    nlocalsplus: int
    consts: list[int]
    names: tuple[str, ...]
    localsplusnames: tuple[str, ...]
    localspluskinds: bytes
    filename: str
    name: str
    qualname: str
    linetable: bytes
    exceptiontable: bytes
    adaptive: bytes
    code: bytes
    varnames: tuple[str, ...] = field(default=())
    cellvars: tuple[str, ...] = field(default=())
    freevars: tuple[str, ...] = field(default=())
    # index in `localsplusnames` of cell/free argument 0: 0 from 3.11 (one merged table), the
    # number of varnames before (cell and free variables numbered on their own)
    free_base: int = 0
