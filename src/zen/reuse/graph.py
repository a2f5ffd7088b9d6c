"""Rebuild the model object graph from the MR (ZEN §IV-D; AiP §3.4). Needs torch. Reuse only.

No constructor is called, so no constructor argument has to be guessed: every module is created
with `cls.__new__(cls)` and given its recovered `__dict__`: the encoded instance attributes
(hyper-parameters, config objects, hook dicts, training flag) decoded through the patch's name
maps, and, rebuilt structurally, `_parameters`, `_buffers` (with `_non_persistent_buffers_set`)
and `_modules` in their registration order. Tensors come from the case's safetensors files:

* one `Parameter` per tensor object of the image, so tied weights stay tied (same object);
* every tensor gets its own freshly allocated memory (as in the deployed process): views into the
  safetensors file sit at arbitrary alignments, which changes CPU kernels' rounding;
* strides are restored (`empty_strided`) for tensors that were not C-contiguous in the image;
* tensors on an accelerator in the image are loaded on the CPU (the report says so);
* a tensor whose data was missing from the image is filled with NaN (zeros for integer types)
  and listed in the report: outputs that depend on it cannot be trusted;
* a tensor subclass (torchao, quanto, bitsandbytes) is rebuilt as an object of its class around its parts
  (`TensorFactory._subclass`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zen.patch.decode import Decoder, Resolver, ReuseError, Unrecovered
from zen.represent.mr import ModelMR, TensorRecord
from zen.reuse.packed import packed_paths, repack

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
              "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_state_dict_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")  # fmt: skip


@dataclass
class GraphReport:
    modules: int = 0
    parameters: int = 0
    buffers: int = 0
    extra_tensors: int = 0
    missing_tensors: list[str] = field(default_factory=list)
    moved_to_cpu: list[str] = field(default_factory=list)
    unrecovered: list[str] = field(default_factory=list)
    dropped_hooks: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    def problems(self) -> list[str]:
        """Everything the rebuilt model lacks compared with the deployed one, one line each."""
        return ([f"{p}" for p in self.unrecovered] + [f"{k}: tensor data missing from the image" for k in self.missing_tensors]
                + [f"{h}: hook dropped (its function could not be rebuilt)" for h in self.dropped_hooks])  # fmt: skip


def _load(path: Path) -> dict:
    from zen.reuse.tensor_load import load_safetensors

    return load_safetensors(path)


class TensorFactory:
    """Tensors of the case, one object per tensor of the image (parameters wrapped once)."""

    def __init__(self, mr: ModelMR, weights: dict, extra: dict, report: GraphReport) -> None:
        self.records = {("weights", t.key): t for t in mr.tensors} | {("extra", t.key): t for t in mr.extra_tensors}
        self.data = {("weights", k): v for k, v in weights.items()} | {("extra", k): v for k, v in extra.items()}
        self.report = report
        self.objects: dict[tuple[str, str], Any] = {}
        self.decoder: Decoder | None = None  # set once the decoder exists: subclass tensors decode their attributes
        self.device: str | None = None  # the accelerator the model is rebuilt for (None: the CPU)

    def _subclass(self, rec: TensorRecord, own):
        """A tensor subclass rebuilt around its parts: the same class (resolved like the model's classes), an
        object made the way torch makes one (`_make_wrapper_subclass` with the recorded size, strides and dtype for
        a wrapper; `_make_subclass` around its own data for a Parameter subclass), then its attributes decoded
        (inner tensors from the weights file, metadata as recorded). No constructor of the library runs."""
        import torch

        sc = rec.subclass
        cls = self.decoder.r.cls(sc["cls"])
        if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
            raise ReuseError(f"{sc['cls']} resolved to {cls!r}, not a tensor subclass")
        dtype = getattr(torch, rec.dtype.replace("torch.", ""))
        if sc.get("wrapper"):
            on = self.device if self.device is not None and rec.device.split(":")[0] == self.device.split(":")[0] else "cpu"
            obj = torch.Tensor._make_wrapper_subclass(cls, tuple(rec.shape), strides=tuple(rec.stride),
                                                      storage_offset=rec.storage_offset, dtype=dtype, device=on,
                                                      requires_grad=rec.requires_grad)  # fmt: skip
        else:
            obj = torch.Tensor._make_subclass(cls, own, rec.requires_grad)
        where = f"tensor {rec.key}"
        for name, enc in (sc.get("state") or {}).items():
            obj.__dict__[name] = self.decoder.decode(enc, f"{where}.{name}")
        return obj

    def tensor(self, file: str, key: str, parameter: bool = False):
        import torch

        k = (file, key)
        if k in self.objects:
            return self.objects[k]
        rec: TensorRecord | None = self.records.get(k)
        t = self.data.get(k)
        if rec is not None and rec.subclass and rec.subclass.get("wrapper"):
            self.objects[k] = self._subclass(rec, None)
            return self.objects[k]
        if rec is None and t is None:
            raise ReuseError(f"tensor {key} is neither in the MR nor in the case's {file} file")
        if t is None:
            dtype = getattr(torch, rec.dtype.replace("torch.", ""), torch.float32)
            t = torch.empty(rec.shape, dtype=dtype)
            t.fill_(float("nan") if t.is_floating_point() or t.is_complex() else 0)
            self.report.missing_tensors.append(key)
        elif t.data_ptr() % 64 or not t.is_contiguous():
            # own, 64-byte aligned memory: CPU kernels pick different SIMD paths (different rounding) for
            # misaligned data, and outputs would not be bit-identical. zen.reuse.tensor_load allocates each tensor
            # itself, so this copy is made only for a tensor that came otherwise (the model is then held twice)
            t = t.clone(memory_format=torch.contiguous_format)
        if rec is not None:
            t = _restore_strides(t, rec)
            if self.device is not None and rec.device.split(":")[0] == self.device.split(":")[0]:
                t = t.to(self.device)  # where it was deployed (strides kept by .to)
            elif rec.device and rec.device not in ("cpu", "meta") and not rec.device.startswith("cpu"):
                self.report.moved_to_cpu.append(f"{key} ({rec.device})")
        if rec is not None and rec.subclass:
            t = self._subclass(rec, t)
        elif parameter:
            t = torch.nn.Parameter(t, requires_grad=rec.requires_grad if rec is not None else True)
        self.objects[k] = t
        return t


def _restore_strides(t, rec: TensorRecord):
    import torch

    if not rec.shape or list(t.stride()) == list(rec.stride) or t.numel() <= 1:
        return t
    if len(rec.stride) != t.dim() or any(s < 0 for s in rec.stride):
        return t
    out = torch.empty_strided(tuple(rec.shape), tuple(rec.stride), dtype=t.dtype)
    out.copy_(t)
    return out


def rebuild(mr: ModelMR, resolver: Resolver, case_dir: Path, *, eval_mode: bool = True, device: str | None = None):
    """The recovered model as a live `nn.Module` (and what the rebuild could not restore). `device`: the accelerator
    the model is rebuilt for; tensors that were on an accelerator in the image are created there (also those held
    in plain objects, which `.to()` does not move: bitsandbytes' MatmulLtState.SCB), the rest moved by the caller."""
    import torch

    from zen.represent import case

    report = GraphReport()
    tensors = TensorFactory(mr, _load(Path(case_dir) / case.WEIGHTS), _load(Path(case_dir) / case.EXTRA), report)
    tensors.device = device
    objs: dict[str, Any] = {}  # path -> module
    by_addr: dict[str, Any] = {}
    for m in mr.modules:
        if m.address in by_addr:  # the same module under a second path
            objs[m.path] = by_addr[m.address]
            continue
        cls = resolver.cls(f"{m.cls_module}:{m.cls_qualname}")
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise ReuseError(f"{m.cls_module}:{m.cls_qualname} resolved to {cls!r}, not an nn.Module class")
        objs[m.path] = by_addr[m.address] = cls.__new__(cls)
    params = {t.key for t in mr.tensors if t.kind == "parameter"}

    class Tensors(dict):  # the decoder asks for tensors referenced by modules' plain attributes
        def __missing__(self, k):
            return tensors.tensor(k[0], k[1], parameter=k[0] == "weights" and k[1] in params)

        def __contains__(self, k):
            return k in tensors.records or k in tensors.data

    dec = tensors.decoder = Decoder(resolver, Tensors(), objs)
    packed = packed_paths(mr)  # quantized Linears whose packed C++ weight is made again below (reuse.packed)
    scripted = (getattr(mr, "deployment", None) or {}).get("form") == "torchscript"
    for m in mr.modules:
        obj = objs[m.path]
        d = obj.__dict__
        if d:  # shared module already filled
            continue
        if scripted:  # a TorchScript module's state is its C++ attributes: nn.Module's own dicts come from torch
            torch.nn.Module.__init__(obj)
        where = f"model.{m.path}" if m.path else "model"
        for name, enc in m.state.items():
            if name in ("_packed_params", "_packed_weight") and m.path in packed:  # packed again below
                continue
            d[name] = dec.decode(enc, f"{where}.{name}")
        for name in HOOK_DICTS:
            _clean_hooks(d, name, where, report)
        d["_parameters"] = {n: tensors.tensor("weights", k, parameter=True) if k else None for n, k in m.parameter_keys.items()}
        d["_buffers"] = {n: _buffer(tensors, k) if k else None for n, k in m.buffer_keys.items()}
        d["_non_persistent_buffers_set"] = set(m.non_persistent_buffers)
        d["_modules"] = {n: objs.get(p) if p is not None else None for n, p in (m.child_paths or _child_paths(m)).items()}
        if "training" not in d:
            d["training"] = bool(m.training)
        report.modules += 1
        report.parameters += sum(1 for v in d["_parameters"].values() if v is not None)
        report.buffers += sum(1 for v in d["_buffers"].values() if v is not None)
    keys = {k for f, k in tensors.records if f == "weights"}
    repack(objs, packed, lambda k: tensors.tensor("weights", k), keys, {t.key: t for t in mr.tensors})
    report.extra_tensors = sum(1 for k in tensors.objects if k[0] == "extra")
    report.unrecovered = list(dec.unrecovered)
    model = objs[mr.modules[0].path]
    if eval_mode:
        model.eval()
    return model, report


def _buffer(tensors: TensorFactory, key: str):
    file = "weights" if ("weights", key) in tensors.records else "extra"
    return tensors.tensor(file, key)


def _child_paths(m) -> dict[str, str | None]:
    return {n: (None if n in m.none_entries else (f"{m.path}.{n}" if m.path else n)) for n in m.children}


def _clean_hooks(d: dict, name: str, where: str, report: GraphReport) -> None:
    """Hooks whose functions could not be rebuilt are dropped (and reported), never half-kept."""
    hooks = d.get(name)
    if isinstance(hooks, Unrecovered):
        d[name] = __import__("collections").OrderedDict()
        report.dropped_hooks.append(f"{where}.{name}")
        return
    if not isinstance(hooks, dict):
        return
    for k in list(hooks):
        v = hooks[k]
        if isinstance(v, Unrecovered) or (isinstance(v, tuple) and any(isinstance(x, Unrecovered) for x in v)):
            del hooks[k]
            report.dropped_hooks.append(f"{where}.{name}[{k}]")
