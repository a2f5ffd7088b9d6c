"""The Keras recovery stage of `zen recover`: versions and profile, layers, the chosen root, its MR and variables.

`zen.recover.run` runs it when the image holds a Keras model (see `framework_of`) and writes the case from what it
returns, exactly as for a PyTorch model: the case contract is the front end's output, not its internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import dict_get
from zen.cpython.readers.modules import read_module
from zen.frontends.common import NoModelFound, references
from zen.frontends.keras.dataflow import call_dataflow, merge
from zen.frontends.keras.graph import functional_graphs
from zen.frontends.keras.layers import LAYER_BASE, TF_VARIABLE_BASE, VARIABLE_BASE, LayerIndex
from zen.frontends.keras.mr import KerasSlot, VariableReader, build_mr, root_record, summarize
from zen.frontends.keras.profile import TFProfile, load_tf_profile
from zen.frontends.keras.tensors import TFTensorReader
from zen.represent.mr import ModelMR, RootRecord
from zen.runtime.errors import ObjectError, ZenError

EAGER_BASE = "tensorflow.python.framework.ops._EagerTensorBase"
TF_RESOURCE_VARIABLE = "tensorflow.python.ops.resource_variable_ops.BaseResourceVariable"


@dataclass
class KerasModel:
    """What the stage hands back to `zen.recover.run`."""

    mr: ModelMR
    slots: list[KerasSlot]
    extra: list[KerasSlot]
    reader: TFTensorReader
    index: LayerIndex
    found: dict
    chosen: RootRecord
    how: str
    versions: dict[str, dict] = field(default_factory=dict)  # manifest sections
    profile: TFProfile | None = None


def module_version(ip: Interpreter, heap: Heap, names: tuple[str, ...]) -> str | None:
    """`__version__` of the first readable module of `names` (a small submodule when the big one is damaged)."""
    mods = heap.sys_modules()
    for name in names:
        if name not in mods:
            continue
        try:
            v = dict_get(ip, read_module(ip, mods[name]).dict, "__version__")
        except ObjectError:
            continue
        if v is not None and ip.kind(v) == "str":
            return ip.str(v)
    return None


def versions(ip: Interpreter, heap: Heap) -> tuple[str | None, str | None]:
    tf = module_version(ip, heap, ("tensorflow", "tensorflow.python.framework.versions"))
    keras = module_version(ip, heap, ("keras", "keras.src.version"))
    return tf, keras


def keras_model(ip: Interpreter, heap: Heap, choice: str | None, description: str) -> KerasModel:
    """Find the Keras models of the image and build the MR of the chosen one (NoModelFound: exit 6)."""
    tf_v, keras_v = versions(ip, heap)
    if tf_v is None:
        raise ZenError("Keras is imported but TensorFlow's version is not readable in the image"
                       + ("" if "tensorflow" in heap.sys_modules() else " (TensorFlow is not imported: another "
                          "Keras backend? zen reads Keras on the TensorFlow backend)"))  # fmt: skip
    prof = load_tf_profile(".".join(tf_v.split(".")[:2]), tf_v)  # exit 4 with how to calibrate
    reader = TFTensorReader(ip, prof)
    layer_types = {t.addr for t in heap.subclasses_of(LAYER_BASE)}
    var_types = {t.addr for t in heap.subclasses_of(VARIABLE_BASE)}
    code_types = {ip.wk.types["function"], ip.wk.types["code"]}
    found = heap.instances_of_types(layer_types | var_types | code_types)
    index = LayerIndex(ip, heap, found)
    index.link()
    root_addrs = index.roots()
    if not root_addrs:
        what = _what_was_found(ip, heap, tf_v, keras_v, found, var_types)
        raise NoModelFound(f"no Keras models found in {description}: {what}",
                           "`zen info` shows what the process has loaded; `zen objects --type NAME` lists objects")  # fmt: skip
    if var_types and not any(t.addr in var_types for t in heap.subclasses_of(TF_VARIABLE_BASE)):
        raise ZenError("the Keras variables in this image are not TensorFlow variables (another Keras backend)",
                       "zen reads Keras models on the TensorFlow backend")  # fmt: skip
    vars_ = VariableReader(ip, reader)
    refs = references(ip, heap, set(root_addrs))
    roots = [root_record(index, vars_, a, refs.get(a, [])) for a in root_addrs]
    roots.sort(key=lambda r: (not r.referenced_from, -r.parameter_elements, -r.modules, r.address))
    for i, r in enumerate(roots, 1):
        r.rank = i
    chosen, how = select_root(index, vars_, roots, refs, choice)
    mr, slots, extra = build_mr(ip, index, vars_, chosen, roots)
    try:
        mr.graph.update(functional_graphs(ip, index, int(chosen.address, 16)))
    except ZenError as exc:
        mr.problems.append(f"functional graph not recovered: {exc}")
    try:
        merge(mr.graph, call_dataflow(ip, index, int(chosen.address, 16)))
    except ZenError as exc:
        mr.problems.append(f"data-flow edges of call not recovered: {exc}")
    mr.summary = summarize(mr)
    sections = {"torch": {"version": None}, "tensorflow": {"version": tf_v}, "keras": {"version": keras_v}}
    return KerasModel(mr, slots, extra, reader, index, found, chosen, how, sections, prof)


def select_root(index: LayerIndex, vars_: VariableReader, roots: list[RootRecord], refs: dict,
                choice: str | None) -> tuple[RootRecord, str]:  # fmt: skip
    """`--model` as for PyTorch: address, #RANK or a referencing name; an address may also name any layer."""
    if choice is None:
        return roots[0], "rank 1 (most likely model)"
    c = choice.strip()
    if c.startswith("#") and c[1:].isdigit() and 1 <= int(c[1:]) <= len(roots):
        return roots[int(c[1:]) - 1], f"--model {c}"
    for r in roots:
        if (
            c.lower() in (r.address, hex(int(r.address, 16)))
            or c in r.referenced_from
            or any(x.endswith("." + c) or x.endswith(": " + c) for x in r.referenced_from)
        ):
            return r, f"--model {c}"
    try:
        addr = int(c, 16)
    except ValueError:
        addr = None
    if addr in index.nodes:  # a sublayer (a backbone inside a bigger model)
        return root_record(index, vars_, addr, refs.get(addr, [])), f"--model {c}"
    raise ZenError(f"--model {choice!r} matches no Keras model root",
                   "use a root's address, #RANK, or a name from `referenced_from`")  # fmt: skip


