"""TorchScript models in recovery: which roots are scripted, their C++ trees, and their MR.

A process serving a `torch.jit.load`ed archive holds a Python `RecursiveScriptModule` for every submodule, whose
`_parameters` and `_modules` are wrappers around the C++ module: without the C++ tree each wrapper looks like a root
of its own, with no tensors. Here every scripted root is read through its `_c` (`reader.JitReader`), the wrappers of
submodules inside another scripted root stop being roots, and each scripted root is counted by its C++ tree, so
ranking sees what the model is. The chosen scripted root's MR is built by the eager `build_mr` over the C++ tree
(`reader.JitIndex`, tensors named by TensorImpl), with TorchScript's own class names demangled to the eager ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.forms import Unread
from zen.frontends.pytorch.modules import ModuleIndex
from zen.frontends.pytorch.mr import ModelLimits, build_mr, root_record
from zen.frontends.pytorch.profile import TorchProfile
from zen.frontends.pytorch.subclasses import ClassLookup
from zen.frontends.pytorch.tensors import TensorReader
from zen.frontends.pytorch.torchscript.eager import eager_link
from zen.frontends.pytorch.torchscript.graphs import GraphReader, has_graph_layout, script_dataflow
from zen.frontends.pytorch.torchscript.ir_types import has_type_layout
from zen.frontends.pytorch.torchscript.reader import SCRIPT_MODULE, ImplReader, JitIndex, JitLayoutMissing, JitNode, JitReader
from zen.frontends.pytorch.torchscript.sources import SourceReader, has_source_layout, needed_files
from zen.frontends.pytorch.torchscript.trace_ir import TracePrinter, tensor_constant
from zen.runtime.errors import ZenError


@dataclass
class ScriptModels:
    """The scripted roots of an image: Python wrapper address -> C++ Object, and the C++ trees below them."""

    reader: JitReader | None
    index: JitIndex | None
    tensors: ImplReader
    objects: dict[int, int] = field(default_factory=dict)
    wrappers: dict[int, int] = field(default_factory=dict)  # C++ Object -> its Python wrapper (every scripted module)
    problems: list[str] = field(default_factory=list)  # scripted roots that could not be read, and why


def is_scripted(ip: Interpreter, index: ModuleIndex, addr: int) -> bool:
    node = index.nodes.get(addr)
    return node is not None and SCRIPT_MODULE in ClassLookup.shared(ip).mro_names(node.type)


def script_models(ip: Interpreter, index: ModuleIndex, tensors: TensorReader, tp: TorchProfile,
                  roots: list[int]) -> ScriptModels | None:  # fmt: skip
    """Read every scripted root's C++ tree; None when no root is scripted."""
    scripted = [a for a in roots if is_scripted(ip, index, a)]
    if not scripted:
        return None
    out = ScriptModels(None, None, ImplReader(tensors))
    try:
        out.reader = JitReader(ip, tp)
    except JitLayoutMissing as exc:
        out.problems.append(f"{exc.message} ({exc.hint})")
        return out
    for a in scripted:
        try:
            out.objects[a] = out.reader.object_of(a)
        except ZenError as exc:
            out.problems.append(f"TorchScript module at {a:#x}: its C++ module could not be read: {exc}")
    for a in index.nodes:  # every wrapper, submodules' too: `eager.link_classes` needs them
        if a in out.objects or not is_scripted(ip, index, a):
            continue
        try:
            out.wrappers.setdefault(out.reader.object_of(a), a)
        except ZenError:
            pass  # a wrapper whose module cannot be read links nothing; its module is judged by the C++ walk
    out.wrappers.update({obj: a for a, obj in out.objects.items()})
    out.index = JitIndex(out.reader, list(out.objects.values()))
    for a, obj in list(out.objects.items()):  # a root whose own Object is unreadable stays unread (the audit names it)
        if obj not in out.index.nodes:
            out.problems.append(f"TorchScript module at {a:#x}: its C++ module could not be read: "
                                f"{out.index.errors.get(obj, 'not reached')}")  # fmt: skip
            del out.objects[a]
    return out


