"""Measure fbgemm's packed embedding tables (`zen profile torch`): quantized `Embedding` and `EmbeddingBag`.

`torch.ao.nn.quantized.EmbeddingBag` (weight-only quantization: `float_qparams_weight_only_qconfig`, the form
recommendation models ship in) keeps its table only in a C++ `PackedEmbeddingBagWeight` behind
`EmbeddingPackedParams._packed_weight`: `packed_w`, a uint8 tensor of fused rows (8-bit: each row's bytes, then its
float scale and bias), and `w_scale` / `w_zp`, the per-row float scales and zero points the table was quantized
with, which are what `embedding_bag_unpack` (and so the state_dict) returns beside the rows, and `bit_rate_`. Here a
table of unusual, distinct sizes and known qparams locates every field; the self-check rebuilds the unpacked table
from memory alone and compares it with `embedding_bag_unpack`'s.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import CalibrationFailed, one

ROWS, DIM = 13, 6  # a table of unusual, distinct sizes


def measure_embedding_bag(cal) -> None:
    torch, m = cal.torch, cal.m
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        cal.provenance["packedembedding"] = "not measured: this torch has no fbgemm engine"
        return
    import warnings

    from torch.ao.nn.quantized import EmbeddingBag

    from zen.frontends.pytorch.quantized.kept_calibration import packed_object, rtti

    warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
    g = torch.Generator().manual_seed(23)
    scales = torch.rand(ROWS, generator=g, dtype=torch.float64) * 0.02 + 0.005
    zps = torch.rand(ROWS, generator=g) * 0.4 - 0.2
    table = torch.quantize_per_channel(torch.randn(ROWS, DIM, generator=g), scales, zps, 0, torch.quint8)
    bag = EmbeddingBag(ROWS, DIM)
    bag.set_weight(table)
    obj = packed_object(cal, bag._packed_params._packed_weight)
    cal.check(b"PackedEmbeddingBagWeight" in rtti(m, obj), "a quantized EmbeddingBag's object is PackedEmbeddingBagWeight")
    ndim, sizes = cal.off("tensorimpl", "ndim"), cal.off("tensorimpl", "sizes")

    def is_rows(p: int) -> bool:  # a TensorImpl of shape (ROWS, DIM + 8): the fused 8-bit rows
        return bool(p) and m.readable(p + sizes, 16) and m.word(p + ndim) == 2 and m.words(p + sizes, 2) == (ROWS, DIM + 8)

    packed = [o for o in range(8, 128, 8) if is_rows(m.word(obj + o))]
    cal.field("packedembedding", "packed_w", one("PackedEmbeddingBagWeight.packed_w", packed), "ptr")
    unpacked = torch.ops.quantized.embedding_bag_unpack(bag._packed_params._packed_weight)
    want_s = struct.pack(f"<{ROWS}f", *unpacked.q_per_channel_scales().float().tolist())
    want_z = struct.pack(f"<{ROWS}f", *unpacked.q_per_channel_zero_points().float().tolist())
    vec_s = [o for o in range(8, 160, 8) if _vector_holds(m, obj + o, want_s)]
    vec_z = [o for o in range(8, 160, 8) if _vector_holds(m, obj + o, want_z)]
    cal.field("packedembedding", "w_scale", one("PackedEmbeddingBagWeight.w_scale", vec_s), "ptr")
    cal.field("packedembedding", "w_zp", one("PackedEmbeddingBagWeight.w_zp", vec_z), "ptr")
    after = max(vec_s + vec_z) + 24  # the bit rate follows the two vectors
    rate = [o for o in range(after, after + 32, 8) if m.raw(obj + o, 8) == struct.pack("<q", 8)]
    cal.field("packedembedding", "bit_rate", one("PackedEmbeddingBagWeight.bit_rate_", rate[:1]), "i64")
    _check_unpack(cal, m, obj, unpacked)


def _vector_holds(m, at: int, want: bytes) -> bool:
    """Whether the std::vector at `at` (begin, end, capacity) holds exactly `want`."""
    begin, end = m.words(at, 2)
    return bool(begin) and end - begin == len(want) and m.readable(begin, len(want)) and m.raw(begin, len(want)) == want


def _check_unpack(cal, m, obj: int, unpacked) -> None:
    """The reader's computation, from memory alone: each row's first DIM bytes of packed_w are the table's."""
    impl = m.word(obj + cal.off("packedembedding", "packed_w"))
    storage = m.word(impl + cal.off("tensorimpl", "storage"))
    data = m.word(storage + cal.off("storageimpl", "data"))
    if not data:
        raise CalibrationFailed("PackedEmbeddingBagWeight: packed_w has no data")
    offset = m.word(impl + cal.off("tensorimpl", "storage_offset"))
    raw = m.raw(data + offset, ROWS * (DIM + 8))
    rows = [raw[i * (DIM + 8) : i * (DIM + 8) + DIM] for i in range(ROWS)]
    cal.check(b"".join(rows) == unpacked.int_repr().numpy().tobytes(), "packed_w's rows are embedding_bag_unpack's table")
