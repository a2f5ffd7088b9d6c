"""Packed quantized weights whose C++ object keeps the quantized weight it was made from: oneDNN and QNNPACK.

`torch.ao.nn.quantized` Linears and Conv2ds keep their int8 weight only in the C++ object behind a ScriptObject
(`_packed_params`). Which object depends on the engine and the CPU: PyTorch's default x86 engine packs Linears
with fbgemm (re-blocked only: `packed.py` unpacks them) and Conv2ds with oneDNN when the weight is symmetric (the
default qconfig's) and the CPU has AVX512-VNNI, else with fbgemm; the onednn engine packs both with oneDNN, the
qnnpack engine (ARM, mobile) with QNNPACK. oneDNN's and QNNPACK's objects keep the quantized weight they were made
from (a QTensorImpl whose quantizer holds the scales and zero points) and the bias: what `unpack` returns, read
here as stored, bit-exact (fbgemm's objects keep only the re-blocked form: `packed.py` unpacks them). The object's
class is read from its RTTI (Itanium C++ ABI: the vtable's slot -1 points to the type_info, which names the class),
so no object is read with another class's layout; an object of a class zen does not read (fp16 weights, fbgemm's
depthwise and grouped convolutions) is named and left unread: partial, not wrong.

Layouts: `kept_calibration.py`, measured by `zen profile torch`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.profile import TorchProfile
from zen.runtime.errors import ObjectError, ZenError

# class named in the RTTI -> (profile struct, engine)
KEPT = {"PackedConvWeightsOnednn": ("onednnconv", "onednn"), "PackedLinearWeightsOnednn": ("onednnlinear", "onednn"),
        "PackedConvWeightsQnnp": ("qnnpconv", "qnnpack"), "PackedLinearWeightsQnnp": ("qnnplinear", "qnnpack")}  # fmt: skip
QUANTIZER = ("qtensorimpl", "pertensorquantizer", "perchannelquantizer")
MAX_NAME = 256  # bytes of a C++ class name read from RTTI
MAX_CHANNELS = 1 << 20
QINT8 = "qint8"


def cpp_class(ip: Interpreter, obj: int) -> str:
    """The mangled name of a polymorphic C++ object's class (bounded: at most MAX_NAME bytes)."""
    name = ip.ptr(ip.ptr(ip.ptr(obj) - 8) + 8)
    return ip.space.cstring(name, MAX_NAME).decode("ascii", "replace")


def capsule_payload(ip: Interpreter, tp: TorchProfile, addr: int) -> int:
    """The C++ object behind a Python `torch.ScriptObject` of a custom class (packed params): its Object's one slot
    is a capsule whose payload points to it."""
    c = tp.constants
    obj = ip.ptr(ip.ptr(addr + tp.pybind.value) + tp.jitmodule.object)
    begin, end = ip.space.u64(obj + tp.jitobject.slots), ip.space.u64(obj + tp.jitobject.slots + 8)
    if end - begin != c["IVALUE_SIZE"]:
        raise ObjectError(addr, f"a packed-params object with {(end - begin) // c['IVALUE_SIZE']} slots (expected one)")
    tag = struct.unpack("<I", ip.space.read(begin + tp.ivalue.tag, 4))[0]
    if tag != c["IVALUE_TAG_CAPSULE"]:
        raise ObjectError(addr, f"a packed-params object whose slot holds IValue tag {tag}, not a capsule")
    return ip.ptr(begin + tp.ivalue.payload)


def python_type(ip: Interpreter, tp: TorchProfile, impl: int) -> str:
    """The class of the Python tensor a TensorImpl belongs to (its PyObject slot), when it has one: a packed bias
    is an `nn.Parameter` in the deployed module and is rebuilt as one."""
    try:
        obj = ip.ptr(impl + tp.tensorimpl.pyobj)
        return ip.type_name(obj) if obj else "torch.Tensor"
    except ZenError:
        return "torch.Tensor"


def kept_class(cls: str) -> str | None:
    """The KEPT class a mangled name names (`23PackedConvWeightsOnednnILi2EE` -> PackedConvWeightsOnednn)."""
    return next((k for k in KEPT if k in cls), None)


def has_capsules(tp: TorchProfile) -> bool:
    """Whether the profile reaches the C++ object behind a ScriptObject (TorchScript's Object and IValue layouts)."""
    return all(s in tp.structs for s in ("pybind", "jitmodule", "jitobject", "ivalue")) and "IVALUE_TAG_CAPSULE" in tp.constants


def has_kept_layout(tp: TorchProfile, cls: str) -> bool:
    return KEPT[cls][0] in tp.structs and all(s in tp.structs for s in QUANTIZER)


@dataclass
class Kept:
    """A kept weight: its TensorImpl's metadata (as int8), its quantization, the bias's TensorImpl (0: none)."""

    meta: object
    quantization: dict
    bias_impl: int
    engine: str


