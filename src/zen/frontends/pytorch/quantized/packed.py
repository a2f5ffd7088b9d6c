"""Packed quantized Linear weights read from memory: fbgemm's `PackedLinearWeight` behind `LinearPackedParams`.

`torch.ao.nn.quantized` Linears (dynamic and static, x86/fbgemm engine) keep their int8 weight only inside a C++
object, re-blocked for fbgemm's kernels: the weight transposed (K x N), cut into blocks of `brow` x `bcol`, each
block stored with `row_interleave` rows interleaved (fbgemm `PackBMatrix::addr`). The blocking is read from the
object itself (it follows the CPU the process ran on), checked against the matrix size, and inverted with numpy in
row bands (bounded memory); scales, zero points and the scheme come from the same object, the bias from its
TensorImpl. The unpacked weights are bytes zen computed, not bytes of the image: they are served from an attached
space named `unpacked` and each record says so.

The layout is measured by `zen profile torch` (`calibration.py` here); without it, or for another engine's object
(qnnpack, onednn: the checks fail), the weight stays unread and the case partial.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.profile import TorchProfile
from zen.frontends.pytorch.quantized.kept import (
    capsule_payload,
    cpp_class,
    has_capsules,
    has_kept_layout,
    kept_class,
    kept_slots,
    python_type,
    read_kept,
)
from zen.runtime.errors import ObjectError, ZenError

STRUCTS = ("pybind", "jitmodule", "jitobject", "ivalue", "packedlinear", "packb")
PACKED_PARAMS = "torch.ao.nn.quantized.modules.linear.LinearPackedParams"
QUANTIZED_CONV2D = "torch.ao.nn.quantized.modules.conv.Conv2d"
QUANTIZED_CONV1D = "torch.ao.nn.quantized.modules.conv.Conv1d"  # packed as a Conv2d of kernel (1, k): read as one
QUANTIZED_CONVT = {
    "torch.ao.nn.quantized.modules.conv.ConvTranspose2d": "convtranspose2d",
    "torch.ao.nn.quantized.modules.conv.ConvTranspose1d": "convtranspose1d",  # fbgemm packs none of these
    "torch.ao.nn.quantized.modules.conv.Conv3d": "conv3d",
}  # read where the engine keeps the weight
RANK = {"linear": 2, "conv3d": 5}  # the kept weight's rank (every other convolution: 4, a 1-d one's packed as 2-d)
EMBEDDING_PACKED = "torch.ao.nn.quantized.modules.embedding_ops.EmbeddingPackedParams"  # its `_packed_weight`
MAX_DIM = 1 << 20  # rows or columns of one weight
MAX_PACKED = 1 << 30  # bytes of one packed buffer (a 32k x 32k int8 weight; read whole, so bounded)
BAND = 256  # rows of B unpacked at once
QSCHEMES = {"QSCHEME_PER_TENSOR_AFFINE": "per_tensor_affine", "QSCHEME_PER_CHANNEL_AFFINE": "per_channel_affine"}


@dataclass
class PackedLinear:
    """One unpacked weight: int8 (out x in), its quantization, the bias's TensorImpl (0: none), how it was packed."""

    weight: np.ndarray
    qscheme: str
    scales: list[float]
    zero_points: list[int]
    bias_impl: int
    packing: dict
    name: str = "weight"  # its state_dict name under the module's prefix (an embedding table: `_packed_weight`)


def has_packed_layout(tp: TorchProfile) -> bool:
    return all(s in tp.structs for s in STRUCTS) and "IVALUE_TAG_CAPSULE" in tp.constants


