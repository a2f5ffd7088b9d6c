"""The serialized `relax.VMExecutable`: header, function table, constant pool, bytecode.

Format (TVM `src/runtime/vm/executable.cc`, VM_VERSION "0.14"): magic u64 (…151D, or …151E when
a memory-scope section follows), version string, the function table (kind i32, name, start/end
instruction, argument count, register-file size, parameter names), [memory scopes], constants
(type index i32 + payload: tensors in TVM's DLTensor file format, shapes, strings, ints, floats,
dtypes), and the code (instruction offsets, instruction words). Tensors become numpy arrays read
in one slice each; nothing here imports TVM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zen.compiled.errors import ExecutableError
from zen.compiled.static.reader import Reader

MAGIC_V1 = 0xD225DE2F4214151D
MAGIC_V2 = 0xD225DE2F4214151E
SUPPORTED_VERSIONS = ("0.14",)
TENSOR_MAGIC = 0xDD5E40F096B4A13F

# tvm-ffi type indices used in the constant pool
T_INT, T_FLOAT, T_DTYPE, T_STR, T_SHAPE, T_TENSOR = 1, 3, 5, 65, 69, 70
FUNC_KINDS = {0: "packed", 1: "vm", 2: "vm_tir"}
OPCODES = {1: "call", 2: "ret", 3: "goto", 4: "if"}
ARG_KINDS = {0: "reg", 1: "imm", 2: "const", 3: "func"}
SPECIAL_REG = 1 << 54
VOID_REG, VM_REG = SPECIAL_REG, SPECIAL_REG + 1
MAX_NDIM = 32


@dataclass(frozen=True)
class DType:
    code: int
    bits: int
    lanes: int

    @property
    def name(self) -> str:
        base = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}.get(self.code, f"code{self.code}_")
        if self.code == 6 or (self.code == 1 and self.bits == 1):
            return "bool"
        return f"{base}{self.bits}" + (f"x{self.lanes}" if self.lanes != 1 else "")

    def numpy(self) -> np.dtype | None:
        """The numpy dtype holding this type's bytes (bfloat16 as raw uint16), None if unknown."""
        if self.lanes != 1:
            return None
        if self.name == "bool":
            return np.dtype(np.bool_)
        if self.code == 4 and self.bits == 16:
            return np.dtype("<u2")
        kind = {0: "i", 1: "u", 2: "f"}.get(self.code)
        if kind is None or self.bits not in (8, 16, 32, 64):
            return None
        return np.dtype(f"<{kind}{self.bits // 8}")


@dataclass
class FuncInfo:
    kind: str
    name: str
    start: int
    end: int
    num_args: int
    registers: int
    params: list[str]


@dataclass
class Arg:
    kind: str  # reg | imm | const | func
    value: int

    def __str__(self) -> str:
        if self.kind == "reg":
            return "%void" if self.value == VOID_REG else "%vm" if self.value == VM_REG else f"%{self.value}"
        return {"imm": "i", "const": "c[", "func": "f["}[self.kind] + str(self.value) + ("]" if self.kind != "imm" else "")


@dataclass
class Instr:
    op: str
    dst: int = VOID_REG
    func: int = -1
    args: list[Arg] = field(default_factory=list)
    result: int = 0  # ret
    offset: int = 0  # goto / if false offset
    cond: int = 0


@dataclass
class Executable:
    version: str
    magic: int
    functions: list[FuncInfo]
    constants: list[Any]  # np.ndarray | tuple[int, ...] (shape) | str | int | float | DType
    instructions: list[Instr]
    memory_scopes: dict[int, str]

    def function(self, name: str) -> FuncInfo:
        for f in self.functions:
            if f.name == name and f.kind != "packed":
                return f
        raise ExecutableError(
            f"the VM executable has no bytecode function {name!r}",
            "functions: " + ", ".join(f.name for f in self.functions if f.kind != "packed"),
        )

    def listing(self, name: str = "main") -> str:
        """Text of a function's bytecode, in the style of TVM's `as_text()`."""
        f = self.function(name)
        lines = [f"@{f.name}({', '.join(f.params)}):"]
        for ins in self.instructions[f.start : f.end]:
            if ins.op == "call":
                callee = self.functions[ins.func].name if 0 <= ins.func < len(self.functions) else f"?{ins.func}"
                dst = str(Arg("reg", ins.dst))
                lines.append(f"  call {callee} in: {', '.join(map(str, ins.args))} dst: {dst}")
            elif ins.op == "ret":
                lines.append(f"  ret %{ins.result}")
            elif ins.op == "goto":
                lines.append(f"  goto {ins.offset}")
            else:
                lines.append(f"  if %{ins.cond} else {ins.offset}")
        return "\n".join(lines)


def _dtype(r: Reader, field: str) -> DType:
    return DType(r.u8(field), r.u8(field), r.u16(field))