def script_roots(sm: ScriptModels, roots: list, refs: dict[int, list[str]]) -> list:
    """The root records with scripted roots counted by their C++ trees, and the wrappers of submodules of another
    scripted root dropped (they are not models of their own: their C++ module sits inside another's tree)."""
    if sm.index is None:
        return roots
    below: set[int] = set()
    for obj in set(sm.objects.values()):
        below |= {n.addr for _, n in sm.index.walk(obj)[1:]}
    out = []
    for r in roots:
        a = int(r.address, 16)
        obj = sm.objects.get(a)
        if obj is None or obj not in sm.index.nodes:
            out.append(r)
            continue
        if obj in below or a in sm.reader.inner_wrappers:
            continue
        rec = root_record(sm.index, sm.tensors, obj, refs.get(a, r.referenced_from))
        rec.address, rec.served_by = r.address, r.served_by
        out.append(rec)
    return out


def script_mr(ip: Interpreter, sm: ScriptModels, chosen, roots: list, limits: ModelLimits,
              sys_modules: dict[str, int]) -> tuple:  # fmt: skip
    """(mr, slots, deployment) of a scripted root: the eager MR builder over the C++ tree, then what only the C++ tree
    says (training flags, plain attributes and constants as each module's state, what was not read), and the Python
    classes it was scripted from where the process proves them (`eager`)."""
    obj = sm.objects[int(chosen.address, 16)]
    inner = root_record(sm.index, sm.tensors, obj, chosen.referenced_from)
    inner.rank, inner.served_by = chosen.rank, chosen.served_by
    mr, slots = build_mr(ip, sm.index, sm.tensors, inner, roots, set(), limits)
    mr.root = chosen  # the Python wrapper: what the process serves and references
    walk = dict(sm.index.walk(obj))
    paths = {n.addr: p for p, n in walk.items()}
    state_key: dict[int, str] = {}
    for s in slots:
        state_key.setdefault(s.addr, s.key)  # a tied tensor keeps its first key
    unread: list[Unread] = []
    containers: dict[str, str] = {}
    for rec in mr.modules:
        node = walk.get(rec.path)
        if not isinstance(node, JitNode):
            continue
        training = node.values.get("training")
        rec.training = training if isinstance(training, bool) else None
        plain = {**node.values, **node.constants}
        rec.hyperparameters = {k: repr(v) for k, v in plain.items() if not k.startswith("_") and k != "training"}
        rec.state = {k: _encode(v) for k, v in plain.items()}
        rec.parameter_keys = {n: state_key.get(a) if a else None for n, a in node.parameters}
        rec.buffer_keys = {n: state_key.get(a) if a else None for n, a in node.buffers}
        rec.child_paths = {n: paths.get(c) if c else None for n, c in node.children}
        rec.state.update({k: {"unsupported": why} for k, why in {**node.containers, **node.other}.items()})
        rec.unregistered_tensors = list(node.unregistered)
        containers.update({_at(rec.path, k): v for k, v in node.containers.items()})
        unread += [Unread(_at(rec.path, k), node.type.script_name, f"{node.addr:#x}", f"{why}: it may hold state zen "
                          "did not read") for k, why in node.other.items()]  # fmt: skip
    for addr, why in sm.index.errors.items():
        if addr in {c for n in walk.values() for _, c in n.children}:
            unread.append(Unread("", "torch::jit::Module", f"{addr:#x}", f"a TorchScript submodule not read: {why}"))
    mr.unread = [u.to_json() for u in unread]
    mr.problems += [u.problem() for u in unread]
    root_node = walk[""]
    deployed = {"form": "torchscript", "script_class": root_node.type.script_name, "object": f"{obj:#x}",
                "wrapper": chosen.address, "containers_not_decoded": dict(sorted(containers.items())[:200])}  # fmt: skip
    mr.deployment = deployed
    if has_graph_layout(sm.reader):  # the eager path reads these from bytecode (run.py); TorchScript has graphs
        mr.graph.update(script_dataflow(sm.reader, walk))
    objects = {path: n.addr for path, n in walk.items() if isinstance(n, JitNode)}
    links = eager_link(ip, sm.wrappers, objects, sys_modules, mr)
    if links and not sm.reader.decodes:  # constants unread: a rebuilt Conv2d would have no stride
        deployed["eager"].update(complete=False, why="the torch layout profile has no TorchScript constants and "
                                 "tuples layout: recalibrate it with `zen profile torch`")  # fmt: skip
    deployed["eager"]["addresses"] = {p: f"{a:#x}" for p, a in sorted(links.items())[:1000]}
    if not deployed["eager"]["complete"]:
        deployed["torchscript"] = _code(ip, sm, walk)
    return mr, slots, deployed


