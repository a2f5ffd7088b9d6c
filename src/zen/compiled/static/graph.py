"""The kernel-call graph of a VM function, recovered by walking its bytecode.

Relax code is in destination-passing style: `alloc_tensor` makes an output buffer (shape and
dtype from the constant pool), a kernel call receives its inputs followed by the buffers it
writes, `null_value` frees registers. Following registers through those instructions gives each
kernel's inputs (graph inputs, earlier kernels' outputs, constants) and outputs with their
shapes, without running anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zen.compiled.errors import ExecutableError
from zen.compiled.static.vm_executable import VM_REG, VOID_REG, DType, Executable

MAX_INSTRUCTIONS = 1_000_000


@dataclass
class Value:
    id: int
    shape: tuple[int, ...] | None
    dtype: str
    producer: int | None = None  # node id; None for graph inputs
    input_name: str | None = None
    shape_guessed: bool = False  # an unchecked input only ever reshaped: its shape is its element count
    checked: bool = False  # a graph input whose shape the bytecode asserts (data; unchecked ones are detached weights)


@dataclass
class Node:
    id: int
    kernel: str  # the packed function called (kernel symbol or vm.builtin.*)
    inputs: list[tuple[str, Any]]  # ("value", id) | ("const", index) | ("imm", int)
    outputs: list[int]
    builtin: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Graph:
    values: dict[int, Value]
    nodes: list[Node]
    inputs: list[int]
    outputs: list[int]
    constants: list[Any]
    notes: list[str] = field(default_factory=list)

    def kernels(self) -> list[str]:
        return sorted({n.kernel for n in self.nodes if not n.builtin})

    def tensor_constants(self) -> list[int]:
        """Constant-pool indices of the tensors the graph reads (the weights)."""
        seen: list[int] = []
        for n in self.nodes:
            for kind, v in n.inputs:
                if kind == "const" and isinstance(self.constants[v], np.ndarray) and v not in seen:
                    seen.append(v)
        return seen

    def to_json(self) -> dict:
        return {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "values": {
                str(v.id): {
                    "shape": list(v.shape) if v.shape is not None else None,
                    "dtype": v.dtype,
                    "producer": v.producer,
                    "input": v.input_name,
                    **({"detached": True} if v.input_name and not v.checked else {}),
                }
                for v in self.values.values()
            },
            "nodes": [
                {
                    "id": n.id,
                    "kernel": n.kernel,
                    "builtin": n.builtin,
                    "inputs": [list(i) for i in n.inputs],
                    "outputs": n.outputs,
                    "attrs": n.attrs,
                }
                for n in self.nodes
            ],
            "constants": {str(i): _const_summary(self.constants[i]) for i in self.tensor_constants()},
            "notes": self.notes,
        }


def _const_summary(c: Any) -> dict:
    if isinstance(c, np.ndarray):
        return {"shape": list(c.shape), "dtype": str(c.dtype)}
    return {"value": repr(c)}


def _input_shape(args, consts) -> tuple[int, ...] | None:
    """Shape asserted by `vm.builtin.match_shape(reg, heap, ndim, (mode, value)*, err)`."""
    try:
        ndim = args[2].value
        dims = []
        for k in range(ndim):
            mode, val = args[3 + 2 * k], args[4 + 2 * k]
            if mode.kind != "imm" or mode.value != 0 or val.kind != "imm":
                return None  # symbolic dimension
            dims.append(val.value)
        return tuple(dims)
    except (IndexError, AttributeError, TypeError):
        return None


def build_graph(ex: Executable, entry: str = "main", signatures: dict | None = None) -> Graph:
    """Walk `entry`'s bytecode into a Graph; raises ExecutableError when the code does not fit the model.

    `signatures` (zen.compiled.static.signatures) give shapes of inputs the bytecode does not check."""
    f = ex.function(entry)
    if f.kind == "vm_tir":
        raise ExecutableError(
            f"{entry} was compiled to native code (exec_mode='compiled'): there is no bytecode to decompile",
            "libraries built with exec_mode='bytecode' (tvm.compile's default) are supported",
        )
    consts = ex.constants
    values: dict[int, Value] = {}
    regs: dict[int, Any] = {}
    written: set[int] = set()
    nodes: list[Node] = []
    notes: list[str] = []
    outputs: list[int] = []
    inputs = []
    for i, name in enumerate(f.params):
        v = Value(len(values), None, "float32", input_name=name)
        values[v.id] = v
        regs[i] = ("value", v.id)
        written.add(v.id)
        inputs.append(v.id)

    def const(i: int) -> Any:
        if not 0 <= i < len(consts):
            raise ExecutableError(f"bytecode of {entry} refers to constant {i} of {len(consts)}")
        return consts[i]

    def ref(arg) -> tuple[str, Any]:
        if arg.kind == "const":
            const(arg.value)
            return ("const", arg.value)
        if arg.kind == "imm":
            return ("imm", arg.value)
        if arg.kind == "reg":
            if arg.value == VM_REG or arg.value == VOID_REG:
                return ("special", arg.value)
            return regs.get(arg.value, ("unknown", arg.value))
        return (arg.kind, arg.value)

    if f.end - f.start > MAX_INSTRUCTIONS:
        raise ExecutableError(f"{entry} has {f.end - f.start} instructions, more than zen walks")
    for ins in ex.instructions[f.start : f.end]:
        if ins.op in ("goto", "if"):
            notes.append(f"{entry} has control flow ({ins.op}); only straight-line code is decompiled")
            continue
        if ins.op == "ret":
            r = regs.get(ins.result)
            if r and r[0] == "tuple":
                outputs = [x[1] for x in r[1] if x[0] == "value"]
            elif r and r[0] == "value":
                outputs = [r[1]]
            break
        if not 0 <= ins.func < len(ex.functions):
            raise ExecutableError(f"bytecode of {entry} calls function {ins.func} of {len(ex.functions)}")
        callee = ex.functions[ins.func].name
        a = ins.args
        if callee == "vm.builtin.match_shape" and a and a[0].kind == "reg":
            r = regs.get(a[0].value)
            if r and r[0] == "value":
                values[r[1]].shape = _input_shape(a, consts)
                values[r[1]].checked = True
            continue
        if callee == "vm.builtin.check_tensor_info" and len(a) > 2 and a[0].kind == "reg" and a[2].kind == "const":
            r = regs.get(a[0].value)
            dt = const(a[2].value)
            if r and r[0] == "value" and isinstance(dt, DType):
                values[r[1]].dtype = dt.name
            continue
        if callee in (
            "vm.builtin.alloc_storage",
            "vm.builtin.null_value",
            "vm.builtin.check_tuple_info",
            "vm.builtin.check_shape_info",
            "vm.builtin.check_prim_value_info",
        ):
            if callee == "vm.builtin.alloc_storage":
                regs[ins.dst] = ("storage", None)
            elif callee == "vm.builtin.null_value":
                regs.pop(ins.dst, None)
            continue
        if callee == "vm.builtin.alloc_tensor":
            shape = const(a[2].value) if len(a) > 3 and a[2].kind == "const" else None
            dt = const(a[3].value) if len(a) > 3 and a[3].kind == "const" else None
            v = Value(
                len(values), tuple(shape) if isinstance(shape, tuple) else None, dt.name if isinstance(dt, DType) else "float32"
            )
            values[v.id] = v
            regs[ins.dst] = ("value", v.id)
            continue
        if callee == "vm.builtin.make_tuple":
            regs[ins.dst] = ("tuple", [ref(x) for x in a])
            continue
        if callee == "vm.builtin.tuple_getitem" and len(a) == 2:
            t = ref(a[0])
            if t[0] == "tuple" and a[1].kind == "imm" and 0 <= a[1].value < len(t[1]):
                regs[ins.dst] = t[1][a[1].value]
            continue
        args = [ref(x) for x in a]
        node = Node(len(nodes), callee, [], [], builtin=callee.startswith("vm.builtin."))
        if node.builtin:
            node.inputs = args
            if ins.dst != VOID_REG:
                shape = None
                if callee == "vm.builtin.reshape" and len(args) == 2 and args[1][0] == "const":
                    shape = tuple(const(args[1][1]))
                src = values.get(args[0][1]) if args and args[0][0] == "value" else None
                if src is not None:
                    dtype = src.dtype
                else:  # a reshaped constant (position ids, a mask) keeps the constant's dtype
                    c = const(args[0][1]) if args and args[0][0] == "const" else None
                    dtype = str(c.dtype) if isinstance(c, np.ndarray) else "float32"
                v = Value(len(values), shape, dtype, producer=node.id)
                values[v.id] = v
                written.add(v.id)
                node.outputs = [v.id]
                regs[ins.dst] = ("value", v.id)
            if callee != "vm.builtin.reshape":
                notes.append(f"builtin {callee} is not decompiled")
            nodes.append(node)
            continue
        # a kernel: trailing arguments that are allocated but unwritten tensors are its outputs
        k = len(args)
        while k > 0 and args[k - 1][0] == "value" and args[k - 1][1] not in written:
            k -= 1
        node.inputs, outs = args[:k], args[k:]
        for kind, v in node.inputs:
            if kind == "value" and v not in written:
                notes.append(f"{callee} reads tensor v{v} before anything writes it")
        node.outputs = [v for _, v in outs]
        if ins.dst != VOID_REG:  # a kernel returning its result instead of writing a buffer
            v = Value(len(values), None, "float32", producer=node.id)
            values[v.id] = v
            node.outputs.append(v.id)
            regs[ins.dst] = ("value", v.id)
        for v in node.outputs:
            values[v].producer = node.id
            written.add(v)
        nodes.append(node)
    if not outputs:
        raise ExecutableError(f"{entry} returns no tensor zen can follow", "the bytecode may use unsupported constructs")
    _shapes_from_signatures(values, inputs, nodes, signatures or {})
    _dtypes_from_signatures(values, nodes, signatures or {})
    return Graph(values, nodes, inputs, outputs, consts, sorted(set(notes)))


def _shapes_from_signatures(values: dict[int, Value], inputs: list[int], nodes: list[Node], sigs: dict) -> None:
    """Shapes of unchecked inputs: from a kernel signature argument of the same name, else from the
    argument position where a kernel reads the input."""
    by_name = {}
    for args in sigs.values():
        for name, shape, dtype in args:
            by_name.setdefault(name, (shape, dtype))
    for v in inputs:
        val = values[v]
        if val.shape is not None:
            continue
        if val.input_name in by_name:
            val.shape, val.dtype = by_name[val.input_name]
            continue
        for n in nodes:
            sig = sigs.get(n.kernel)
            if sig and ("value", v) in n.inputs and len(sig) == len(n.inputs) + len(n.outputs):
                _, val.shape, val.dtype = sig[n.inputs.index(("value", v))]
                break
            if n.kernel == "vm.builtin.reshape" and n.inputs[:1] == [("value", v)] and n.outputs:
                target = values[n.outputs[0]].shape
                if target is not None:  # only reshaped: its element count is known, its own shape is not
                    val.shape = (int(np.prod(target)),)
                    val.shape_guessed = True
                    break


def _dtypes_from_signatures(values: dict[int, Value], nodes: list[Node], sigs: dict) -> None:
    """Where a kernel's signature types a tensor it reads or writes, that type is the one the kernel
    checks at entry, so it overrides what the bytecode walk assumed (float32 for a kernel that
    returns its result, an integer tensor seen only through reshapes). Reshapes pass types on."""
    for n in nodes:
        if n.builtin:
            if n.kernel == "vm.builtin.reshape" and n.inputs and n.inputs[0][0] == "value" and n.outputs:
                values[n.outputs[0]].dtype = values[n.inputs[0][1]].dtype
            continue
        sig = sigs.get(n.kernel)
        if not sig or len(sig) != len(n.inputs) + len(n.outputs):
            continue
        refs = list(n.inputs) + [("value", o) for o in n.outputs]
        for (kind, v), (_, shape, dtype) in zip(refs, sig):
            if kind == "value" and v in values and (values[v].shape is None or tuple(values[v].shape) == tuple(shape)):
                values[v].dtype = dtype