def _tensor(r: Reader, i: int) -> np.ndarray:
    where = f"constant {i}"
    if r.u64(where) != TENSOR_MAGIC:
        raise r.fail(where, "tensor does not start with TVM's tensor magic")
    r.u64(where)  # reserved
    r.i32(where)
    r.i32(where)  # device type, id (always CPU when saved)
    ndim = r.i32(where)
    if not 0 <= ndim <= MAX_NDIM:
        raise r.fail(where, f"tensor rank {ndim} is implausible")
    dt = _dtype(r, where)
    shape = tuple(int(s) for s in r.array("<i8", ndim, where + " shape"))
    if any(s < 0 for s in shape):
        raise r.fail(where, f"negative dimension in shape {shape}")
    nbytes = r.i64(where + " size")
    elems = int(np.prod(shape, dtype=np.float64))
    expect = elems * ((dt.bits + 7) // 8) * dt.lanes
    if nbytes != expect or nbytes > r.remaining:
        raise r.fail(where, f"tensor data size {nbytes} does not match shape {shape} {dt.name} ({expect}) or the file")
    npdt = dt.numpy()
    raw = r.take(nbytes, where + " data")
    if npdt is None:
        raise r.fail(where, f"tensor dtype {dt.name} is not supported")
    return np.frombuffer(raw, dtype=npdt).reshape(shape)


def _constants(r: Reader) -> list[Any]:
    out: list[Any] = []
    for i in range(r.count("constant count", 4)):
        t = r.i32(f"type of constant {i}")
        if t == T_TENSOR:
            out.append(_tensor(r, i))
        elif t == T_SHAPE:
            n = r.count(f"constant {i} shape rank", 8)
            out.append(tuple(int(v) for v in r.array("<i8", n, f"constant {i}")))
        elif t == T_STR:
            out.append(r.string(f"constant {i}"))
        elif t == T_INT:
            out.append(r.i64(f"constant {i}"))
        elif t == T_FLOAT:
            out.append(r.f64(f"constant {i}"))
        elif t == T_DTYPE:
            out.append(_dtype(r, f"constant {i}"))
        else:
            raise r.fail(f"constant {i}", f"unknown constant type index {t}")
    return out


def _decode(offsets: np.ndarray, words: np.ndarray, r: Reader) -> list[Instr]:
    n = len(words)
    out = []
    value_mask = (1 << 56) - 1
    for i, off in enumerate(offsets.tolist()):
        if not 0 <= off < n:
            raise r.fail("code", f"instruction {i} offset {off} lies outside the {n} code words")
        op = OPCODES.get(int(words[off]))
        need = {"call": 4, "ret": 2, "goto": 2, "if": 3}.get(op or "", 0)
        if op is None or off + need > n:
            raise r.fail("code", f"instruction {i} has bad opcode {int(words[off])} or is cut off")
        if op == "call":
            nargs = int(words[off + 3])
            if not 0 <= nargs <= n - off - 4:
                raise r.fail("code", f"call at instruction {i} has {nargs} arguments, past the end of the code")
            args = []
            for w in words[off + 4 : off + 4 + nargs].tolist():
                kind = (w >> 56) & 0xFF
                val = w & value_mask
                if val >> 55:
                    val -= 1 << 56
                if kind not in ARG_KINDS:  # every later reader switches on the four kinds TVM writes
                    raise r.fail("code", f"call at instruction {i} has an argument of unknown kind {kind} "
                                         f"(TVM writes {', '.join(ARG_KINDS.values())})")  # fmt: skip
                args.append(Arg(ARG_KINDS[kind], val))
            out.append(Instr("call", dst=int(words[off + 1]), func=int(words[off + 2]), args=args))
        elif op == "ret":
            out.append(Instr("ret", result=int(words[off + 1])))
        elif op == "goto":
            out.append(Instr("goto", offset=int(words[off + 1])))
        else:
            out.append(Instr("if", cond=int(words[off + 1]), offset=int(words[off + 2])))
    return out


def parse_executable(data: bytes | memoryview) -> Executable:
    """Decode a serialized relax.VMExecutable; raises ExecutableError for anything malformed."""
    r = Reader(data, what="VM executable")
    magic = r.u64("magic")
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise ExecutableError(
            f"VM executable: unknown magic {magic:#x}", "not a relax VM executable, or one from a TVM version zen does not know"
        )
    version = r.string("version", limit=64)
    if version not in SUPPORTED_VERSIONS:
        raise ExecutableError(
            f"VM executable format version {version!r} is not supported (zen reads {SUPPORTED_VERSIONS})",
            "the library was built by another TVM version; rebuild it with apache-tvm 0.27",
        )
    funcs = []
    for i in range(r.count("function table", 4 + 8 * 6)):
        kind = r.i32(f"function {i} kind")
        name = r.string(f"function {i} name", limit=4096)
        start, end, nargs, regs = (r.i64(f"function {i} {w}") for w in ("start", "end", "num_args", "registers"))
        funcs.append(FuncInfo(FUNC_KINDS.get(kind, f"kind{kind}"), name, start, end, nargs, regs, r.strings(f"{name} params")))
    scopes: dict[int, str] = {}
    if magic == MAGIC_V2:
        for i in range(r.count("memory scopes", 16)):
            idx = r.i64(f"memory scope {i}")
            scopes[idx] = r.string(f"memory scope {i}")
    constants = _constants(r)
    offsets = r.vec("<i8", "instruction offsets")
    words = r.vec("<i8", "instruction data")
    instrs = _decode(offsets, words, r)
    for f in funcs:
        if f.kind != "packed" and not 0 <= f.start <= f.end <= len(instrs):
            raise r.fail("function table", f"function {f.name} spans instructions {f.start}..{f.end} of {len(instrs)}")
    return Executable(version, magic, funcs, constants, instrs, scopes)
