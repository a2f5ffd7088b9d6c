"""Deployment forms: the state a model holds beyond plain parameters and buffers, found and named.

Why this exists: the eager reader reads each module's `_parameters`, `_buffers` and `_modules`. Models
as production deploys them keep state elsewhere, and a reader that looks only there says "complete" while
weights are missing: the worst answer a forensic tool can give. The contract is that a case is complete
only when everything the model's own `state_dict()` would hold was read. This module walks the chosen
model and records, for each thing the reader did not read, the object, its type and why (`Unread`):

* a child module that could not be read (its subtree is missing, not "absent");
* TorchScript modules and other C++ objects (`torch.ScriptModule`, `torch.ScriptObject`: packed quantized
  weights), whose state lives in C++ structures;
* modules whose class writes its own state_dict (`_save_to_state_dict` overridden: bitsandbytes, quanto,
  torch.ao quantized modules) or that hold state-dict hooks: their state_dict has entries beyond the
  structural ones;
* tensor subclasses (`__tensor_flatten__`: torchao, quanto): their bytes are in inner tensors, and the
  outer TensorImpl has no storage of its own;
* Parameter subclasses with state in attributes (bitsandbytes `Int8Params.SCB`, `Params4bit.quant_state`).

It executes nothing: classes are inspected through their type dicts in the image.
"""

from __future__ import annotations

from dataclasses import dataclass

from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import dict_get, read_dict
from zen.cpython.readers.instances import read_instance
from zen.frontends.pytorch.modules import MODULE_BASE, ModuleIndex
from zen.frontends.pytorch.mr import plain
from zen.frontends.pytorch.subclasses import TENSOR_TYPES, ClassLookup, expand
from zen.runtime.errors import ZenError

PLAIN_TENSORS = frozenset({"torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"})
CPP_OBJECTS = frozenset({"torch.ScriptObject", "torch._C.ScriptObject", "torch.ScriptModule", "torch._C.ScriptModule"})
SCRIPT_MODULE = "torch.jit._script.ScriptModule"
# state-dict hooks that only annotate `state_dict._metadata` (no entries added or changed)
METADATA_HOOKS = frozenset({"torch.nn.utils.spectral_norm.SpectralNormStateDictHook"})
# classes whose `_save_to_state_dict` writes its weight's parts (read by `subclasses.expand`) and its registered
# parameters and buffers, nothing else (read in each library's source): quanto writes `weight._data`/`_scale`,
# bitsandbytes `SCB`/`weight_format` (8-bit, from Int8Params) and the quant_state's tensors (4-bit)
SAVES_PARTS = frozenset({"optimum.quanto.nn.qmodule.QModuleMixin", "bitsandbytes.nn.modules.Linear8bitLt",
                         "bitsandbytes.nn.modules.Linear4bit"})  # fmt: skip
MAX_LISTED = 8  # attribute names listed in one problem
# torch.ao quantized Linears: their state_dict is the packed (weight, bias) and plain attributes (quantized.packed)
PACKED_PARAMS = "torch.ao.nn.quantized.modules.linear.LinearPackedParams"
QUANTIZED_LINEAR = "torch.ao.nn.quantized.modules.linear.Linear"
QUANTIZED_CONV = "torch.ao.nn.quantized.modules.conv._ConvNd"  # its state_dict: weight, bias, scale, zero_point
EMBEDDING_PACKED = "torch.ao.nn.quantized.modules.embedding_ops.EmbeddingPackedParams"  # dtype, _packed_weight
# classes whose `_save_to_state_dict` adds only tensors made from plain attributes the reader records (read in
# torch's source): quantized add/mul/cat modules write `scale` and `zero_point` from their float and int attributes
PLAIN_ATTRIBUTES = frozenset({"torch.ao.nn.quantized.modules.functional_modules.QFunctional"})


@dataclass
class Unread:
    """State of the model that was not read: where (module path or state_dict key), what and why."""

    where: str
    type: str
    address: str
    why: str

    def problem(self) -> str:
        return f"{self.where or 'the root'} ({self.type} at {self.address}) not read: {self.why}"

    def to_json(self) -> dict[str, str]:
        return {"where": self.where, "type": self.type, "address": self.address, "why": self.why}


