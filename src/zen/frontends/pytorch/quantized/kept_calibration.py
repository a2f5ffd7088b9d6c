"""Measure quantized tensors' quantizers and oneDNN's packed convolutions (`zen profile torch`).

Static quantization with PyTorch's default x86 engine packs a Conv2d whose weights are symmetric (the default
qconfig's per-channel weights) with oneDNN on CPUs with VNNI: a C++ `PackedConvWeightsOnednn` behind the module's
`_packed_params` ScriptObject. It keeps the quantized weight it was made from (`orig_weight_`, a QTensorImpl) and
the bias (`orig_bias_`, an optional<Tensor>), which is what `conv2d_unpack` returns. A QTensorImpl's scales and zero
points live in its quantizer (per tensor: a double and an int64; per channel: two tensors and the axis). Here
tensors and convolutions with known values locate every field; the engine is set to onednn while measuring so the
measure does not depend on this CPU's VNNI. The C++ class of an object is read from its RTTI (Itanium ABI: the
vtable's typeinfo names it), so a reader tells oneDNN's object from fbgemm's without guessing.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import CalibrationFailed, common, one

OC, IC, KH, KW = 10, 6, 3, 2  # a convolution of unusual, distinct sizes


def rtti(m, obj: int) -> bytes:
    """The mangled name of a polymorphic C++ object's class (vtable[-1] -> type_info -> name)."""
    name = m.word(m.word(m.word(obj) - 8) + 8)
    raw = m.raw(name, 128)
    return raw[: raw.index(b"\0")] if b"\0" in raw else raw


def measure_quantizer(cal) -> None:
    torch, m = cal.torch, cal.m
    g = torch.Generator().manual_seed(11)
    pt = torch.quantize_per_tensor(torch.randn(OC, IC, generator=g), 0.0123, 3, torch.qint8)
    scales = torch.rand(OC, generator=g, dtype=torch.float64) * 0.02 + 0.005
    pc = torch.quantize_per_channel(torch.randn(OC, IC, generator=g), scales, torch.arange(OC) % 3 - 1, 0, torch.qint8)
    pc1 = torch.quantize_per_channel(torch.randn(IC, OC, generator=g), scales, torch.arange(OC) % 3, 1, torch.qint8)
    cands = []
    for t in (pt, pc, pc1):
        c = []
        for off in range(64, 512, 8):
            q = m.word(t._cdata + off)
            if q and m.readable(q, 64) and m.readable(m.word(q), 8) and b"Quantizer" in _safe_rtti(m, q):
                c.append(off)
        cands.append(c)
    cal.field("qtensorimpl", "quantizer", common("QTensorImpl.quantizer_", *cands), "ptr")
    qpt, qpc, qpc1 = (m.word(t._cdata + cal.off("qtensorimpl", "quantizer")) for t in (pt, pc, pc1))
    cal.check(b"PerTensorAffineQuantizer" in rtti(m, qpt), "a per-tensor quantizer's class is PerTensorAffineQuantizer")
    cal.check(b"PerChannelAffineQuantizer" in rtti(m, qpc), "a per-channel quantizer's class is PerChannelAffineQuantizer")
    scale = [o for o in range(16, 64, 8) if m.raw(qpt + o, 8) == struct.pack("<d", 0.0123)]
    cal.field("pertensorquantizer", "scale", one("PerTensorAffineQuantizer.scale_", scale), "f64")
    zp = [o for o in range(16, 64, 8) if m.raw(qpt + o, 8) == struct.pack("<q", 3)]
    cal.field("pertensorquantizer", "zero_point", one("PerTensorAffineQuantizer.zero_point_", zp), "i64")
    sc = [o for o in range(16, 64, 8) if m.word(qpc + o) == pc.q_per_channel_scales()._cdata]
    cal.field("perchannelquantizer", "scales", one("PerChannelAffineQuantizer.scales_", sc), "ptr")
    zs = [o for o in range(16, 64, 8) if m.word(qpc + o) == pc.q_per_channel_zero_points()._cdata]
    cal.field("perchannelquantizer", "zero_points", one("PerChannelAffineQuantizer.zero_points_", zs), "ptr")
    # axes 0, 1 and 2: a word past the object (a neighbouring chunk's header) once matched 0 and 1 under load
    pc2 = torch.quantize_per_channel(torch.randn(2, 3, OC, generator=g), scales, torch.arange(OC) % 3, 2, torch.qint8)
    qpc2 = m.word(pc2._cdata + cal.off("qtensorimpl", "quantizer"))
    want = [struct.pack("<q", a) for a in (0, 1, 2)]
    axis = [o for o in range(16, 72, 8) if [m.raw(q + o, 8) for q in (qpc, qpc1, qpc2)] == want]
    cal.field("perchannelquantizer", "axis", one("PerChannelAffineQuantizer.axis_", axis), "i64")


def _safe_rtti(m, obj: int) -> bytes:
    try:
        vt = m.word(obj)
        if not m.readable(vt - 8, 8):
            return b""
        ti = m.word(vt - 8)
        if not m.readable(ti + 8, 8) or not m.readable(m.word(ti + 8), 1):
            return b""
        return rtti(m, obj)
    except (OSError, ValueError, CalibrationFailed):
        return b""


