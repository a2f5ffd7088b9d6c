"""Measure fbgemm's packed 3-d convolution (`zen profile torch`): where `PackWeightsForConv<3>` keeps its matrices.

A `Conv3d` the fbgemm engine packs is a `PackedConvWeight<3>`: the same object as the 2-d one (its fields are
measured by `calibration.measure_packed_conv`), whose `PackWeightsForConv<3>` holds a larger `conv_param_t<3>`
before the packed matrices, so their offsets differ from the 2-d ones. Measured here on an im2col (3x3x3) and a
pointwise (1x1x1) convolution of known weights; each packed buffer is checked to unpack to `conv3d_unpack`'s
weight (rows: the channels-last kernel, kt, kh, kw, ic).

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import one

IC, OC = 3, 5


def measure_packed_conv3d(cal) -> None:
    torch, m = cal.torch, cal.m
    from torch.ao.nn.quantized import Conv3d

    from zen.frontends.pytorch.quantized.calibration import unpack_index
    from zen.frontends.pytorch.quantized.kept_calibration import packed_object, rtti

    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        g = torch.Generator().manual_seed(29)
        convs = {}
        for name, ks in (("im2col", (3, 3, 3)), ("pointwise", (1, 1, 1))):
            c = Conv3d(IC, OC, ks)
            sc = torch.rand(OC, generator=g, dtype=torch.float64) * 0.01 + 0.01
            w = torch.quantize_per_channel(torch.randn(OC, IC, *ks, generator=g), sc, torch.arange(OC) % 3 - 1, 0,
                                           torch.qint8)  # fmt: skip
            c.set_weight_bias(w, torch.randn(OC, generator=g))
            p = packed_object(cal, c._packed_params)
            cal.check(b"PackedConvWeightILi3E" in rtti(m, p), "an fbgemm-packed Conv3d's object is PackedConvWeight<3>")
            convs[name] = (c, m.word(p + cal.off("packedconv", "w")), ks)
        nrows, ncols = cal.off("packb", "nrows"), cal.off("packb", "ncols")

        def holders(pw: int, k: int) -> list[int]:
            return [o for o in range(0, 512, 8) if (q := m.word(pw + o)) and m.readable(q, 64)
                    and struct.unpack("<ii", m.raw(q + nrows, 4) + m.raw(q + ncols, 4)) == (k, OC)]  # fmt: skip

        pws = {n: pw for n, (_, pw, _) in convs.items()}
        # one convolution keeps one packing: the other's pointer is null there (as in the 2-d measure)
        im = [o for o in holders(pws["im2col"], 27 * IC) if m.word(pws["pointwise"] + o) == 0]
        pt = [o for o in holders(pws["pointwise"], IC) if m.word(pws["im2col"] + o) == 0]
        cal.field("convpack3", "im2col", one("PackWeightsForConv<3>.W_im2col_packed_", im), "ptr")
        cal.field("convpack3", "pointwise", one("PackWeightsForConv<3>.W_pointwise_packed_", pt), "ptr")
        for name, (c, pw, ks) in convs.items():
            packb = m.word(pw + cal.off("convpack3", name))
            want = torch.ops.quantized.conv3d_unpack(c._packed_params)[0].int_repr()
            want = want.permute(0, 2, 3, 4, 1).reshape(OC, -1).t().contiguous().view(-1).tolist()
            brow, bcol, nbrow, nbcol, ri = (struct.unpack("<i", m.raw(packb + cal.off("packb", f), 4))[0]
                                            for f in ("brow", "bcol", "nbrow", "nbcol", "row_interleave"))  # fmt: skip
            data = m.raw(m.word(packb + cal.off("packb", "buf")), nbrow * brow * nbcol * bcol)
            k = ks[0] * ks[1] * ks[2] * IC
            got = [struct.unpack_from("<b", data, x)[0] for x in unpack_index(k, OC, brow, bcol, nbcol, ri)]
            cal.check(got == want, f"the {name} Conv3d's packed buffer unpacks to conv3d_unpack's weight")
    finally:
        torch.backends.quantized.engine = before