def audit(ip: Interpreter, reader, index: ModuleIndex, root: int, slots: list,
          tensor_types: set[int]) -> tuple[list[Unread], list]:  # fmt: skip
    """(everything under `root` the reader did not read, the slots of tensors read in parts). Subclass tensors
    are read through their parts (`subclasses.expand`); what cannot be read so is named."""
    look = ClassLookup.shared(ip)
    out: list[Unread] = []
    parts: list = []
    in_parts: set[str] = set()  # keys of subclass tensors whose state was read in parts
    seen: set[int] = set()
    expanded: dict[int, str] = {}  # objects whose parts were read -> their key (shared by every expansion of this model)
    for s in slots:
        if s.meta is None or s.addr in seen or s.record.tied_to:
            continue
        seen.add(s.addr)
        got = _tensor_parts(ip, reader, look, s, tensor_types, expanded)
        if isinstance(got, Unread):
            out.append(got)
        elif got is not None:
            parts += got
            in_parts.add(s.key)
    from zen.frontends.pytorch.quantized.packed import packed_slots

    packed, read, failed = packed_slots(ip, reader, index, root)
    parts += packed
    for path, node in index.walk(root):
        out += _module_unread(ip, index, look, path, node, in_parts, read, failed)
    return out, parts


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _module_unread(ip, index: ModuleIndex, look: ClassLookup, path: str, node, in_parts: set[str], packed: set[str],
                   failed: dict[str, str]) -> list[Unread]:  # fmt: skip
    out: list[Unread] = []
    t = node.type
    addr = f"{node.addr:#x}"
    if SCRIPT_MODULE in look.mro_names(t):  # one problem: its `_c`, wrappers and hooks all stand for the C++ module
        return [Unread(path, t.full_name, addr, "a TorchScript module: its parameters, buffers and submodules are held "
                       "by a C++ torch::jit::Module, which was not read (the problems say why)")]  # fmt: skip
    for name, c in node.children:
        if c and c not in index.nodes:
            why = index.errors.get(c) or "not readable as an nn.Module"
            out.append(Unread(_at(path, name), _type_name(ip, c), f"{c:#x}", f"this submodule could not be read ({why}): "
                              "its parameters, buffers and submodules are missing"))  # fmt: skip
    definer = look.definer(t, "_save_to_state_dict", (MODULE_BASE,))
    if definer in SAVES_PARTS and _at(path, "weight") in in_parts:
        definer = None  # its own state_dict holds its weight's parts and its buffers: all read
    if definer in PLAIN_ATTRIBUTES:
        definer = None  # its extra entries are its plain attributes, recorded with the module
    if (definer == PACKED_PARAMS and path in packed) or (definer == QUANTIZED_LINEAR and _at(path, "_packed_params") in packed) \
            or (definer in (QUANTIZED_CONV, EMBEDDING_PACKED) and path in packed):  # fmt: skip
        definer = None  # the packed weight and bias, read (quantized.packed/.conv), and plain attributes (scale, zero_point)
    if definer is not None:
        out.append(Unread(path, t.full_name, addr, f"its class writes its own state_dict ({definer}._save_to_state_dict): "
                          "entries beyond its registered parameters and buffers were not read"))  # fmt: skip
    for attr in ("_state_dict_hooks", "_state_dict_pre_hooks"):
        hooks = _hook_types(ip, node.attrs.get(attr))
        odd = [h for h in hooks if h not in METADATA_HOOKS]
        if odd:
            out.append(Unread(path, t.full_name, addr, f"it holds state-dict hooks ({attr}: {', '.join(odd[:MAX_LISTED])}), "
                              "code in the image that may add or change entries; zen runs no recovered code"))  # fmt: skip
    for name, v in node.attrs.items():
        tn = _type_name(ip, v)
        if name in ("_packed_params", "_packed_weight") and path in failed:
            out.append(Unread(_at(path, name), tn, f"{v:#x}", failed[path]))
        elif name in ("_packed_params", "_packed_weight") and path in packed:
            continue
        elif tn in CPP_OBJECTS:
            out.append(Unread(_at(path, name), tn, f"{v:#x}", "a C++ object (TorchScript or packed quantized weights): "
                              "its tensors live in C++ structures zen does not read yet"))  # fmt: skip
    for name, tn in node.wrapped.items():
        out.append(Unread(_at(path, name), tn, f"{node.attrs[name]:#x}", "held in a wrapper that is not a dict; "
                          "the parameters, buffers or submodules it stands for were not read"))  # fmt: skip
    return out


