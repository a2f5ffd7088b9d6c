"""Call-level data flow of one method of a model's layer, recovered from its bytecode (never run).

Shared by the front ends: PyTorch walks each module's `forward`, Keras each layer's `call`. The method is the one
found closest in the class's MRO; its code object is decoded from the image with the image's own opcode tables (so
any supported Python version) and walked once, in order, with a small abstract stack. Values are the sets of
"producers" they derive from: the method's inputs, or the outputs of the layer's children. Calling `self.<child>(...)`
adds an edge from every producer of the arguments to that child; calling an element of a container (`for layer in
self.layers: x = layer(x)`, or `nn.Sequential`, which iterates over itself) chains the container's children in order;
returning a value adds edges to the layer's output. What counts as a child and as a container is the front end's
business (torch `_modules`; Keras attributes holding tracked layers or lists of them), passed in as plain mappings.

What this is and is not: a static, path-insensitive approximation (each instruction once, jumps ignored, unknown
operations merge their operands), so it shows which children consume which others' outputs, including residual
connections; it does not model loops' repetitions, control flow, or calls into helper functions that call children.
Edges are per layer: `PATH:in:ARG -> child`, `child -> child`, `child -> PATH:out`.
"""

from __future__ import annotations

from collections.abc import Callable

from zen.cpython.code.instructions import Instruction, decode, pair_parts
from zen.cpython.interp import Interpreter
from zen.cpython.layout.profile import OpcodeTable
from zen.cpython.readers.code import read_code
from zen.cpython.readers.dicts import dict_get
from zen.cpython.readers.functions import read_function
from zen.cpython.readers.types import read_type

EMPTY: frozenset = frozenset()
MAX_INSTRUCTIONS = 20_000
Code = tuple[list[Instruction], tuple[str, ...]]


def find_method(ip: Interpreter, type_addr: int, name: str) -> int | None:
    """Address of the function `name` defined closest in the class's MRO (None if none, or not a plain function)."""
    t = read_type(ip, type_addr)
    for cls in t.mro_addrs:
        ct = read_type(ip, cls)
        if not ct.dict_addr:
            continue
        f = dict_get(ip, ct.dict_addr, name)
        if f is not None:
            return f if ip.kind(f) == "function" else None
    return None


_LOADS = frozenset(("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_FAST_AND_CLEAR", "LOAD_DEREF", "LOAD_CLOSURE"))
_STORES = frozenset(("STORE_FAST", "STORE_DEREF"))
MAX_COUNT = 256  # operands one instruction may pop or push here: image opargs are untrusted
_SKIP = frozenset(("PRECALL", "KW_NAMES", "RESUME", "RESUME_CHECK", "NOP", "CACHE", "EXTENDED_ARG", "NOT_TAKEN", "TO_BOOL"))