def read_kept(ip: Interpreter, reader, obj: int, owner: int, cls: str, ndim: int) -> Kept:
    """The weight and bias a KEPT object holds; `ndim`: the weight's rank (2: Linear, 4: Conv2d)."""
    tp = reader.tp
    struct_name, engine = KEPT[cls]
    S = getattr(tp, struct_name)
    wimpl = ip.ptr(obj + S.orig_weight)
    meta = reader.impl_meta(wimpl, wimpl)
    if meta.dtype != QINT8 or len(meta.shape) != ndim or not meta.on_cpu:
        raise ObjectError(owner, f"the kept weight is {meta.dtype} of shape {meta.shape} on {meta.device}, "
                          f"not a {ndim}-d qint8 CPU tensor")  # fmt: skip
    q = quantization(ip, reader, wimpl, owner)
    if q["qscheme"] == "per_channel_affine" and (q.get("axis") != 0 or len(q["scale"]) != meta.shape[0]):
        raise ObjectError(owner, f"per-channel scales ({len(q['scale'])}, axis {q.get('axis')}) do not match "
                          f"{meta.shape[0]} output channels")  # fmt: skip
    meta.dtype, meta.safetensors = "int8", "I8"  # the int8 representation; the quantization is in the record
    always = tp.constants.get(f"{struct_name.upper()}_BIAS_ALWAYS") == 1
    engaged = always or ip.space.read(obj + S.orig_bias_engaged, 1)[0] == 1
    return Kept(meta, q, ip.ptr(obj + S.orig_bias) if engaged else 0, engine)


def quantization(ip: Interpreter, reader, impl: int, owner: int) -> dict:
    """{dtype, qscheme, scale, zero_point[, axis]} of a quantized TensorImpl, from its quantizer."""
    tp = reader.tp
    q = ip.ptr(impl + tp.qtensorimpl.quantizer)
    kind = cpp_class(ip, q)
    if "PerTensorAffineQuantizer" in kind:
        scale = struct.unpack("<d", ip.space.read(q + tp.pertensorquantizer.scale, 8))[0]
        zp = struct.unpack("<q", ip.space.read(q + tp.pertensorquantizer.zero_point, 8))[0]
        if not (scale > 0 and np.isfinite(scale)) or not -(1 << 31) <= zp < 1 << 31:
            raise ObjectError(owner, f"implausible per-tensor quantization (scale {scale}, zero point {zp})")
        return {"dtype": QINT8, "qscheme": "per_tensor_affine", "scale": [scale], "zero_point": [zp]}
    if "PerChannelAffineQuantizer" in kind:
        P = tp.perchannelquantizer
        axis = struct.unpack("<q", ip.space.read(q + P.axis, 8))[0]
        scales = _vector(ip, reader, ip.ptr(q + P.scales), "float64", owner)
        zps = _vector(ip, reader, ip.ptr(q + P.zero_points), "int64", owner)
        if len(scales) != len(zps) or not 0 <= axis < 8:
            raise ObjectError(owner, f"per-channel quantization with {len(scales)} scales, {len(zps)} zero points, axis {axis}")
        return {"dtype": QINT8, "qscheme": "per_channel_affine", "scale": [float(x) for x in scales],
                "zero_point": [int(x) for x in zps], "axis": int(axis)}  # fmt: skip
    raise ObjectError(owner, f"a quantizer of class {kind or '?'}: only per-tensor and per-channel affine are read")


def _vector(ip: Interpreter, reader, impl: int, dtype: str, owner: int) -> np.ndarray:
    meta = reader.impl_meta(impl, owner)
    if meta.dtype != dtype or len(meta.shape) != 1 or not 0 < meta.numel <= MAX_CHANNELS or not meta.contiguous:
        raise ObjectError(owner, f"a quantizer's {dtype} vector is {meta.dtype} of shape {meta.shape}")
    data = ip.space.read(meta.data_ptr + meta.storage_offset * meta.itemsize, meta.nbytes)
    return np.frombuffer(data, dtype=np.float64 if dtype == "float64" else np.int64)


def kept_slots(ip: Interpreter, reader, kept: Kept, key: str, obj: int, cls: str, kind: str) -> list:
    """The weight's and bias's slots under `key` + `.weight` / `.bias`, the weight's record saying where it was."""
    from zen.frontends.pytorch.mr import TensorSlot, tensor_record

    wimpl = kept.meta.impl
    rec = tensor_record(f"{key}weight", "packed", wimpl, kept.meta, reader=reader)
    rec.quantization = {**kept.quantization, "packed": {"engine": kept.engine, "object": f"{obj:#x}", "kind": kind}}
    rec.note = f"the quantized weight {cls} keeps (the one it was packed from), read as stored"
    out = [TensorSlot(rec.key, wimpl, "packed", kept.meta, rec)]
    if kept.bias_impl:
        bmeta = reader.impl_meta(kept.bias_impl, kept.bias_impl)
        bmeta.python_type = python_type(ip, reader.tp, kept.bias_impl)
        brec = tensor_record(f"{key}bias", "packed", kept.bias_impl, bmeta, reader=reader)
        out.append(TensorSlot(brec.key, kept.bias_impl, "packed", bmeta, brec))
    return out