def _hook_types(ip: Interpreter, d: int | None) -> list[str]:
    if d is None or ip.is_none(d):
        return []
    try:
        return [_type_name(ip, v) for _, v in read_dict(ip, d)]
    except ZenError as exc:
        return [f"unreadable ({exc})"]


def _type_name(ip: Interpreter, addr: int) -> str:
    try:
        return ip.type_name(addr)
    except ZenError:
        return "?"


def _tensor_parts(ip: Interpreter, reader, look: ClassLookup, slot, tensor_types: set[int],
                  expanded: dict[int, str]) -> Unread | list | None:  # fmt: skip
    """None for a plain tensor; the part slots of a subclass read in parts; an Unread when that failed."""
    meta, rec = slot.meta, slot.record
    if meta.python_type in PLAIN_TENSORS:
        return None
    where = (slot.key, meta.python_type, f"{slot.addr:#x}")
    try:
        t = ip.type_info(ip.type_of(slot.addr))
        attrs = read_instance(ip, slot.addr).attrs
    except ZenError as exc:
        return Unread(*where, f"a tensor subclass whose attributes are unreadable ({exc})")
    wrapper = look.definer(t, "__tensor_flatten__", TENSOR_TYPES) is not None
    if not wrapper and not attrs:
        return None  # a subclass with nothing beside its data
    # a Parameter subclass with only flags (bitsandbytes' Int8Params once its forward moved SCB into the module's
    # state: CB=None, SCB=None) is still rebuilt as its class: its library's forward reads those attributes
    try:
        got = expand(ip, reader, slot, tensor_types, wrapper, seen=expanded)
    except ZenError as exc:
        if wrapper:
            rec.status, rec.note = "subclass", f"held in the inner tensors of a {meta.python_type} tensor subclass"
        return Unread(*where, f"its parts could not be read: {exc}")
    rec.subclass = {"cls": f"{t.module}:{t.qualname}", "wrapper": wrapper}
    return got


OPTIMIZED_MODULE = "torch._dynamo.eval_frame.OptimizedModule"
MAX_BACKEND_HOPS = 8


def unwrap_compiled(ip: Interpreter, index: ModuleIndex, addr: int) -> tuple[int, dict] | None:
    """(address of the eager module, what the compilation was) when `addr` is a `torch.compile` wrapper
    (dynamo's `OptimizedModule`): the model is its `_orig_mod`, keyed as in eager. The backend is read from
    the wrapper's `dynamo_ctx.callback` chain (`_torchdynamo_orig_backend` links, bounded) down to the
    backend object, whose `_compiler_name`/`__name__` names it and whose `config` holds the mode's options."""
    node = index.nodes.get(addr)
    if node is None or node.type.full_name != OPTIMIZED_MODULE:
        return None
    inner = dict(node.children).get("_orig_mod")
    if not inner or inner not in index.nodes:
        return None
    info: dict = {"form": "torch.compile", "wrapper": OPTIMIZED_MODULE, "wrapper_address": f"{addr:#x}"}
    try:
        info.update(_backend(ip, node.attrs.get("dynamo_ctx")))
    except ZenError as exc:
        info["backend_error"] = str(exc)
    return inner, info


def _attr(ip: Interpreter, obj: int | None, name: str) -> int | None:
    if obj is None or ip.is_none(obj):
        return None
    return read_instance(ip, obj).attrs.get(name)