class _Walker:
    """Abstract interpretation of one code object's instructions; records edges between tokens.

    Instructions come from zen's own decoder driven by the image's profile, and the stack effect
    of anything not modelled from the profile's table, so a 3.13 image is walked by zen on 3.11
    exactly as a 3.11 image is. Version differences handled: 3.13's two-local superinstructions,
    3.12's method flag in LOAD_ATTR (3.11: LOAD_METHOD), 3.13's CALL_KW (names on the stack),
    3.14's BINARY_OP [] subscripts and LOAD_SMALL_INT, 3.12's RETURN_CONST.
    """

    def __init__(self, instructions: list[Instruction], params: tuple[str, ...], ops: OpcodeTable) -> None:
        self.instructions = instructions
        self.params = params
        self.ops = ops
        self.method_flag = ops.name_arg_shift.get("LOAD_ATTR", 0) == 1  # 3.12+: low bit = method load
        self.global_null = ops.name_arg_shift.get("LOAD_GLOBAL", 0) == 1  # 3.11+: low bit = push NULL
        self.edges: set[tuple[tuple, tuple]] = set()

    @staticmethod
    def prod(v: tuple) -> frozenset:
        if v[0] == "data":
            return v[1]
        if v[0] == "child":
            return frozenset({("child", v[1])})
        return EMPTY

    def run(self, children: list[str]) -> set:
        local: dict[str, tuple] = {}
        for i, n in enumerate(self.params):
            local[n] = ("self",) if i == 0 else ("data", frozenset({("in", n)}))
        stack: list[tuple] = []

        def pop() -> tuple:
            return stack.pop() if stack else ("data", EMPTY)

        for n_ins, ins in enumerate(self.instructions):
            if n_ins > MAX_INSTRUCTIONS:
                break
            op, arg = ins.name, ins.argval
            if ins.kind == "local_pair":
                for part, name in zip(pair_parts(op) or (), arg):
                    if part in _STORES:
                        local[name] = pop()
                    else:
                        stack.append(local.get(name, ("data", EMPTY)))
            elif op in _LOADS:
                stack.append(local.get(arg, ("data", EMPTY)))
            elif op in _STORES:
                local[arg] = pop()
            elif op == "LOAD_GLOBAL":
                if self.global_null and ins.arg is not None and ins.arg & 1:
                    stack.append(("null",))
                stack.append(("data", EMPTY))
            elif op in ("LOAD_ATTR", "LOAD_METHOD"):
                obj = pop()
                if op == "LOAD_METHOD" or (self.method_flag and (ins.arg or 0) & 1):
                    stack.append(("null",))
                if obj[0] == "self" and arg in children:
                    stack.append(("child", arg))
                else:
                    stack.append(("data", self.prod(obj)))
            elif op == "PUSH_NULL":
                stack.append(("null",))
            elif op in ("CALL", "CALL_KW", "CALL_METHOD"):  # CALL_METHOD: 3.8-3.10, after LOAD_METHOD
                if op == "CALL_KW":
                    pop()  # the tuple of keyword names
                args = [pop() for _ in range(self._count(ins.arg, stack))]
                a, b = pop(), pop()
                callee = a if a[0] != "null" else b
                self._call(callee, args, stack)
            elif op in ("CALL_FUNCTION", "CALL_FUNCTION_KW"):  # 3.8-3.10: one callable below the arguments
                if op == "CALL_FUNCTION_KW":
                    pop()  # the tuple of keyword names
                args = [pop() for _ in range(self._count(ins.arg, stack))]
                self._call(pop(), args, stack)
            elif op == "CALL_FUNCTION_EX":
                # 3.14 has no argument and always a kwargs slot (the dict or NULL); before, bit 0 says
                vals = [pop() for _ in range(3 if ins.arg is None or ins.arg & 1 else 2)]
                null = pop() if self.global_null else ("data", EMPTY)  # no NULL slot before 3.11
                callee = vals[-1] if vals[-1][0] != "null" else null
                self._call(callee, vals[:-1], stack)
            elif op == "GET_ITER":
                v = pop()
                stack.append(
                    ("iter", "self") if v[0] == "self" else ("iter", v[1]) if v[0] == "child" else ("data", self.prod(v))
                )
            elif op == "FOR_ITER":
                it = stack[-1] if stack else ("data", EMPTY)
                stack.append(("elem", it[1]) if it[0] == "iter" else ("data", self.prod(it)))
            elif op == "BINARY_SUBSCR" or (op == "BINARY_OP" and arg == "[]"):
                idx, container = pop(), pop()
                stack.append(
                    ("elem", container[1]) if container[0] == "child" else ("data", self.prod(container) | self.prod(idx))
                )
            elif op in ("UNPACK_SEQUENCE", "UNPACK_EX"):
                v = pop()
                arg = ins.arg or 0
                n = arg if op == "UNPACK_SEQUENCE" else (arg & 0xFF) + (arg >> 8) + 1  # before, starred, after
                stack.extend([("data", self.prod(v))] * min(n, MAX_COUNT))
            elif op == "RETURN_VALUE":
                for p in self.prod(pop()):
                    self.edges.add((p, ("out",)))
            elif op in _SKIP or op.startswith("JUMP"):
                continue
            elif op == "COPY":
                stack.append(stack[-(ins.arg or 1)] if len(stack) >= (ins.arg or 1) else ("data", EMPTY))
            elif op == "SWAP":
                i = ins.arg or 2
                if len(stack) >= i:
                    stack[-1], stack[-i] = stack[-i], stack[-1]
            else:
                self._generic(ins, stack, pop)
        return self.edges

    def _call(self, callee: tuple, args: list[tuple], stack: list[tuple]) -> None:
        prods = frozenset().union(*(self.prod(a) for a in args)) if args else EMPTY
        if callee[0] == "child":
            tok = ("child", callee[1])
            self.edges.update((p, tok) for p in prods)
            stack.append(("data", frozenset({tok})))
        elif callee[0] == "elem":
            tok = ("chain", callee[1])
            self.edges.update((p, tok) for p in prods)
            stack.append(("data", frozenset({tok})))
        else:
            stack.append(("data", prods | self.prod(callee)))

    @staticmethod
    def _count(arg: int | None, stack: list[tuple]) -> int:
        """How many operands an instruction takes, bounded by what the stack can hold."""
        return min(arg or 0, len(stack) + 1, MAX_COUNT)

    def _generic(self, ins: Instruction, stack: list[tuple], pop: Callable[[], tuple]) -> None:
        net = max(-MAX_COUNT, min(MAX_COUNT, self.ops.stack_effect(ins.op, ins.arg)))
        if net < 0:
            merged = frozenset().union(*(self.prod(pop()) for _ in range(-net)))
            top = pop()
            stack.append(("data", self.prod(top) | merged))
        else:
            stack.extend([("data", self.prod(stack[-1]) if stack else EMPTY)] * net)


