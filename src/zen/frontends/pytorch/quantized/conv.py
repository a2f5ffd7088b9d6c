"""Statically quantized convolutions: the weight and bias behind a quantized Conv2d's packed C++ object.

`torch.ao.nn.quantized.Conv2d` keeps its int8 weight only in the C++ object its `_packed_params` ScriptObject
holds. Which object depends on the engine and the CPU: with PyTorch's default x86 engine, a symmetric weight (the
default qconfig's) on a CPU with VNNI is packed by oneDNN (`PackedConvWeightsOnednn`), which keeps the quantized
weight it was made from (`orig_weight_`, a QTensorImpl whose quantizer holds the scales and zero points) and the
bias. Those are read here, bit-exact, under the keys the module's own `state_dict()` writes (`PATH.weight`,
`PATH.bias`). fbgemm's `PackedConvWeight` (an asymmetric weight, a CPU without VNNI, the fbgemm engine) keeps
only its re-blocked form; it is named (from the object's RTTI) and left unread, so the case is partial, not wrong.

Layouts: `conv_calibration.py`, measured by `zen profile torch`.
"""

from __future__ import annotations

import struct

import numpy as np

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.profile import TorchProfile
from zen.runtime.errors import ObjectError, ZenError

QUANTIZED_CONV2D = "torch.ao.nn.quantized.modules.conv.Conv2d"
STRUCTS = ("qtensorimpl", "pertensorquantizer", "perchannelquantizer", "packedconvonednn")
MAX_NAME = 256  # bytes of a C++ class name read from RTTI
MAX_CHANNELS = 1 << 20
QINT8 = "qint8"


def cpp_class(ip: Interpreter, obj: int) -> str:
    """The mangled name of a polymorphic C++ object's class, from its RTTI (Itanium C++ ABI: the vtable's slot -1
    points to the type_info, whose second word is the name). Bounded: at most MAX_NAME bytes."""
    name = ip.ptr(ip.ptr(ip.ptr(obj) - 8) + 8)
    return ip.space.cstring(name, MAX_NAME).decode("ascii", "replace")


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


def has_conv_layout(tp: TorchProfile) -> bool:
    return all(s in tp.structs for s in STRUCTS) and "IVALUE_TAG_CAPSULE" in tp.constants


def conv_slots(ip: Interpreter, reader, index, root: int) -> tuple[list, set[str], dict[str, str]]:
    """(slots of every quantized Conv2d's weight and bias under `root`, the module paths read, {path: why} for those
    not read), as `packed.packed_slots` does for Linears."""
    from zen.frontends.pytorch.mr import TensorSlot, tensor_record
    from zen.frontends.pytorch.quantized.packed import capsule_payload, python_type
    from zen.frontends.pytorch.subclasses import ClassLookup

    look = ClassLookup.shared(ip)
    targets = [(p, n) for p, n in index.walk(root) if QUANTIZED_CONV2D in look.mro_names(n.type) and "_packed_params" in n.attrs]
    if not targets:
        return [], set(), {}
    tp = reader.tp
    if not has_conv_layout(tp):
        why = (f"the torch {tp.version} layout profile has no quantized-convolution layout; recalibrate it with "
               "`zen profile torch --python PYTHON_WITH_THAT_TORCH`")  # fmt: skip
        return [], set(), {p: why for p, _ in targets}
    slots, read, failed = [], set(), {}
    for path, node in targets:
        addr = node.attrs["_packed_params"]
        try:
            obj = capsule_payload(ip, tp, addr)
            kind = cpp_class(ip, obj)
            if "PackedConvWeightsOnednn" not in kind:
                engine = "fbgemm's" if "PackedConvWeight" in kind else "an engine's"
                raise ObjectError(addr, f"{engine} packed convolution ({kind or 'unknown C++ class'}) keeps the weight "
                                  "only re-blocked for its kernels, a layout zen does not read yet")  # fmt: skip
            O = tp.packedconvonednn
            wimpl = ip.ptr(obj + O.orig_weight)
            meta = reader.impl_meta(wimpl, wimpl)
            if meta.dtype != QINT8 or len(meta.shape) != 4 or not meta.on_cpu:
                raise ObjectError(addr, f"the kept weight is {meta.dtype} of shape {meta.shape} on {meta.device}, "
                                  "not a 4-d qint8 CPU tensor")  # fmt: skip
            q = quantization(ip, reader, wimpl, addr)
            if q["qscheme"] == "per_channel_affine" and (q.get("axis") != 0 or len(q["scale"]) != meta.shape[0]):
                raise ObjectError(addr, f"per-channel scales ({len(q['scale'])}, axis {q.get('axis')}) do not match "
                                  f"{meta.shape[0]} output channels")  # fmt: skip
            meta.dtype, meta.safetensors = "int8", "I8"  # the int8 representation; the quantization is in the record
            rec = tensor_record(f"{path}.weight" if path else "weight", "packed", wimpl, meta, reader=reader)
            rec.quantization = {**q, "packed": {"engine": "onednn", "object": f"{obj:#x}", "kind": "conv2d"}}
            rec.note = "the quantized weight oneDNN's packed convolution keeps (orig_weight_), read as stored"
            got = [TensorSlot(rec.key, wimpl, "packed", meta, rec)]
            if ip.space.read(obj + O.orig_bias_engaged, 1)[0] == 1:
                bimpl = ip.ptr(obj + O.orig_bias)
                bmeta = reader.impl_meta(bimpl, bimpl)
                bmeta.python_type = python_type(ip, tp, bimpl)
                brec = tensor_record(f"{path}.bias" if path else "bias", "packed", bimpl, bmeta, reader=reader)
                got.append(TensorSlot(brec.key, bimpl, "packed", bmeta, brec))
        except ZenError as exc:
            failed[path] = f"its packed convolution could not be read: {exc}"
            continue
        slots += got
        read.add(path)
    return slots, read, failed