def _backend(ip: Interpreter, ctx: int | None) -> dict:
    obj = _attr(ip, ctx, "callback")
    for _ in range(MAX_BACKEND_HOPS):
        nxt = _attr(ip, obj, "_torchdynamo_orig_backend") if obj is not None and ip.kind(obj) == "instance" else None
        if nxt is None:
            break
        obj = nxt
    if obj is None:
        return {}
    out: dict = {"backend_type": _type_name(ip, obj)}
    if ip.kind(obj) == "function":
        from zen.cpython.readers.functions import read_function

        out["backend"] = read_function(ip, obj).qualname
        return out
    attrs = read_instance(ip, obj).attrs
    t = ip.type_info(ip.type_of(obj))
    for name in ("_compiler_name", "__name__", "compiler_name"):
        v = attrs.get(name)
        if v is None and t.dict_addr:  # `_TorchCompileInductorWrapper.compiler_name` is a class attribute
            v = dict_get(ip, t.dict_addr, name)
        if v is not None and ip.kind(v) == "str":
            out["backend"] = ip.str(v)
            break
    cfg = attrs.get("config")
    if cfg is not None and ip.kind(cfg) == "dict":
        out["options"] = {ip.str(k): repr(ip.value(v, 2)) for k, v in read_dict(ip, cfg)[:64]
                          if ip.kind(k) == "str" and plain(ip, v)}  # fmt: skip
    return out


ACCELERATE_HOOK_STATE = ("_hf_hook", "_old_forward", "forward")


def eager_state(mr) -> None:
    """Modules compiled in place (`Module.compile()` sets `_compiled_call_impl` to dynamo's wrapper): the
    rebuilt model is the eager one, so the wrapper is left out of the state reuse restores (None, as an
    uncompiled module has) and the compilation is recorded in `mr.deployment`. Likewise accelerate's hooks
    (`_hf_hook`, the saved `_old_forward` and the instance `forward` that calls through the hook): with them the
    rebuilt model would fetch offloaded weights from the deployment's files at each forward; without them it
    runs on the weights in its package."""
    compiled, hooked = [], []
    for m in mr.modules:
        if "_hf_hook" in m.state:
            for name in ACCELERATE_HOOK_STATE:
                m.state.pop(name, None)
            hooked.append(m.path)
        v = m.state.get("_compiled_call_impl")
        if v is not None and v != {"lit": "None"}:
            m.state["_compiled_call_impl"] = {"lit": "None"}
            compiled.append(m.path)
    if compiled:
        mr.deployment = {"form": "torch.compile", **mr.deployment, "compiled_in_place": compiled,
                         "how": "Module.compile() (the module's _compiled_call_impl)"}  # fmt: skip
    if hooked:
        off = sorted({t.offload.get("from", "") for t in mr.tensors if t.offload})
        mr.deployment = {"form": "accelerate", **mr.deployment, "accelerate_hooks_removed": hooked[:1000],
                         "offloaded_from": off}  # fmt: skip


ORT_SESSION = "onnxruntime.capi.onnxruntime_inference_collection.Session"


def ort_session_types(heap) -> set[int]:
    """ONNX Runtime's Python session classes in the image (empty when onnxruntime is not loaded)."""
    return {t.addr for t in heap.subclasses_of(ORT_SESSION)}


def ort_sessions(ip: Interpreter, found: dict, types: set[int]) -> list[str]:
    """One line per ONNX Runtime session alive in the image: its class, address and the model file it loaded.
    Its weights live in ONNX Runtime's C++ session (`_sess`), outside any Python object zen reads."""
    out = []
    for t, addrs in found.items():
        if t not in types:
            continue
        for a in addrs.tolist()[:MAX_LISTED]:
            where = ""
            try:
                p = read_instance(ip, a).attrs.get("_model_path")
                if p is not None and ip.kind(p) == "str":
                    where = f", loaded from {ip.str(p)!r}"
            except ZenError:
                pass
            out.append(f"{_type_name(ip, a)} at {a:#x}{where}")
    return out