def _decoded(ip: Interpreter, code_addr: int) -> tuple[list[Instruction], tuple[str, ...]]:
    """(instructions, parameter names) of a code object in the image, in the image's version."""
    ci = read_code(ip, code_addr)
    consts = [""] * len(ci.consts)  # constants play no part in the walk
    params = ci.varnames[: ci.argcount + ci.kwonlyargcount]
    return decode(ci.code, ci.names, ci.localsplusnames, consts, ip.P.opcodes, ci.free_base), params


def method_code(ip: Interpreter, type_addr: int, name: str, cache: dict[int, Code | None]) -> Code | None:
    """The decoded method `name` of a class (None when it has none), decoded once per class. Raises ZenError."""
    if type_addr not in cache:
        f = find_method(ip, type_addr, name)
        cache[type_addr] = _decoded(ip, read_function(ip, f).code) if f else None
    return cache[type_addr]


def _node(path: str, tok: tuple, children: dict[str, str], containers: dict[str, list[str]], first: bool) -> list[str]:
    base = path or "<root>"
    if tok[0] == "in":
        return [f"{base}:in:{tok[1]}"]
    if tok[0] == "out":
        return [f"{base}:out"]
    if tok[0] == "child":
        return [children[tok[1]]] if tok[1] in children else []
    kids = containers.get(tok[1], [])
    if not kids:
        return []
    return [kids[0]] if first else [kids[-1]]


def layer_edges(code: Code, ops: OpcodeTable, path: str, children: dict[str, str],
                containers: dict[str, list[str]]) -> set[tuple[str, str]]:  # fmt: skip
    """Edges between paths from one layer's decoded method.

    `children` maps an attribute name of `self` to the path of the child layer it holds; `containers` maps an
    attribute name (and "self", for a layer that iterates over itself) to the paths of the layers it holds, in order.
    """
    names = list(dict.fromkeys([*children, *(c for c in containers if c != "self")]))
    local = _Walker(code[0], code[1], ops).run(names)
    edges: set[tuple[str, str]] = set()
    for src, dst in local:
        for s in _node(path, src, children, containers, first=False):
            for d in _node(path, dst, children, containers, first=True):
                edges.add((s, d))
    for tok in {t for e in local for t in e if t[0] == "chain"}:
        kids = containers.get(tok[1], [])
        edges.update(zip(kids, kids[1:]))
    return edges