# packed classes that keep the quantized weight they were made from: (engine, module kind) -> (profile struct, class)
KEPT = {("onednn", "conv2d"): ("onednnconv", "PackedConvWeightsOnednn"),
        ("onednn", "linear"): ("onednnlinear", "PackedLinearWeightsOnednn"),
        ("qnnpack", "conv2d"): ("qnnpconv", "PackedConvWeightsQnnp"),
        ("qnnpack", "linear"): ("qnnplinear", "PackedLinearWeightsQnnp")}  # fmt: skip


def measure_onednn_conv(cal) -> None:
    _measure_kept(cal, "onednn", "conv2d")


def measure_onednn_linear(cal) -> None:
    _measure_kept(cal, "onednn", "linear")


def measure_qnnpack_conv(cal) -> None:
    _measure_kept(cal, "qnnpack", "conv2d")


def measure_qnnpack_linear(cal) -> None:
    _measure_kept(cal, "qnnpack", "linear")


def _measure_kept(cal, engine: str, kind: str) -> None:
    """Locate the kept weight and bias in the packed object `engine` makes for a quantized `kind` module: three
    modules (two with a bias, one without) with known weights; the bias is an optional (engaged flag measured) or,
    for engines that always keep one (qnnpack makes zeros), a plain tensor."""
    torch, m = cal.torch, cal.m
    struct_name, cls = KEPT[(engine, kind)]
    if engine not in torch.backends.quantized.supported_engines:
        cal.provenance[struct_name] = f"not measured: this torch has no {engine} engine"
        return
    import warnings

    from torch.ao.nn.quantized import Conv2d, Linear

    warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        g = torch.Generator().manual_seed(13)
        objs, weights, biases = [], [], []
        for with_bias in (True, True, False):
            shape = (OC, IC, KH, KW) if kind == "conv2d" else (OC, IC)
            mod = Conv2d(IC, OC, (KH, KW), bias=with_bias) if kind == "conv2d" else Linear(IC, OC, bias_=with_bias)
            s = torch.rand(OC, generator=g, dtype=torch.float64) * 0.02 + 0.005
            w = torch.quantize_per_channel(torch.randn(*shape, generator=g), s, torch.zeros(OC, dtype=torch.long), 0,
                                           torch.qint8)  # fmt: skip
            b = torch.randn(OC, generator=g) if with_bias else None
            mod.set_weight_bias(w, b)
            obj = mod._packed_params if kind == "conv2d" else mod._packed_params._packed_params
            objs.append(obj)
            unpack = torch.ops.quantized.conv2d_unpack if kind == "conv2d" else torch.ops.quantized.linear_unpack
            weights.append(unpack(obj)[0] if engine == "qnnpack" else w)  # qnnpack may keep a converted copy
            biases.append(unpack(obj)[1])
        payloads = [packed_object(cal, o) for o in objs]
        for p in payloads:
            cal.check(cls.encode() in rtti(m, p), f"a {engine}-packed {kind}'s object is {cls}")
        # qnnpack's convolution holds the kept weight twice (the original and the one its kernels were made from,
        # the same TensorImpl): any word that does, in every sample, reads it
        held = set.intersection(*[set(_found(m, p, w)) for p, w in zip(payloads, weights)])
        if not held:
            raise CalibrationFailed(f"{cls}.orig_weight: no word holds the kept weight in every sample")
        cal.field(struct_name, "orig_weight", min(held), "ptr", f"measured: {len(held)} word(s) hold it, the first")
        bias = common(f"{cls}.bias", *[_found(m, p, b) for p, b in zip(payloads[:2], biases[:2])])
        cal.field(struct_name, "orig_bias", bias, "ptr")
        if biases[2] is not None:  # a bias is always kept (qnnpack: zeros); the state_dict shows it
            cal.check(m.word(payloads[2] + bias) == biases[2]._cdata, f"{cls} keeps a bias without one given")
            cal.constants[f"{struct_name.upper()}_BIAS_ALWAYS"] = 1
        else:
            flag = [o for o in range(bias + 8, bias + 16) if m.raw(payloads[2] + o, 1) == b"\0"
                    and all(m.raw(p + o, 1) == b"\1" for p in payloads[:2])]  # fmt: skip
            cal.field(struct_name, "orig_bias_engaged", one("optional<Tensor> engaged flag", flag[:1]), "u8")
        for o, w in zip(objs, weights):
            unpack = torch.ops.quantized.conv2d_unpack if kind == "conv2d" else torch.ops.quantized.linear_unpack
            cal.check(torch.equal(unpack(o)[0].int_repr(), w.int_repr()), f"{cls}: unpack returns the kept weight")
    finally:
        torch.backends.quantized.engine = before


def _found(m, payload: int, t) -> list[int]:
    return m.find_word(payload, 1024, t._cdata) if t is not None else []


def packed_object(cal, script_object) -> int:
    """The C++ object behind a packed-params ScriptObject in this process (the calibration's twin of
    `kept.capsule_payload`, which reads an image): used by every packed-weight measure."""
    m = cal.m
    value, obj_off, slots_off = cal.off("pybind", "value"), cal.off("jitmodule", "object"), cal.off("jitobject", "slots")
    ivo = m.word(m.word(id(script_object) + value) + obj_off)
    begin, end = m.words(ivo + slots_off, 2)
    cal.check(end - begin == cal.constants["IVALUE_SIZE"], "a packed-params object has one slot")
    return m.word(begin)