class PackedReader:
    def __init__(self, ip: Interpreter, tp: TorchProfile) -> None:
        self.ip, self.tp = ip, tp
        self.qschemes = {tp.constants[k]: v for k, v in QSCHEMES.items() if k in tp.constants}

    def read(self, plw: int, addr: int, kind: str = "linear", cls: str = "") -> PackedLinear:
        """The weight of fbgemm's `PackedLinearWeight` (or, `kind` conv2d, `PackedConvWeight<2>`) at `plw`, behind the
        Python `torch.ScriptObject` at `addr`. A convolution's matrix rows are (kh, kw, ic), channels last: the
        weight comes back as PyTorch holds it, (out, in, kh, kw)."""
        ip, tp = self.ip, self.tp
        P = tp.packedlinear if kind == "linear" else tp.packedconv
        if kind == "linear":
            weight, packing = self._unpack(ip.ptr(plw + P.packb), addr)
        else:
            pw = ip.ptr(plw + P.w)
            dims = 3 if kind == "conv3d" else 2
            pack = tp.convpack3 if dims == 3 else tp.convpack  # PackWeightsForConv<3>: a larger conv_param_t first
            mats = [(a, ip.ptr(pw + getattr(pack, a))) for a in ("im2col", "pointwise")]
            algo, packb = next(((a, q) for a, q in mats if q), (None, 0))
            dw = ip.ptr(pw + tp.convpack.depthwise) if packb == 0 and "dwconv" in tp.structs and dims == 2 else 0
            if packb == 0 and dw == 0:
                raise ObjectError(addr, f"fbgemm packed this convolution ({cls or 'PackedConvWeight'}) grouped, a layout "
                                  "zen does not read yet")  # fmt: skip
            kernel = self._vector(plw + P.kernel, "<q", dims, addr)
            if packb == 0:
                flat, packing = self._depthwise(dw, kernel, addr)
                algo = "depthwise"
            else:
                flat, packing = self._unpack(packb, addr)  # a grouped one: each group's matrix, stacked by output
            taps = int(np.prod(kernel)) if len(kernel) == dims and min(kernel) >= 1 else 0
            if not taps or flat.shape[1] % taps:
                raise ObjectError(addr, f"kernel {kernel} does not divide the packed matrix's {flat.shape[1]} rows")
            oc, ic = flat.shape[0], flat.shape[1] // taps  # rows: the channels-last kernel, then the channels
            weight = np.ascontiguousarray(np.moveaxis(flat.reshape(oc, *kernel, ic), -1, 1))
            packing["algorithm"] = algo
        n = weight.shape[0]
        scheme = self.qschemes.get(ip.space.read(plw + P.qscheme, 1)[0])
        scales = self._vector(plw + P.scales, "<f", n, addr)
        zps = self._vector(plw + P.zero_points, "<i", n, addr)
        want = 1 if scheme == "per_tensor_affine" else n
        if scheme is None or len(scales) != want or len(zps) != want:
            raise ObjectError(addr, f"packed weight with scheme {scheme} and {len(scales)} scales, {len(zps)} zero points "
                              f"for {n} rows: not fbgemm's per-tensor or per-channel affine layout")  # fmt: skip
        bias = ip.ptr(plw + P.bias) if ip.space.read(plw + P.bias_engaged, 1)[0] == 1 else 0
        packing.update(engine="fbgemm", object=f"{plw:#x}", **({"kind": kind} if kind != "linear" else {}))
        return PackedLinear(weight, scheme, scales, zps, bias, packing)

    def read_embedding(self, obj: int, addr: int, reader) -> PackedLinear:
        """The table of fbgemm's `PackedEmbeddingBagWeight` at `obj`: its 8-bit fused rows (each row's bytes, then a
        float scale and bias) less the trailing 8 bytes, with the per-row float scales and zero points it keeps
        (`w_scale`, `w_zp`), which are what `embedding_bag_unpack` returns (checked by `zen profile torch`)."""
        ip, S = self.ip, self.tp.packedembedding
        rate = struct.unpack("<q", ip.space.read(obj + S.bit_rate, 8))[0]
        if rate not in (8, 4):
            raise ObjectError(addr, f"a {rate}-bit packed embedding table, a layout zen does not read yet (8- and 4-bit)")
        # a row's values, then its scale and bias: floats after 8-bit values, halves after 4-bit ones (two a byte,
        # the low nibble first, as a quint4x2 tensor stores them; fbgemm packs only an even number of columns)
        extra = 8 if rate == 8 else 4
        impl = ip.ptr(obj + S.packed_w)
        meta = reader.impl_meta(impl, impl)
        if meta.dtype != "uint8" or len(meta.shape) != 2 or not meta.on_cpu or meta.shape[1] <= extra:
            raise ObjectError(addr, f"packed rows of {meta.dtype} {list(meta.shape)}, not fbgemm's fused {rate}-bit rows")
        rows, width = meta.shape
        if rows > MAX_DIM * 64 or width > MAX_DIM or rows * width > MAX_PACKED or tuple(meta.stride) != (width, 1):
            raise ObjectError(addr, f"packed rows {rows} x {width} (strides {list(meta.stride)}): beyond zen's bounds or "
                              "not contiguous")  # fmt: skip
        fused = np.frombuffer(ip.space.read(meta.data_ptr, rows * width), dtype=np.uint8).reshape(rows, width)
        table = np.ascontiguousarray(fused[:, : width - extra])
        scales = self._vector(obj + S.w_scale, "<f", rows, addr)
        zps = self._vector(obj + S.w_zp, "<f", rows, addr)
        if len(scales) != rows or len(zps) != rows:
            raise ObjectError(addr, f"{len(scales)} scales and {len(zps)} zero points for {rows} rows")
        packing = {"engine": "fbgemm", "object": f"{obj:#x}", "kind": "embedding", "bit_rate": rate,
                   "columns": (width - extra) * 8 // rate}  # fmt: skip
        return PackedLinear(table, "per_channel_affine_float_qparams", scales, zps, 0, packing, "_packed_weight")

    def _vector(self, at: int, fmt: str, most: int, owner: int) -> list:
        begin, end = self.ip.space.u64(at), self.ip.space.u64(at + 8)
        size = struct.calcsize(fmt)
        if end < begin or (end - begin) % size or (end - begin) // size > most:
            raise ObjectError(owner, f"implausible vector of {end - begin} bytes in a packed weight")
        count = (end - begin) // size
        return list(struct.unpack(f"<{count}{fmt[1:]}", self.ip.space.read(begin, end - begin))) if count else []

    def read_fp16(self, plw: int, addr: int) -> PackedLinear:
        """fbgemm's `PackedLinearWeightFp16` (dynamic quantization to float16): its `PackedGemmMatrixFP16` holds the
        weight transposed (K x N) in float16, in blocks of brow x bcol stored block row by block row (the last block
        row only `last_brow` high). Comes back as the float32 weight PyTorch's own unpack gives (exact widening)."""
        ip, tp = self.ip, self.tp
        F = tp.packedfp16
        mat = ip.ptr(plw + F.w)
        names = ("nrows", "ncols", "brow", "last_brow", "bcol", "nbrow", "nbcol")
        v = {n: struct.unpack("<i", ip.space.read(mat + getattr(tp.fp16matrix, n), 4))[0] for n in names}
        k, n, brow, bcol, nbrow, nbcol, last = (v[x] for x in ("nrows", "ncols", "brow", "bcol", "nbrow", "nbcol", "last_brow"))
        ok = (0 < k <= MAX_DIM and 0 < n <= MAX_DIM and brow > 0 and bcol > 0 and nbrow == -(-k // brow)
              and nbcol == -(-n // bcol) and last == k - (nbrow - 1) * brow)  # fmt: skip
        total = nbrow * brow * nbcol * bcol
        if not ok or 2 * total > MAX_PACKED:
            raise ObjectError(addr, f"fp16 packed matrix fields {v} are not a consistent fbgemm PackedGemmMatrixFP16")
        data = np.frombuffer(ip.space.read(ip.ptr(mat + tp.fp16matrix.buf), 2 * total), dtype=np.float16)
        out = np.empty((n, k), dtype=np.float32)
        j = np.arange(n, dtype=np.int64)
        for lo in range(0, k, BAND):
            i = np.arange(lo, min(lo + BAND, k), dtype=np.int64)[:, None]
            blk = i // brow
            idx = (blk * nbcol * brow * bcol + (j[None, :] // bcol) * np.where(blk != nbrow - 1, brow, last) * bcol
                   + (i % brow) * bcol + j[None, :] % bcol)  # fmt: skip
            out[:, lo : lo + i.shape[0]] = data[idx].T
        bias = ip.ptr(plw + F.bias) if ip.space.read(plw + F.bias_engaged, 1)[0] == 1 else 0
        packing = {"engine": "fbgemm", "object": f"{plw:#x}", "kind": "linear", "block_rows": brow, "block_cols": bcol}
        return PackedLinear(out, "float16", [], [], bias, packing)

    def _depthwise(self, dw: int, kernel: list, owner: int) -> tuple[np.ndarray, dict]:
        """fbgemm's depthwise packing: the (channels x kernel positions) weight, one output channel per input one."""
        D = self.tp.dwconv
        c, kp = struct.unpack("<ii", self.ip.space.read(dw + D.channels, 4) + self.ip.space.read(dw + D.kernel_prod, 4))
        if not (0 < c <= MAX_DIM and 0 < kp <= 64 and len(kernel) == 2 and kernel[0] * kernel[1] == kp):
            raise ObjectError(owner, f"depthwise packing of {c} channels x {kp} kernel positions (kernel {kernel})")
        idx = depthwise_index(c, kp)
        data = np.frombuffer(self.ip.space.read(self.ip.ptr(dw + D.buf), int(idx.max()) + 1), dtype=np.int8)
        return data[idx], {}

    def _unpack(self, packb: int, owner: int) -> tuple[np.ndarray, dict]:
        """fbgemm's PackBMatrix as the (out, in) weight. Grouped (a grouped convolution's im2col matrix): `nrows` is
        every group's rows together, `ncols` one group's columns, and each group's matrix is packed alone, one
        after the other (measured against conv2d_unpack on 1 to 4 groups, one and several blocks): the groups'
        weights are stacked by output channel, as PyTorch holds them."""
        B = self.tp.packb
        names = ("nrows", "ncols", "groups", "brow", "bcol", "nbrow", "nbcol", "row_interleave")
        v = {n: struct.unpack("<i", self.ip.space.read(packb + getattr(B, n), 4))[0] for n in names}
        g, n, brow, bcol, ri = v["groups"], v["ncols"], v["brow"], v["bcol"], v["row_interleave"]
        k = v["nrows"] // g if 0 < g <= MAX_DIM else 0
        ok = (0 < k <= MAX_DIM and k * g == v["nrows"] and 0 < n <= MAX_DIM and brow > 0 and bcol > 0 and ri in (1, 2, 4, 8)
              and brow % ri == 0 and v["nbrow"] == -(-k // brow) and v["nbcol"] == -(-n // bcol))  # fmt: skip
        total = v["nbrow"] * brow * v["nbcol"] * bcol
        if not ok or total * g > MAX_PACKED:
            raise ObjectError(owner, f"packed matrix fields {v} are not a consistent fbgemm PackBMatrix")
        data = np.frombuffer(self.ip.space.read(self.ip.ptr(packb + B.buf), total * g), dtype=np.int8)
        out = np.empty((g * n, k), dtype=np.int8)  # the weight: out features x in features (B transposed)
        j = np.arange(n, dtype=np.int64)
        col = (j // bcol) * brow * bcol + (j % bcol) * ri
        for lo in range(0, k, BAND):
            i = np.arange(lo, min(lo + BAND, k), dtype=np.int64)
            row = (i // brow) * v["nbcol"] * brow * bcol + (i % brow // ri) * bcol * ri + i % ri
            for gi in range(g):
                out[gi * n : (gi + 1) * n, lo : lo + len(i)] = data[gi * total + row[:, None] + col[None, :]].T
        packing = {"block_rows": brow, "block_cols": bcol, "row_interleave": ri}
        return out, ({**packing, "groups": g} if g > 1 else packing)


def _as_conv1d(meta, owner: int):
    """A Conv1d's kept weight as its state_dict holds it: the (out, in, 1, k) tensor the packing made, without the 1."""
    import dataclasses

    if len(meta.shape) != 4 or meta.shape[2] != 1:
        raise ObjectError(owner, f"a Conv1d's kept weight of shape {list(meta.shape)}, not (out, in, 1, k)")
    return dataclasses.replace(meta, shape=(*meta.shape[:2], meta.shape[3]), stride=(*meta.stride[:2], meta.stride[3]))


def depthwise_index(channels: int, kp: int) -> np.ndarray:
    """Where element (channel, kernel position) of a depthwise weight lies in fbgemm's packed buffer: channels in
    blocks of 32, kernel positions in registers of 4 (kernel size rounded up to even), the last one or two positions
    interleaved two channels per pair when the kernel size leaves 1 or 2 over (fbgemm `PackedDepthWiseConvMatrix`).
    Checked against `conv2d_unpack` by `zen profile torch` before it is trusted."""
    r = np.arange(channels, dtype=np.int64)[:, None]
    c = np.arange(kp, dtype=np.int64)[None, :]
    aligned = (kp + 1) // 2 * 2
    block = (r // 32) * aligned
    pairs = (c >= kp // 4 * 4) & (kp % 4 in (1, 2))
    in_pairs = (block + (r % 16) // 8 + c // 4 * 4) * 32 + (r % 32) // 16 * 16 + 2 * (r % 8) + c % 4
    in_quads = (block + (r % 16) // 4 + c // 4 * 4) * 32 + (r % 32) // 16 * 16 + 4 * (r % 4) + c % 4
    return np.where(pairs, in_pairs, in_quads)


BASE = (1 << 62) + (1 << 60)  # where unpacked weights are placed in their own space (apart from any process address)


def packed_slots(ip: Interpreter, reader, index, root: int) -> tuple[list, set[str], dict[str, str]]:
    """(slots of every packed weight and bias under `root`, the paths of the LinearPackedParams and quantized Conv2ds
    and Conv1ds read, {path: why} for those not read). Keys follow PyTorch's state_dict: a Linear's
    `PATH._packed_params.weight` and `.bias` under the `PATH._packed_params` entry its `_save_to_state_dict` writes (a
    (weight, bias) tuple), a convolution's `PATH.weight` and `PATH.bias` (a Conv1d's weight 3-d, as its `weight()`)."""
    from zen.frontends.pytorch.mr import TensorSlot, tensor_record
    from zen.frontends.pytorch.subclasses import ClassLookup

    look = ClassLookup.shared(ip)
    targets = []  # (module path, node, kind, key prefix): state_dict keys as each module's _save_to_state_dict writes them
    for p, n in index.walk(root):
        mro = look.mro_names(n.type)
        if "_packed_params" in n.attrs and PACKED_PARAMS in mro:
            targets.append((p, n, "linear", f"{p}._packed_params."))
        elif "_packed_params" in n.attrs and QUANTIZED_CONV2D in mro:
            targets.append((p, n, "conv2d", f"{p}." if p else ""))
        elif "_packed_params" in n.attrs and QUANTIZED_CONV1D in mro:
            targets.append((p, n, "conv1d", f"{p}." if p else ""))
        elif "_packed_params" in n.attrs and (kt := next((k for c, k in QUANTIZED_CONVT.items() if c in mro), None)):
            targets.append((p, n, kt, f"{p}." if p else ""))
        elif "_packed_weight" in n.attrs and EMBEDDING_PACKED in mro:
            targets.append((p, n, "embedding", f"{p}." if p else ""))
    if not targets:
        return [], set(), {}
    recalibrate = "recalibrate it with `zen profile torch --python PYTHON_WITH_THAT_TORCH`"
    if not has_capsules(reader.tp):
        why = f"the torch {reader.tp.version} layout profile has no packed-object layout; {recalibrate}"
        return [], set(), {t[0]: why for t in targets}
    pr = PackedReader(ip, reader.tp) if has_packed_layout(reader.tp) else None
    got: list[tuple[str, str, PackedLinear]] = []
    failed: dict[str, str] = {}
    kept_out: list = []
    kept_paths: set[str] = set()
    for path, node, kind, prefix in targets:  # the engine's class, from the object's RTTI, says which layout holds it
        addr = node.attrs["_packed_weight" if kind == "embedding" else "_packed_params"]
        what = {"linear": "weight", "embedding": "table"}.get(kind, "convolution")
        try:
            obj = capsule_payload(ip, reader.tp, addr)
            cls = cpp_class(ip, obj)
            kc = kept_class(cls)
            fbgemm = "PackedLinearWeight" if kind == "linear" else "PackedConvWeight"
            if kind == "embedding":
                if "PackedEmbeddingBagWeight" not in cls:
                    raise ObjectError(addr, f"a packed embedding table of class {cls or 'unknown'}, not fbgemm's")
                if pr is None or "packedembedding" not in reader.tp.structs:
                    raise ObjectError(addr, f"the torch {reader.tp.version} layout profile has no fbgemm embedding "
                                      f"layout; {recalibrate}")  # fmt: skip
                got.append((path, prefix, pr.read_embedding(obj, addr, reader)))
            elif kc is not None:
                if not has_kept_layout(reader.tp, kc):
                    raise ObjectError(addr, f"the torch {reader.tp.version} layout profile has no {kc} layout; {recalibrate}")
                kept = read_kept(ip, reader, obj, addr, kc, RANK.get(kind, 4))
                if kind in ("conv1d", "convtranspose1d"):
                    kept.meta = _as_conv1d(kept.meta, addr)
                kept_out += kept_slots(ip, reader, kept, prefix, obj, kc, kind)
                kept_paths.add(path)
            elif kind == "linear" and "PackedLinearWeightFp16" in cls:  # dynamic quantization to float16
                if not all(x in reader.tp.structs for x in ("packedfp16", "fp16matrix")):
                    raise ObjectError(addr, f"the torch {reader.tp.version} layout profile has no fbgemm fp16 layout; "
                                      f"{recalibrate}")  # fmt: skip
                got.append((path, prefix, PackedReader(ip, reader.tp).read_fp16(obj, addr)))
            elif fbgemm in cls and kind == "conv3d" and pr is not None and "convpack3" in reader.tp.structs:
                got.append((path, prefix, pr.read(obj, addr, kind, cls)))  # fbgemm's 3-d packing: unpacked
            elif fbgemm in cls and kind in QUANTIZED_CONVT.values():
                raise ObjectError(addr, f"fbgemm packed this {kind} ({cls}), a layout zen does not read yet"
                                  + (f"; {recalibrate}" if kind == "conv3d" else ""))  # fmt: skip
            elif fbgemm in cls and "Fp16" not in cls:  # fbgemm's int8 packed weight: unpacked
                if pr is None or (kind != "linear" and not all(x in reader.tp.structs for x in ("packedconv", "convpack"))):
                    raise ObjectError(addr, f"the torch {reader.tp.version} layout profile has no fbgemm {fbgemm} "
                                      f"layout; {recalibrate}")  # fmt: skip
                pl = pr.read(obj, addr, "conv2d" if kind == "conv1d" else kind, cls)
                if kind == "conv1d":
                    if pl.weight.ndim != 4 or pl.weight.shape[2] != 1:
                        raise ObjectError(addr, f"a Conv1d packed with kernel {list(pl.weight.shape[2:])}, not (1, k)")
                    pl.weight, pl.packing["kind"] = np.ascontiguousarray(pl.weight[:, :, 0, :]), "conv1d"
                got.append((path, prefix, pl))
            else:
                raise ObjectError(addr, f"a packed {kind} of class {cls or 'unknown'}, a layout zen does not read yet")
        except ZenError as exc:
            failed[path] = f"its packed {what} could not be read: {exc}"
    chunks, regions, metas = [], [], []
    from zen.frontends.pytorch.tensors import TensorMeta
    from zen.memory.regions import Region
    from zen.memory.space import AddressSpace, BytesChunk

    at = BASE
    for path, _, pl in got:
        w = pl.weight
        chunks.append(BytesChunk(at, w.tobytes()))
        regions.append(Region(at, at + max(w.nbytes, 1), "r--p", f"unpacked {path}"))
        owner = int(pl.packing["object"], 16)
        strides = tuple(int(x) // w.itemsize for x in w.strides)
        dtype, st, was = {np.dtype(np.float32): ("float32", "F32", "float16"), np.dtype(np.uint8): ("uint8", "U8", "quint8")}.get(
            w.dtype, ("int8", "I8", "qint8"))  # fmt: skip
        metas.append(TensorMeta(owner, owner, dtype, w.itemsize, st, tuple(w.shape), strides, 0, w.size, "unpacked", False,
                                0, at, w.nbytes, f"torch.{was} (fbgemm packed weight)"))  # fmt: skip
        at += (w.nbytes + 4095) // 4096 * 4096 + 4096
    if got:
        ip.space.attach_device("unpacked", AddressSpace(regions, chunks, description="weights zen unpacked"))
    slots = []
    for (path, prefix, pl), meta in zip(got, metas):
        rec = tensor_record(f"{prefix}{pl.name}", "packed", meta.addr, meta, reader=reader)
        rec.device, rec.dtype = "cpu", meta.dtype
        if pl.qscheme == "float16":  # the weight PyTorch's unpack gives: float32 widened from the packed float16
            rec.quantization = {"dtype": "float16", "packed": pl.packing}
            rec.note = "unpacked by zen from fbgemm's float16 packed matrix, widened to float32 as PyTorch's unpack does"
        else:
            axis = {"axis": 0} if pl.qscheme.startswith("per_channel") else {}
            qdtype = "quint4x2" if pl.packing.get("bit_rate") == 4 else "quint8" if w.dtype == np.uint8 else "qint8"
            rec.quantization = {"dtype": qdtype, "qscheme": pl.qscheme, "scale": pl.scales, "zero_point": pl.zero_points,
                                **axis, "packed": pl.packing}  # fmt: skip
            rec.note = "unpacked by zen from fbgemm's depthwise packing"
            if pl.packing.get("kind") == "embedding":
                rec.note = (f"the table's rows read from fbgemm's fused {pl.packing['bit_rate']}-bit rows (each row's scale "
                            "and bias follow it; 4-bit: two values a byte, as the quint4x2 tensor stores them)")  # fmt: skip
            if "row_interleave" in pl.packing:
                rec.note = (f"unpacked by zen from fbgemm's packed buffer (blocks {pl.packing['block_rows']}x"
                            f"{pl.packing['block_cols']}, row interleave {pl.packing['row_interleave']})")  # fmt: skip
        slots.append(TensorSlot(rec.key, meta.addr, "packed", meta, rec))
        if pl.bias_impl:
            try:
                bmeta = reader.impl_meta(pl.bias_impl, pl.bias_impl)
                bmeta.python_type = python_type(ip, reader.tp, pl.bias_impl)
                brec = tensor_record(f"{prefix}bias", "packed", pl.bias_impl, bmeta, reader=reader)
                slots.append(TensorSlot(brec.key, pl.bias_impl, "packed", bmeta, brec))
            except ZenError as exc:
                failed[path] = f"its packed bias could not be read: {exc}"
    return slots + kept_out, ({p for p, _, _ in got} | kept_paths) - set(failed), failed
