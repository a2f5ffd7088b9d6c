"""Measure where fbgemm's packed linear weights live (`zen profile torch`): dynamic and static quantized Linear.

`torch.ao.nn.quantized` keeps a Linear's int8 weight only in a C++ `PackedLinearWeight` (fbgemm, PyTorch's x86
engine): a `torch.ScriptObject` whose Object's one slot is a capsule pointing to it. It holds an `fbgemm::PackBMatrix`
(the weight transposed and re-blocked for the int8 kernels: block rows and columns, row interleave), the bias, the
per-tensor or per-channel scales and zero points and the quantization scheme. Here two Linears with known weights
(one per-tensor, one per-channel, with distinct non-zero zero points) locate every field; the last self-check
unpacks the packed buffer with the blocking read from memory and compares it with `linear_unpack`'s int8 weight.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import CalibrationFailed, common, one

K, N = 72, 40  # in and out features: unusual, distinct values to find in memory


def _linears(torch):
    from torch.ao.nn.quantized.dynamic import Linear

    g = torch.Generator().manual_seed(7)
    per_tensor = Linear(K, N, dtype=torch.qint8)
    w = torch.quantize_per_tensor(torch.randn(N, K, generator=g) * 0.3, 0.0123, 3, torch.qint8)
    per_tensor.set_weight_bias(w, torch.randn(N, generator=g))
    per_channel = Linear(K, N, dtype=torch.qint8)
    scales = torch.rand(N, generator=g, dtype=torch.float64) * 0.02 + 0.005
    zps = torch.arange(N) % 5 - 2
    wc = torch.quantize_per_channel(torch.randn(N, K, generator=g) * 0.3, scales, zps, 0, torch.qint8)
    per_channel.set_weight_bias(wc, torch.randn(N, generator=g))
    return per_tensor, per_channel


def unpack_index(k: int, n: int, brow: int, bcol: int, nbcol: int, ri: int) -> list[int]:
    """Index into the packed buffer of element (i, j) of the K x N matrix B (= the weight transposed), row-major
    over (i, j): fbgemm's PackBMatrix::addr. (The reader computes the same with numpy.)"""
    out = []
    for i in range(k):
        for j in range(n):
            out.append((i // brow) * nbcol * brow * bcol + (j // bcol) * brow * bcol
                       + (i % brow // ri) * bcol * ri + (j % bcol) * ri + i % ri)  # fmt: skip
    return out


def measure_packed(cal) -> None:
    torch, m = cal.torch, cal.m
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        cal.provenance["packedlinear"] = "not measured: this torch has no fbgemm engine"
        return
    import warnings

    warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
    pt, pc = _linears(torch)
    objs = [lin._packed_params._packed_params for lin in (pt, pc)]
    value, obj_off, slots_off = cal.off("pybind", "value"), cal.off("jitmodule", "object"), cal.off("jitobject", "slots")
    size, tag_off = cal.constants["IVALUE_SIZE"], cal.off("ivalue", "tag")
    payloads, tags = [], []
    for o in objs:
        ivo = m.word(m.word(id(o) + value) + obj_off)
        begin, end = m.words(ivo + slots_off, 2)
        cal.check(end - begin == size, "a packed-params object has one slot")
        tags.append(struct.unpack("<I", m.raw(begin + tag_off, 4))[0])
        payloads.append(m.word(begin))
    cal.check(tags[0] == tags[1], "both packed-params slots hold the same IValue tag (a capsule)")
    cal.constants["IVALUE_TAG_CAPSULE"] = tags[0]
    cal.provenance["constants.IVALUE_TAG_CAPSULE"] = "measured: the slot of a LinearPackedParamsBase object"
    unpacked = [torch.ops.quantized.linear_unpack(o) for o in objs]
    # the bias (an optional<Tensor>: its TensorImpl) and the PackBMatrix pointer
    cal.field("packedlinear", "bias", common("PackedLinearWeight.bias_", *[m.find_word(p, 64, b._cdata)
                                              for p, (_, b) in zip(payloads, unpacked)]), "ptr")  # fmt: skip
    w_cands = []
    for p in payloads:
        c = []
        for off in range(8, 64, 8):
            q = m.word(p + off)
            if q and m.readable(q, 128) and m.find_int(q, 128, K) and m.find_int(q, 128, N):
                c.append(off)
        w_cands.append(c)
    cal.field("packedlinear", "packb", common("PackedLinearWeight.w", *w_cands), "ptr")
    # the optional's engaged flag: set with a bias, clear without one
    from torch.ao.nn.quantized.dynamic import Linear

    nobias = Linear(K, N, bias_=False, dtype=torch.qint8)
    nb = m.word(m.word(m.word(id(nobias._packed_params._packed_params) + value) + obj_off) + slots_off)
    nb_payload = m.word(nb)
    bias = cal.off("packedlinear", "bias")
    flag = [o for o in range(bias + 8, bias + 16) if m.raw(nb_payload + o, 1) == b"\0"
            and all(m.raw(p + o, 1) == b"\1" for p in payloads)]  # fmt: skip
    cal.field("packedlinear", "bias_engaged", one("optional<Tensor> engaged flag", flag[:1]), "u8")
    _scales(cal, m, payloads, pt, pc)
    _packb(cal, m, [m.word(p + cal.off("packedlinear", "packb")) for p in payloads], unpacked)


def _vector_at(m, addr: int, span: int, want: bytes) -> list[int]:
    """Offsets of std::vector {begin, end, capacity} within span bytes at addr whose contents are `want`."""
    out = []
    for off in range(0, span, 8):
        b, e, c = m.words(addr + off, 3)
        if b and b <= e <= c and e - b == len(want) and m.readable(b, len(want)) and m.raw(b, len(want)) == want:
            out.append(off)
    return out


def _scales(cal, m, payloads, pt, pc) -> None:
    import torch

    wt, wc = pt.weight(), pc.weight()
    scales = [struct.pack("<f", wt.q_scale()), struct.pack(f"<{N}f", *wc.q_per_channel_scales().tolist())]
    zps = [struct.pack("<i", wt.q_zero_point()), struct.pack(f"<{N}i", *wc.q_per_channel_zero_points().tolist())]
    cal.field("packedlinear", "scales", common("PackedLinearWeight.w_scale", *[_vector_at(m, p, 160, s)
                                               for p, s in zip(payloads, scales)]), "ptr")  # fmt: skip
    cal.field("packedlinear", "zero_points", common("PackedLinearWeight.w_zp", *[_vector_at(m, p, 160, z)
                                                    for p, z in zip(payloads, zps)]), "ptr")  # fmt: skip
    after = cal.off("packedlinear", "zero_points") + 24
    schemes = [m.raw(p + after, 8) for p in payloads]
    cal.check(wt.qscheme() == torch.per_tensor_affine and wc.qscheme() == torch.per_channel_affine, "schemes")
    want = (0, 1)  # c10/core/QScheme.h: PER_TENSOR_AFFINE 0, PER_CHANNEL_AFFINE 1; located by the two Linears
    at = [i for i in range(8) if (schemes[0][i], schemes[1][i]) == want]
    cal.field("packedlinear", "qscheme", after + one("PackedLinearWeight.q_scheme", at[:1]), "u8")
    cal.constants["QSCHEME_PER_TENSOR_AFFINE"], cal.constants["QSCHEME_PER_CHANNEL_AFFINE"] = want
    for name in ("QSCHEME_PER_TENSOR_AFFINE", "QSCHEME_PER_CHANNEL_AFFINE"):
        cal.provenance[f"constants.{name}"] = "c10/core/QScheme.h, the byte located on a per-tensor and a per-channel Linear"


def _packb(cal, m, packbs: list[int], unpacked) -> None:
    # the first (K, N, 1) triple is nrows_, ncols_, G_; a later one is last_brow_, last_bcol_, trans_ (Transpose)
    triples = [{o for o in m.find_int(q, 128, K) if m.raw(q + o + 4, 8) == struct.pack("<ii", N, 1)} for q in packbs]
    dims = min(set.intersection(*triples), default=None)
    if dims is None:
        raise CalibrationFailed("PackMatrix.nrows_: no (rows, cols, groups) triple in both packed matrices")
    cal.field("packb", "nrows", dims, "i32")
    cal.field("packb", "ncols", dims + 4, "i32", "measured: follows nrows_")
    cal.field("packb", "groups", dims + 8, "i32", "measured: follows ncols_ (1 for a Linear)")
    blocks = []
    for q in packbs:
        c = []
        for off in range(8, dims - 12, 4):
            brow, bcol, nbrow, nbcol = struct.unpack("<4i", m.raw(q + off, 16))
            if brow > 0 and bcol > 0 and nbrow == -(-K // brow) and nbcol == -(-N // bcol):
                c.append(off)
        blocks.append(c)
    b = common("PackMatrix.brow_", *blocks)
    for i, name in enumerate(("brow", "bcol", "nbrow", "nbcol")):
        cal.field("packb", name, b + 4 * i, "i32", "measured: brow_, bcol_, nbrow_, nbcol_ in order")
    found = None
    q = packbs[0]
    brow, bcol, nbrow, nbcol = struct.unpack("<4i", m.raw(q + b, 16))
    want = [unpacked[0][0].int_repr().t().contiguous().view(-1).tolist(),
            unpacked[1][0].int_repr().t().contiguous().view(-1).tolist()]  # fmt: skip
    total = nbrow * brow * nbcol * bcol
    for buf in (o for o in range(0, b, 8) if m.readable(m.word(q + o), total)):
        data = m.raw(m.word(q + buf), total)
        for off in range(dims + 12, dims + 96, 4):
            ri = struct.unpack("<i", m.raw(q + off, 4))[0]
            if ri in (1, 2, 4, 8) and brow % ri == 0:
                got = [struct.unpack_from("<b", data, x)[0] for x in unpack_index(K, N, brow, bcol, nbcol, ri)]
                if got == want[0]:
                    found = (buf, off)
                    break
        if found:
            break
    if found is None:
        raise CalibrationFailed("PackBMatrix buffer and row interleave not found (nothing unpacks to the weight)")
    buf, found = found
    cal.field("packb", "buf", buf, "ptr", "measured: the pointer whose bytes unpack to the weight")
    cal.field("packb", "row_interleave", found, "i32")
    q2 = packbs[1]
    brow, bcol, nbrow, nbcol = struct.unpack("<4i", m.raw(q2 + b, 16))
    ri = struct.unpack("<i", m.raw(q2 + found, 4))[0]
    data = m.raw(m.word(q2 + buf), nbrow * brow * nbcol * bcol)
    got = [struct.unpack_from("<b", data, x)[0] for x in unpack_index(K, N, brow, bcol, nbcol, ri)]
    cal.check(got == want[1], "the per-channel packed weight unpacks to linear_unpack's int8 weight")


def measure_packed_conv(cal) -> None:
    """fbgemm's `PackedConvWeight<2>`: its `PackWeightsForConv` holds one of four packings; for an ordinary (ungrouped)
    convolution it is a `PackBMatrix` of the weight in channels-last order, (KH*KW*IC) x OC, the layout
    `_packb` measured: one per algorithm (im2col; pointwise for a 1x1, stride 1, no padding). Depthwise and
    grouped packings are left unmeasured (zen names such objects). The weight is read back and compared with
    `conv2d_unpack`'s."""
    torch, m = cal.torch, cal.m
    if "fbgemm" not in torch.backends.quantized.supported_engines or "packb" not in cal.structs:
        cal.provenance["packedconv"] = "not measured: this torch has no fbgemm engine"
        return
    from torch.ao.nn.quantized import Conv2d

    from zen.frontends.pytorch.quantized.kept_calibration import IC, KH, KW, OC, packed_object, rtti

    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        g = torch.Generator().manual_seed(17)
        convs = {}
        for name, ks, bias in (("im2col", (KH, KW), True), ("pointwise", (1, 1), True), ("nobias", (KH, KW), False)):
            c = Conv2d(IC, OC, ks, bias=bias)
            sc = torch.rand(OC, generator=g, dtype=torch.float64) * 0.01 + 0.01
            w = torch.quantize_per_channel(torch.randn(OC, IC, *ks, generator=g), sc, torch.arange(OC) % 3 - 1, 0,
                                           torch.qint8)  # fmt: skip
            c.set_weight_bias(w, torch.randn(OC, generator=g) if bias else None)
            p = packed_object(cal, c._packed_params)
            cal.check(b"PackedConvWeight" in rtti(m, p), "an fbgemm-packed Conv2d's object is PackedConvWeight")
            convs[name] = (c, p, ks, sc)
        nrows, ncols = cal.off("packb", "nrows"), cal.off("packb", "ncols")

        def holders(p: int, k: int) -> list[tuple[int, int]]:  # (offset of w in the object, offset in PackWeightsForConv)
            out = []
            for wo in range(8, 64, 8):
                pw = m.word(p + wo)
                if not (pw and m.readable(pw, 512)):
                    continue
                for o in range(0, 512, 8):
                    q = m.word(pw + o)
                    if q and m.readable(q, 64) and struct.unpack("<ii", m.raw(q + nrows, 4) + m.raw(q + ncols, 4)) == (k, OC):
                        out.append((wo, o))
            return out

        im = holders(convs["im2col"][1], KH * KW * IC)
        pt = holders(convs["pointwise"][1], IC)
        cal.field("packedconv", "w", common("PackedConvWeight.w", [a for a, _ in im], [a for a, _ in pt]), "ptr")
        # one convolution keeps one packing: its other packings' pointers are null. A word past the object that
        # happens to point at a matching matrix (seen under load, beyond 256 bytes) is not null in the other one.
        w_off = cal.off("packedconv", "w")
        packs = {n: m.word(convs[n][1] + w_off) for n in ("im2col", "pointwise")}

        def only(cands: list[tuple[int, int]], other: str) -> list[int]:
            return [b for a, b in cands if a == w_off and m.word(packs[other] + b) == 0]

        cal.field("convpack", "im2col", one("PackWeightsForConv.W_im2col_packed_", only(im, "pointwise")), "ptr")
        cal.field("convpack", "pointwise", one("PackWeightsForConv.W_pointwise_packed_", only(pt, "im2col")), "ptr")
        unpacked = {n: torch.ops.quantized.conv2d_unpack(c._packed_params) for n, (c, _, _, _) in convs.items()}
        p = convs["im2col"][1]
        cal.field("packedconv", "bias", one("PackedConvWeight.bias", m.find_word(p, 64, unpacked["im2col"][1]._cdata)), "ptr")
        bias = cal.off("packedconv", "bias")
        nb = convs["nobias"][1]
        flag = [o for o in range(bias + 8, bias + 16) if m.raw(nb + o, 1) == b"\0" and m.raw(p + o, 1) == b"\1"]
        cal.field("packedconv", "bias_engaged", one("optional<Tensor> engaged flag", flag[:1]), "u8")
        cal.field("packedconv", "kernel", one("PackedConvWeight.kernel", _vector_at(m, p, 256, struct.pack("<2q", KH, KW))),
                  "ptr")  # fmt: skip
        sc = convs["im2col"][3]
        cal.field("packedconv", "scales", one("PackedConvWeight.w_scale", _vector_at(m, p, 256, struct.pack(f"<{OC}f",
                  *sc.tolist()))), "ptr")  # fmt: skip
        zps = struct.pack(f"<{OC}i", *(torch.arange(OC) % 3 - 1).tolist())
        cal.field("packedconv", "zero_points", one("PackedConvWeight.w_zp", _vector_at(m, p, 256, zps)), "ptr")
        after = cal.off("packedconv", "zero_points") + 24
        cal.check(m.raw(p + after, 1)[0] == cal.constants.get("QSCHEME_PER_CHANNEL_AFFINE", 1), "q_scheme follows w_zp")
        cal.field("packedconv", "qscheme", after, "u8", "measured: follows w_zp, as in PackedLinearWeight")
        for name, (_, p, ks, _) in convs.items():  # the blocked buffer unpacks to the weight (channels-last rows)
            which = "pointwise" if ks == (1, 1) else "im2col"
            packb = m.word(m.word(p + cal.off("packedconv", "w")) + cal.off("convpack", which))
            want = unpacked[name][0].int_repr().permute(0, 2, 3, 1).reshape(OC, -1).t().contiguous().view(-1).tolist()
            brow, bcol, nbrow, nbcol = (struct.unpack("<i", m.raw(packb + cal.off("packb", f), 4))[0]
                                        for f in ("brow", "bcol", "nbrow", "nbcol"))  # fmt: skip
            ri = struct.unpack("<i", m.raw(packb + cal.off("packb", "row_interleave"), 4))[0]
            data = m.raw(m.word(packb + cal.off("packb", "buf")), nbrow * brow * nbcol * bcol)
            k = ks[0] * ks[1] * IC
            got = [struct.unpack_from("<b", data, x)[0] for x in unpack_index(k, OC, brow, bcol, nbcol, ri)]
            cal.check(got == want, f"the {name} convolution's packed buffer unpacks to conv2d_unpack's weight")
        _depthwise(cal, m, torch)
    finally:
        torch.backends.quantized.engine = before


def _depthwise(cal, m, torch) -> None:
    """fbgemm's depthwise packing (`PackedDepthWiseConvMatrix`: channels, kernel size, buffer), found through a
    depthwise convolution whose weight is known; the reader's unpacking is checked against `conv2d_unpack`."""
    import numpy as np
    from torch.ao.nn.quantized import Conv2d

    from zen.frontends.pytorch.quantized.kept_calibration import packed_object
    from zen.frontends.pytorch.quantized.packed import depthwise_index

    c, kp = 40, 9
    conv = Conv2d(c, c, 3, groups=c, padding=1)
    w = torch.quantize_per_channel(torch.randn(c, 1, 3, 3), torch.rand(c, dtype=torch.float64) * 0.01 + 0.01,
                                   torch.arange(c) % 3, 0, torch.qint8)  # fmt: skip
    conv.set_weight_bias(w, torch.randn(c))
    pw = m.word(packed_object(cal, conv._packed_params) + cal.off("packedconv", "w"))
    found = []
    for off in range(0, 512, 8):
        q = m.word(pw + off)
        if q and m.readable(q, 64) and off not in (cal.off("convpack", "im2col"), cal.off("convpack", "pointwise")):
            found += [(off, o) for o in range(0, 32, 4) if m.raw(q + o, 8) == struct.pack("<ii", c, kp)]
    off, dims = one("PackWeightsForConv.W_dw_packed_", [f[0] for f in found[:1]]), found[0][1]
    cal.field("convpack", "depthwise", off, "ptr")
    cal.field("dwconv", "channels", dims, "i32")
    cal.field("dwconv", "kernel_prod", dims + 4, "i32", "measured: follows the channel count")
    q = m.word(pw + off)
    idx = depthwise_index(c, kp)
    want = torch.ops.quantized.conv2d_unpack(conv._packed_params)[0].int_repr().reshape(c, kp).numpy()
    for buf in range(dims + 8, dims + 40, 8):
        b = m.word(q + buf)
        if b and m.readable(b, int(idx.max()) + 1):
            if (np.frombuffer(m.raw(b, int(idx.max()) + 1), dtype=np.int8)[idx] == want).all():
                cal.field("dwconv", "buf", buf, "ptr", "measured: the pointer whose bytes unpack to the weight")
                cal.check(True, "the depthwise packed buffer unpacks to conv2d_unpack's weight")
                return
    raise CalibrationFailed("PackedDepthWiseConvMatrix: no buffer unpacks to the weight")


def measure_packed_fp16(cal) -> None:
    """fbgemm's `PackedLinearWeightFp16` (`quantize_dynamic(..., dtype=torch.float16)`): a `PackedGemmMatrixFP16` of the
    weight transposed in float16 blocks, and the bias. Two Linears (one taller than a block, so the last block row is
    short) and one without a bias locate every field; the reader's unpacking is checked against `linear_unpack_fp16`."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear

    m = cal.m
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        cal.provenance["packedfp16"] = "not measured: this torch has no fbgemm engine"
        return
    from zen.frontends.pytorch.quantized.kept_calibration import packed_object, rtti

    g = torch.Generator().manual_seed(19)
    shapes = [(K, N, True), (600, N, True), (K, N, False)]
    lins, payloads = [], []
    for k, n, bias in shapes:
        lin = Linear(k, n, bias_=bias, dtype=torch.float16)
        lin.set_weight_bias(torch.randn(n, k, generator=g), torch.randn(n, generator=g) if bias else None)
        lins.append(lin)
        payloads.append(packed_object(cal, lin._packed_params._packed_params))
        cal.check(b"PackedLinearWeightFp16" in rtti(m, payloads[-1]), "an fp16 Linear's object is PackedLinearWeightFp16")

    def dims_at(p: int, k: int) -> list[tuple[int, int]]:  # (offset of the matrix pointer, offset of its K, N pair)
        return [(o, d) for o in range(8, 64, 8) if m.word(p + o) and m.readable(m.word(p + o), 64)
                for d in m.find_int(m.word(p + o), 64, k) if m.raw(m.word(p + o) + d + 4, 4) == struct.pack("<i", N)]  # fmt: skip

    found = [dims_at(p, k) for p, (k, _, _) in zip(payloads[:2], shapes)]
    w = common("PackedLinearWeightFp16.w", [o for o, _ in found[0]], [o for o, _ in found[1]])
    cal.field("packedfp16", "w", w, "ptr")
    d = common("PackedGemmMatrixFP16.nrow_", [x for o, x in found[0] if o == w], [x for o, x in found[1] if o == w])
    cal.field("fp16matrix", "nrows", d, "i32")
    cal.field("fp16matrix", "ncols", d + 4, "i32", "measured: follows nrow_")
    mats = [m.word(p + w) for p in payloads]
    cands = []
    for mat, (k, n, _) in zip(mats[:2], shapes):
        c = []
        for o in range(d + 8, d + 48, 4):
            brow, last, bcol, nbrow, nbcol = struct.unpack("<5i", m.raw(mat + o, 20))
            if brow > 0 and bcol > 0 and nbrow == -(-k // brow) and last == k - (nbrow - 1) * brow and nbcol == -(-n // bcol):
                c.append(o)
        cands.append(c)
    b = common("PackedGemmMatrixFP16.brow_", *cands)
    for i, name in enumerate(("brow", "last_brow", "bcol", "nbrow", "nbcol")):
        cal.field("fp16matrix", name, b + 4 * i, "i32", "measured: brow_, last_brow_, bcol_, nbrow_, nbcol_ in order")
    unpacked = [torch.ops.quantized.linear_unpack_fp16(lin._packed_params._packed_params) for lin in lins]
    cal.field(
        "packedfp16", "bias", one("PackedLinearWeightFp16.bias_", m.find_word(payloads[0], 64, unpacked[0][1]._cdata)), "ptr"
    )
    bias = cal.off("packedfp16", "bias")
    flag = [o for o in range(bias + 8, bias + 16) if m.raw(payloads[2] + o, 1) == b"\0" and m.raw(payloads[0] + o, 1) == b"\1"]
    cal.field("packedfp16", "bias_engaged", one("optional<Tensor> engaged flag", flag[:1]), "u8")
    for buf in range((b + 27) // 8 * 8, b + 96, 8):  # the pointer whose float16 blocks unpack to the weight, in every sample
        if all(_fp16_matches(m, mat + buf, mat + b, k, n, un[0].numpy()) for mat, (k, n, _), un in zip(mats, shapes, unpacked)):
            cal.field("fp16matrix", "buf", buf, "ptr", "measured: the pointer whose blocks unpack to linear_unpack_fp16's")
            cal.check(True, "both fp16 packed matrices (one block row and several) unpack to linear_unpack_fp16's weight")
            return
    raise CalibrationFailed("PackedGemmMatrixFP16: no buffer unpacks to the weight")


def _fp16_matches(m, at: int, dims: int, k: int, n: int, want) -> bool:
    import numpy as np

    brow, last, bcol, nbrow, nbcol = struct.unpack("<5i", m.raw(dims, 20))
    q = m.word(at)
    total = nbrow * brow * nbcol * bcol
    if not q or not m.readable(q, 2 * total):
        return False
    data = np.frombuffer(m.raw(q, 2 * total), dtype=np.float16)
    i, j = np.arange(k)[:, None], np.arange(n)[None, :]
    blk = i // brow
    idx = blk * nbcol * brow * bcol + (j // bcol) * np.where(blk != nbrow - 1, brow, last) * bcol + (i % brow) * bcol + j % bcol
    return bool((data[idx].T.astype(np.float32) == want).all())
