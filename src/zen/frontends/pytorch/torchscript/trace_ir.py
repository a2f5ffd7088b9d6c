"""A traced model's forward graphs, printed again as TorchScript IR that `zen reuse` compiles into an archive.

`torch.jit.trace` keeps no code text: each module's `forward` is only a graph (`prim::GetAttr` of a child,
`prim::CallMethod` on it, ops, constants). So for every TorchScript class of the model this reads the forward graph
of one of its modules and writes it out again as IR text, the way `torch._C.parse_ir` reads it, with each call to a
child inlined (exactly what torch's own `Inline` pass does before running it):

* every tensor the graph fetches from the module tree (`self.conv.weight`) becomes an input after the model's own,
  named `zen_s0, zen_s1, ...`, with its attribute path kept beside it (`state`);
* a tensor constant (a traced `x * 2.5` multiplies by a 0-dim tensor) becomes an input `zen_c0, ...` whose dtype,
  shape and values are read from the image (`constants`), up to `MAX_CONSTANT` elements;
* other constants are printed as IR literals (ints, bools, finite floats, plain strings and devices, None).

What cannot be printed faithfully is refused with its reason (control flow, a non-forward call, a list constant,
an unknown type): the class then has no plan, and the case says why. Nothing here runs or compiles anything:
`reuse.trace_code` hands the IR to torch. Every walk is bounded (nodes, depth of inlining, vector sizes).
"""

from __future__ import annotations

import keyword
import math
import re

import numpy as np

from zen.frontends.pytorch.torchscript.graphs import GraphReader
from zen.frontends.pytorch.torchscript.ir_types import SymbolTable, TypeReader, annotation, ir_name
from zen.frontends.pytorch.torchscript.reader import JitNode
from zen.runtime.errors import ZenError

MAX_NODES = 200_000  # printed per class, inlined children included
MAX_INLINE = 64  # depth of calls inlined into calls
MAX_CONSTANT = 4096  # elements of a tensor constant
MAX_TEXT = 256
PLAIN_TEXT = re.compile(r"[A-Za-z0-9_:./ -]*")
CONSTANT_DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int64": "<i8", "int32": "<i4",
                   "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?"}  # fmt: skip


class TraceUnsupported(ZenError):
    pass


class TracePrinter:
    """IR plans of a traced model's classes (`plans`), read from their forward graphs."""

    def __init__(self, gr: GraphReader, tensors, walk: dict) -> None:  # noqa: D107
        self.gr, self.ip, self.tp, self.tensors = gr, gr.ip, gr.tp, tensors
        self.types = TypeReader(gr.jr)
        self.syms = SymbolTable(gr.jr)
        self.nodes = {n.addr: n for n in walk.values() if isinstance(n, JitNode)}

    def plans(self, walk: dict) -> tuple[dict, dict]:
        """({class: plan}, {class: why not}) for every TorchScript class of the model, each from its first module."""
        plans: dict[str, dict] = {}
        refused: dict[str, str] = {}
        for path, node in walk.items():
            if not isinstance(node, JitNode) or node.type.script_name in plans or node.type.script_name in refused:
                continue
            name = node.type.script_name
            try:
                plans[name] = self.plan(node, path)
            except ZenError as exc:
                refused[name] = f"module {path or 'model'}: {exc}"
        return plans, refused

    def plan(self, node: JitNode, path: str) -> dict:
        ct = self.ip.ptr(node.addr + self.tp.jitobject.type)
        out = {"module": path, "declarations": self.declarations(ct), "parameters": [n for n, _ in node.parameters],
               "buffers": [n for n, _ in node.buffers]}  # fmt: skip
        graph = self.gr.forward(node.addr)
        if not graph:
            return {**out, "ir": None}
        return {**out, **_Emitter(self).top(graph, node)}

    def declarations(self, ct: int) -> list[list[str]]:
        """[[attribute, its annotation]] of a ClassType, in its order (what the class header declares)."""
        C, A = self.tp.classtype, self.tp.classattr
        b, e = self.ip.space.u64(ct + C.attributes), self.ip.space.u64(ct + C.attributes + 8)
        size = self.tp.constants["CLASSATTR_SIZE"]
        n, rest = divmod(e - b, size)
        if rest or not 0 <= n <= 65_536:
            raise TraceUnsupported(f"a class with {e - b:,} bytes of attributes")
        out = []
        for i in range(n):
            at = b + i * size
            name = self.gr.jr.string(at + A.name, MAX_TEXT)
            out.append([name, annotation(self.types.read(self.ip.ptr(at + A.type)))])
        return out