def _code(ip: Interpreter, sm: ScriptModels, walk: dict) -> dict:
    """The TorchScript code files the model's classes need (`sources`), with each module's TorchScript class and
    constants: what `zen reuse` writes a TorchScript archive from. Files not found are listed, never guessed."""
    nodes = {p: n for p, n in walk.items() if isinstance(n, JitNode)}
    out: dict = {"classes": {p: n.type.script_name for p, n in nodes.items()},
                 "constants": {p: sorted(n.constants) for p, n in nodes.items() if n.constants}}  # fmt: skip
    if not has_source_layout(sm.reader):
        return {**out, "files": {}, "missing": [], "conflicts": [], "problems": [
            "the torch layout profile has no TorchScript code layout: recalibrate it with `zen profile torch`"]}  # fmt: skip
    code = SourceReader(sm.reader).code([ip.ptr(n.addr + sm.reader.tp.jitobject.type) for n in nodes.values()])
    need = needed_files(sorted(set(out["classes"].values())), code.files)
    out.update(files={f: code.files[f] for f in need if f in code.files}, missing=[f for f in need if f not in code.files],
               conflicts=code.conflicts, problems=code.problems)  # fmt: skip
    out["tensor_constants"] = {}
    for i, impl in code.tensor_constants.items():  # CONSTANTS.cN of the code, read from their graph nodes
        try:
            out["tensor_constants"][f"c{i}"] = tensor_constant(sm.tensors, impl)
        except ZenError as exc:
            out["problems"].append(f"CONSTANTS.c{i} not read: {exc}")
    out["problems"] += [f"CONSTANTS.c{i}: two different tensors claim it" for i in code.constant_conflicts]
    if not out["files"] and not out["conflicts"] and not out["problems"]:  # traced here (no code text at all, and
        out["trace"] = _trace(sm, walk)  # no damaged walk that might have hidden it): the graphs are printed again
    return out


def _trace(sm: ScriptModels, walk: dict) -> dict:
    """IR plans of the model's classes from their forward graphs (`trace_ir`), or why there are none."""
    if not (has_graph_layout(sm.reader) and has_type_layout(sm.reader)):
        return {
            "plans": {},
            "refused": {},
            "problems": [
                "the torch layout profile has no TorchScript graph and type layout: recalibrate it with `zen profile torch`"
            ],
        }
    try:
        printer = TracePrinter(GraphReader(sm.reader), sm.tensors, walk)
    except ZenError as exc:
        return {"plans": {}, "refused": {}, "problems": [f"op names cannot be read: {exc}"]}
    plans, refused = printer.plans(walk)
    return {"plans": plans, "refused": refused, "problems": [], "method": TRACE_METHOD}


TRACE_METHOD = ("each class's forward graph read from the image (op names from libtorch_cpu's interned strings, value "
                "types, constants) and printed as TorchScript IR with every child call inlined; zen reuse has torch print "
                "it as code")  # fmt: skip


def _encode(v: object) -> dict:
    """A decoded TorchScript value in the state encoding (`zen.cpython.encode.snapshot`) the rebuild decodes."""
    if isinstance(v, tuple):
        return {"tuple": [_encode(x) for x in v]}
    if isinstance(v, list):
        return {"list": [_encode(x) for x in v]}
    return {"lit": repr(v)}


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def eager_classes(rt, mr) -> dict[str, int]:
    """Class name -> the one Python class of that name in the image, for the classes of a TorchScript model's modules.

    The code stage's seeds: a model scripted or traced in this process was compiled from these classes (TorchScript
    names them after them), so their code is the model's programmatic representation. A `jit.load`ed model's classes
    are present only where the process imported them; names with no class, or with several, are left out, and
    `mr.deployment["code_from"]` says which were used. The TorchScript code itself is not read yet."""
    wanted = {m.cls for m in mr.modules}
    found: dict[str, list[int]] = {}
    for a in rt.type_addrs:
        t = rt.type(a)
        if t is not None and t.full_name in wanted:
            found.setdefault(t.full_name, []).append(a)
    out = {n: addrs[0] for n, addrs in found.items() if len(addrs) == 1}
    mr.deployment["code_from"] = {
        "what": "the Python classes of the same names in the image (TorchScript's own code is not read yet)",
        "found": sorted(out), "missing": sorted(wanted - set(found)),
        "ambiguous": sorted(n for n, a in found.items() if len(a) > 1),
    }  # fmt: skip
    return out
