"""The mathematical representation (MR) of a recovered model: module tree, tensors, graph.

Plain data, no knowledge of memory images: built by a framework front end, written to `mr.json`
in a case directory, read back by attribution, diff, reuse and reports. Hyper-parameters are
stored as Python literal reprs (`"(3, 3)"`, `"1e-05"`, `"'zeros'"`): exact, unambiguous for
tuples vs lists and ints vs floats, and parseable with `ast.literal_eval`.

Format is versioned (`"format": 1`) and deterministic: built from the same image it serialises
to the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zen.represent.jsontext import as_plain

MR_FORMAT = 1


@dataclass
class RootRecord:
    """A module that is no other module's child: a candidate model."""

    address: str
    cls: str
    modules: int
    parameters: int  # parameter tensors (unique objects)
    parameter_elements: int
    depth: int
    referenced_from: list[str] = field(default_factory=list)
    rank: int = 0
    served_by: list[str] = field(default_factory=list)  # running code that uses it (frontends.common.served)


@dataclass
class ModuleRecord:
    path: str  # "" for the root, "blocks.0.conv" for descendants
    cls_module: str
    cls_qualname: str
    address: str
    training: bool | None
    hyperparameters: dict[str, str] = field(default_factory=dict)  # name -> repr of a plain value
    parameters: list[str] = field(default_factory=list)  # registered names with a tensor
    buffers: list[str] = field(default_factory=list)
    non_persistent_buffers: list[str] = field(default_factory=list)
    none_entries: list[str] = field(default_factory=list)  # parameters/buffers/children registered as None
    children: list[str] = field(default_factory=list)  # child names in registration order
    unregistered_tensors: list[str] = field(default_factory=list)  # plain attributes holding tensors
    # for rebuilding the object graph (reuse): every instance attribute, encoded (cpython.snapshot),
    # and where each registered parameter/buffer's data is (weights or extra tensors; None entries kept)
    state: dict[str, Any] = field(default_factory=dict)
    parameter_keys: dict[str, str | None] = field(default_factory=dict)
    buffer_keys: dict[str, str | None] = field(default_factory=dict)
    child_paths: dict[str, str | None] = field(default_factory=dict)  # child name -> path of that module (shared: first)

    @property
    def cls(self) -> str:
        return f"{self.cls_module}.{self.cls_qualname}"


@dataclass
class TensorRecord:
    key: str  # state_dict key
    kind: str  # "parameter" or "buffer"
    dtype: str
    shape: list[int]
    stride: list[int]
    storage_offset: int
    device: str
    requires_grad: bool
    nbytes: int
    address: str  # the tensor's Python object
    storage: str  # its StorageImpl
    python_type: str
    data_address: str = "0x0"  # where the first element lives in the imaged process
    status: str = "ok"  # "ok", "missing", "on-device", "unrepresentable", "unreadable", "composite", "subclass"
    sha256: str | None = None  # of the data in C order
    tied_to: str | None = None  # the first key holding the same tensor
    note: str = ""
    # a tensor subclass read in parts (frontends/pytorch/subclasses.py): attribute name -> key of the inner tensor
    # (kind "inner", in the weights file), and {"cls": "module:qualname", "wrapper": bool, "state": {encoded
    # attributes}} to rebuild the object; status "composite" when the outer object has no data of its own
    components: dict[str, str] = field(default_factory=dict)
    subclass: dict[str, Any] = field(default_factory=dict)
    # an offloaded tensor (accelerate): where its data was found or is ({"from": "memory"|"file", ...}); see
    # frontends/pytorch/offload.py; status "offloaded" while the file was not given (--offload)
    offload: dict[str, Any] = field(default_factory=dict)
    # a packed quantized weight unpacked by zen (frontends/pytorch/quantized): {"dtype": "qint8", "qscheme", "scale",
    # "zero_point", "axis" (per-channel), "packed": {engine, blocking, object}}; the weights file holds its int8 values
    quantization: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelMR:
    root: RootRecord
    roots: list[RootRecord]
    modules: list[ModuleRecord]
    tensors: list[TensorRecord]
    tied: list[list[str]] = field(default_factory=list)
    shared_storage: list[list[str]] = field(default_factory=list)
    layer_types: dict[str, int] = field(default_factory=dict)
    graph: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    extra_tensors: list[TensorRecord] = field(default_factory=list)  # not in state_dict (extra.safetensors)
    problems: list[str] = field(default_factory=list)  # what could not be read, each naming its path
    # state the model holds that was not read (forms.audit): where, type, address, why; non-empty -> partial
    unread: list[dict[str, str]] = field(default_factory=list)
    # how the model was deployed when not plain eager: {"form": "torch.compile", "backend": ..., ...}
    deployment: dict[str, Any] = field(default_factory=dict)
    framework: str = "pytorch"  # the front end that recovered it: "pytorch" or "keras" (older cases: pytorch)
    format: int = MR_FORMAT

    def module(self, path: str) -> ModuleRecord:
        for m in self.modules:
            if m.path == path:
                return m
        raise KeyError(path)

    def tensor(self, key: str) -> TensorRecord:
        for t in self.tensors:
            if t.key == key:
                return t
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        d = as_plain(self)  # dataclasses.asdict, without a deepcopy per leaf
        d = {"format": d.pop("format"), "kind": "zen-mr", **d}
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelMR:
        if d.get("kind") != "zen-mr" or d.get("format") != MR_FORMAT:
            raise ValueError(f"not a zen MR (format {MR_FORMAT})")
        return cls(
            root=RootRecord(**d["root"]),
            roots=[RootRecord(**r) for r in d["roots"]],
            modules=[ModuleRecord(**m) for m in d["modules"]],
            tensors=[TensorRecord(**t) for t in d["tensors"]],
            tied=d.get("tied", []),
            shared_storage=d.get("shared_storage", []),
            layer_types=d.get("layer_types", {}),
            graph=d.get("graph", {}),
            inputs=d.get("inputs", []),
            summary=d.get("summary", {}),
            extra_tensors=[TensorRecord(**t) for t in d.get("extra_tensors", [])],
            problems=d.get("problems", []),
            unread=d.get("unread", []),
            deployment=d.get("deployment", {}),
            framework=d.get("framework", "pytorch"),
        )