def keras_roots_match(ip: Interpreter, heap: Heap, choice: str) -> bool:
    """Whether `--model ADDRESS` names a Keras layer (lets `zen recover` pick the front end in a mixed process)."""
    try:
        addr = int(choice, 16)
        layer_types = {t.addr for t in heap.subclasses_of(LAYER_BASE)}
        return ip.type_of(addr) in layer_types
    except (ValueError, ZenError):
        return False


def _what_was_found(ip: Interpreter, heap: Heap, tf_v: str | None, keras_v: str | None, found: dict,
                    var_types: set[int]) -> str:  # fmt: skip
    """One sentence of evidence for the exit-6 message: versions and the TF objects that are alive."""
    parts = [f"TensorFlow {tf_v}" + (f" and Keras {keras_v}" if keras_v else "") + " are loaded but no Keras layer or "
             "model instance is alive"]  # fmt: skip
    n_vars = sum(len(found.get(t, [])) for t in var_types)
    counts = heap.census([t.addr for base in (EAGER_BASE, TF_RESOURCE_VARIABLE) for t in heap.subclasses_of(base)])
    eager = sum(n for t, n in counts.items() if t in {x.addr for x in heap.subclasses_of(EAGER_BASE)})
    tfvars = sum(counts.values()) - eager
    parts.append(f"found {eager} eager tensor(s), {tfvars} TF variable(s), {n_vars} Keras variable(s)")
    return "; ".join(parts)