class _Emitter:
    """One class's IR: its forward graph with every child call inlined."""

    def __init__(self, tr: TracePrinter) -> None:  # noqa: D107
        self.tr, self.gr, self.ip, self.tp = tr, tr.gr, tr.ip, tr.tp
        self.lines: list[str] = []
        self.state: dict[tuple[str, ...], str] = {}
        self.constants: list[dict] = []
        self.operators: dict[str, int] = {}
        self.count = 0
        self.budget = MAX_NODES

    def _fresh(self) -> str:
        self.count += 1
        return f"%v{self.count}"

    def top(self, graph: int, node: JitNode) -> dict:
        T = self.tp
        block = self.ip.ptr(graph + T.jitgraph.block)
        inputs = self.gr._vector(self.ip.ptr(block + T.jitblock.input) + T.jitnode.outputs)
        if not inputs:
            raise TraceUnsupported("a forward graph without self")
        names, args = [], []
        for i, v in enumerate(inputs[1:], 1):
            raw = re.sub(r"\.\d+$", "", self.gr._value_name(v))
            name = raw if raw.isidentifier() and raw.isascii() and not keyword.iskeyword(raw) and not raw.startswith("zen_") \
                and raw not in names else f"argument_{i}"  # fmt: skip
            names.append(name)
            args.append((f"%{name}", ir_name(self.tr.types.of_value(v))))
        results = self.emit(graph, ((), node.addr), [a for a, _ in args], 0)
        state_in = [(n, "Tensor") for n in self.state.values()]
        const_in = [(f"%zen_c{i}", "Tensor") for i in range(len(self.constants))]
        head = ", ".join(f"{n} : {t}" for n, t in [*args, *state_in, *const_in])
        ir = f"graph({head}):\n" + "".join(f"  {x}\n" for x in self.lines) + f"  return ({', '.join(results)})\n"
        return {"ir": ir, "inputs": names, "state": [list(p) for p in self.state], "constants": self.constants,
                "operators": dict(sorted(self.operators.items()))}  # fmt: skip

    def emit(self, graph: int, this: tuple, args: list[str], depth: int) -> list[str]:
        """Print one graph's nodes with `self` = module `this` ((path, object)) and its inputs = `args`; the IR
        names of what it returns."""
        if depth > MAX_INLINE:
            raise TraceUnsupported(f"calls nested more than {MAX_INLINE} deep")
        T, gr = self.tp, self.gr
        block = self.ip.ptr(graph + T.jitgraph.block)
        inputs = gr._vector(self.ip.ptr(block + T.jitblock.input) + T.jitnode.outputs)
        if len(inputs) != len(args) + 1:
            raise TraceUnsupported(f"a forward graph of {len(inputs) - 1} inputs called with {len(args)}")
        env: dict[int, tuple] = {inputs[0]: ("mod", *this)}
        env.update({v: ("ir", a) for v, a in zip(inputs[1:], args)})
        node, last = self.ip.ptr(self.ip.ptr(block + T.jitblock.input) + T.jitnode.next), self.ip.ptr(block + T.jitblock.output)
        seen: set[int] = set()
        while node and node not in seen:
            self.budget -= 1
            if self.budget < 0:
                raise TraceUnsupported(f"more than {MAX_NODES:,} nodes once calls are inlined")
            seen.add(node)
            ins = gr._vector(node + T.jitnode.inputs)
            if node == last:
                return [self._use(env, v) for v in ins]
            if gr._vector(node + T.jitnode.blocks, 64):
                raise TraceUnsupported(f"control flow ({self._kind(node)} with blocks) in a traced graph")
            self._node(node, ins, env, this, depth)
            node = self.ip.ptr(node + T.jitnode.next)
        raise TraceUnsupported("a graph block whose nodes do not reach its return")

    def _kind(self, node: int) -> str:
        return self.tr.syms.name(self.ip.space.u32(node + self.tp.jitnode.kind))

    def _use(self, env: dict, v: int) -> str:
        got = env.get(v)
        if got is None:
            raise TraceUnsupported("a value used before any node made it")
        if got[0] != "ir":
            raise TraceUnsupported("a module or its tensor used as a value (not a call of its forward)")
        return got[1]

    def _node(self, node: int, ins: list[int], env: dict, this: tuple, depth: int) -> None:
        T, gr, c = self.tp, self.gr, self.tp.constants
        kind_sym = self.ip.space.u32(node + T.jitnode.kind)
        outs = gr._vector(node + T.jitnode.outputs)
        if kind_sym == c["SYM_GETATTR"]:
            if len(outs) != 1:
                raise TraceUnsupported(f"a prim::GetAttr node with {len(outs)} outputs")
            env[outs[0]] = self._getattr(env.get(ins[0]) if ins else None, gr._name(node))
            return
        if kind_sym == c["SYM_CALLMETHOD"]:
            target, method = (env.get(ins[0]) if ins else None), gr._name(node)
            if not method or not target or target[0] != "mod":
                raise TraceUnsupported(f"a call of {method!r} on something other than a child module")
            graph = gr.forward(target[2], method)  # a module a trace called twice has `forward1` too
            if not graph:
                raise TraceUnsupported(f"module {'.'.join(target[1]) or 'model'} is called but has no {method} graph")
            results = self.emit(graph, (target[1], target[2]), [self._use(env, v) for v in ins[1:]], depth + 1)
            if len(results) != len(outs):
                raise TraceUnsupported("a call whose results do not match its callee's return")
            env.update({o: ("ir", r) for o, r in zip(outs, results)})
            return
        kind = self._kind(node)
        self.operators[kind] = self.operators.get(kind, 0) + 1
        if kind == "prim::Constant":
            if len(outs) != 1:
                raise TraceUnsupported(f"a prim::Constant node with {len(outs)} outputs")
            env[outs[0]] = ("ir", self._constant(node, outs[0]))
            return
        if gr._vector(node + T.jitnode.attributes, 64):
            raise TraceUnsupported(f"a {kind} node with attributes")
        names = [self._fresh() for _ in outs]
        typed = ", ".join(f"{n} : {ir_name(self.tr.types.of_value(o))}" for n, o in zip(names, outs))
        args = ", ".join(self._use(env, v) for v in ins)
        self.lines.append(f"{typed} = {kind}({args})" if outs else f"{kind}({args})")
        env.update({o: ("ir", n) for o, n in zip(outs, names)})

    def _getattr(self, base: tuple | None, name: str | None) -> tuple:
        if not base or base[0] != "mod" or not name:
            raise TraceUnsupported("prim::GetAttr of something other than a module")
        path, obj = base[1], base[2]
        mod = self.tr.nodes.get(obj)
        if mod is None:
            raise TraceUnsupported(f"module {'.'.join(path) or 'model'} was not read")
        child = dict(mod.children).get(name)
        if child:
            return ("mod", (*path, name), child)
        if name in dict(mod.parameters) or name in dict(mod.buffers):
            key = (*path, name)
            self.state.setdefault(key, f"%zen_s{len(self.state)}")
            return ("ir", self.state[key])
        raise TraceUnsupported(f"the traced graph reads attribute {name!r} of {'.'.join(path) or 'model'}, not a "
                               "child, parameter or buffer")  # fmt: skip

    def _constant(self, node: int, out: int) -> str:
        T = self.tp
        t = self.tr.types.of_value(out)
        attrs = self.gr._vector(node + T.jitnode.attributes, 64)
        name = self._fresh()
        if t[0] in ("NoneType", "optional") and not attrs:
            self.lines.append(f"{name} : {ir_name(t)} = prim::Constant()")
            return name
        if len(attrs) != 1:
            raise TraceUnsupported(f"a constant of type {ir_name(t)} with {len(attrs)} attributes")
        at = attrs[0] + T.jitattr.value
        if t[0] in ("int", "bool"):
            lit = str(_signed(self.ip.space.u64(at)))
        elif t[0] == "float":
            x = float(np.frombuffer(self.ip.space.read(at, 8), "<f8")[0])
            if not math.isfinite(x):
                raise TraceUnsupported(f"a non-finite float constant {x}")
            lit = repr(x)
        elif t[0] in ("str", "Device"):
            text = self.gr.jr.string(at, MAX_TEXT)
            if not PLAIN_TEXT.fullmatch(text):
                raise TraceUnsupported(f"a string constant with characters zen does not print ({text[:40]!r})")
            lit = f'"{text}"'
        elif t[0] == "Tensor":
            self.constants.append(tensor_constant(self.tr.tensors, self.ip.ptr(at)))
            return f"%zen_c{len(self.constants) - 1}"
        else:
            raise TraceUnsupported(f"a constant of type {ir_name(t)}")
        self.lines.append(f"{name} : {ir_name(t)} = prim::Constant[value={lit}]()")
        return name


def tensor_constant(tensors, impl: int) -> dict:
    """A tensor constant's dtype, shape and values (as `repr` texts: exact for every dtype listed), read from its
    TensorImpl; small CPU tensors only (constants are scalars and short tables, never weights)."""
    meta = tensors.meta(impl)
    if math.prod(meta.shape) != meta.numel:
        raise TraceUnsupported(f"a tensor constant of shape {list(meta.shape)[:8]} claiming {meta.numel:,} elements")
    if meta.dtype not in CONSTANT_DTYPES or meta.device != "cpu" or meta.numel > MAX_CONSTANT or not meta.contiguous:
        raise TraceUnsupported(f"a tensor constant ({meta.dtype}, {list(meta.shape)}, {meta.device}) that zen does "
                               f"not print (up to {MAX_CONSTANT:,} elements on the CPU)")  # fmt: skip
    raw = b"".join(bytes(b) for b in tensors.iter_bytes(meta))
    if len(raw) != meta.numel * np.dtype(CONSTANT_DTYPES[meta.dtype]).itemsize:
        raise TraceUnsupported("a tensor constant whose bytes were not all read")
    values = np.frombuffer(raw, CONSTANT_DTYPES[meta.dtype])
    return {"dtype": meta.dtype, "shape": list(meta.shape), "values": [repr(x.item()) for x in values]}


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u
