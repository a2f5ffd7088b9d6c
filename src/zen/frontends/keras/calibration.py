"""Measure TensorFlow's tensor and variable layouts with ctypes (`zen profile tf`).

Same method as the torch calibrator: make tensors whose contents and metadata we know, read the objects' bytes
at the addresses Python reports (`id()` of an EagerTensor, of a ResourceVariable's handle), and locate the known
values. Nothing is assumed but the pointer width: the pointer hops from an EagerTensor to its data buffer are
*searched* (every readable pointer of each object, to a bounded depth) for the chain that ends at bytes equal to the
tensor's contents, in samples of different dtypes and shapes; the shape encodings (inline 16/32-bit dims, out-of-line
vectors, inline and heap-allocated) are found by making tensors that need each; the dtype table by making one tensor
of every dtype TF has. The result is self-checked by decoding fresh tensors and variables of every dtype with the
shared decoder (`layout.py`) and comparing their bytes with `numpy()`.

Standard library + tensorflow (+ keras, for a check of the Python-side attributes): it runs in the target's
interpreter, not zen's (`zen profile tf --python EXE`).
"""

from __future__ import annotations

import bisect
import os
import platform
import struct
import sys

from zen.cpython.calibration.base import CalibrationFailed, CalibratorBase, Memory, common, one
from zen.frontends.keras.layout import LayoutError, TensorLayout, decode_tensor, read_std_string

FORMAT = 1
SAFETENSORS = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
}  # fmt: skip
KNOWN = 64  # bytes of known contents that identify a data buffer


class FastMemory(Memory):
    """`Memory` with a bisected map lookup: a TF process has thousands of mappings and the chain search asks often."""

    def refresh(self) -> None:
        super().refresh()
        self._starts = [lo for lo, _ in self._maps]

    def readable(self, addr: int, size: int) -> bool:
        if addr <= 0 or size < 0:
            return False
        for attempt in (0, 1):
            i = bisect.bisect_right(self._starts, addr) - 1
            if i >= 0 and addr + size <= self._maps[i][1]:
                return True
            if attempt == 0:
                self.refresh()
        return False


class TFCalibrator(CalibratorBase):
    def __init__(self) -> None:
        super().__init__()
        import numpy as np
        import tensorflow as tf

        self.tf, self.np = tf, np
        self.m = FastMemory()
        self.rng = np.random.default_rng(20260521)
        self.L: TensorLayout | None = None
        self.unsampled: list[str] = []  # self-check samples TF itself refuses to make

    # -- helpers -------------------------------------------------------------------------------
    def known(self, shape: tuple[int, ...], dtype: str):
        """A tensor whose bytes are distinctive (random integers, exactly representable in `dtype`)."""
        arr = self.rng.integers(1, 100, size=shape).astype(dtype) if dtype != "bool" else self.rng.integers(0, 2, shape) > 0
        return self.tf.constant(arr)

    def chains(self, start: int, spans: list[int], target: bytes) -> list[tuple[int, ...]]:
        """Offset paths (o1, ..., on): following the pointer at start+o1, then +o2, ..., the last pointer points at
        `target`. Only readable, 8-aligned pointers are followed; each level reads `spans[i]` bytes."""
        m, out = self.m, []

        def rec(addr: int, depth: int, path: tuple[int, ...]) -> None:
            raw = m.try_raw(addr, spans[depth])
            if raw is None:
                return
            for o in range(0, len(raw) - 7, 8):
                p = struct.unpack_from("<Q", raw, o)[0]
                if p < 4096 or p & 7:
                    continue
                if depth == len(spans) - 1:
                    if m.try_raw(p, len(target)) == target:
                        out.append((*path, o))
                elif m.readable(p, 8):
                    rec(p, depth + 1, (*path, o))

        rec(start, 0, ())
        return out

    def handle_of(self, t) -> int:
        return self.m.word(id(t) + self.off("eagertensor", "handle"))

    def tensor_in_handle(self, t) -> int:
        return self.handle_of(t) + self.off("tensorhandle", "tensor")

    def rep(self, t) -> bytes:
        return self.m.raw(self.tensor_in_handle(t) + self.off("tensor", "shape"), 16)

    # -- EagerTensor -> TensorHandle -> Tensor -> TensorBuffer -> data ---------------------------
    def eager(self) -> None:
        samples = [self.known((1000,), "float64"), self.known((3, 5, 7), "int32"), self.known((33, 17), "int64")]
        span0 = type(samples[0]).__basicsize__
        found = [self.chains(id(t), [span0, 512, 64], t.numpy().tobytes()[:KNOWN]) for t in samples]
        cands = set.intersection(*map(set, found))
        if not cands:
            raise CalibrationFailed(f"no pointer chain EagerTensor -> data common to all samples ({found})")
        # A TensorHandle may hold the tensor twice (LocalTensorHandleData's tensor_ and its forwarding-protection
        # copy share one buffer): the first is the tensor itself.
        handle, buf, data = min(cands)
        self.field("eagertensor", "handle", handle, "ptr", f"measured: chains common to 3 samples {sorted(cands)}")
        self.field("tensorbuffer", "data", data, "ptr", "measured: the pointer that reaches the known contents")
        numel = [t.shape.num_elements() for t in samples]
        # num_elements_ is the int64 just before buf_ in every sample; the 16-byte rep precedes it
        rel = [[o - 32 for o in self.m.find_word(self.m.word(id(t) + handle) + buf - 32, 32, n)] for t, n in zip(samples, numel)]
        num_rel = common("Tensor.num_elements_ (relative to buf_)", *rel)
        start = num_rel - 16
        self.field("tensor", "shape", 0, "rep", "derived: the 16-byte TensorShapeRep before num_elements_")
        self.field("tensor", "num_elements", num_rel - start, "i64", "measured: the element count before buf_")
        self.field("tensor", "buf", -start, "ptr", "measured: the pointer on the chain to the data")
        self.size("tensor", -start + 8, "derived: shape rep, num_elements_, buf_")
        self.field("tensorhandle", "tensor", buf + start, "struct", "derived: buf_ on the measured chain")
        self.constants["TENSORHANDLE_TENSOR_COPIES"] = len(cands)
        self.provenance["constants.TENSORHANDLE_TENSOR_COPIES"] = "measured: chains to the same buffer"

    # -- TensorShapeRep ---------------------------------------------------------------------------
    def shape_rep(self) -> None:
        tf, m = self.tf, self.m
        small = [self.known(s, d) for s, d in [((3, 5, 7), "int32"), ((1000,), "float64"), ((2, 3), "float32"),
                                              ((), "float32"), ((1, 2, 3, 4, 2, 1), "int8")]]  # fmt: skip
        rep32 = [tf.zeros((70000, 2), tf.int8), tf.zeros((2, 66000), tf.uint8), tf.zeros((65600,), tf.int8)]
        heap = [tf.zeros((1, 2, 3, 1, 2, 1, 2), tf.bool), tf.zeros((2, 1, 1, 2, 1, 1, 1, 3), tf.int16)]
        inline = [tf.zeros((70000, 1, 1, 2), tf.int8)]
        groups = {"rep16": small, "rep32": rep32, "out_of_line": heap + inline}
        reps = {k: [self.rep(t) for t in v] for k, v in groups.items()}
        every = [(t, r) for k in groups for t, r in zip(groups[k], reps[k])]
        ndims = [i for i in range(16) if all(r[i] == len(t.shape) for t, r in every)]
        ndims_off = one("TensorShapeRep ndims byte", ndims)
        dtype_cands = []
        for i in range(16):
            vals = {}
            for t, r in every:
                vals.setdefault(t.dtype.name, set()).add(r[i])
            if all(len(v) == 1 for v in vals.values()) and len({next(iter(v)) for v in vals.values()}) == len(vals):
                dtype_cands.append(i)
        dtype_off = one("TensorShapeRep dtype byte", [i for i in dtype_cands if i != ndims_off])
        tag_cands = []
        for i in range(16):
            if i in (ndims_off, dtype_off):
                continue
            per = {k: {r[i] for r in reps[k]} for k in reps}
            if all(len(v) == 1 for v in per.values()) and len({next(iter(v)) for v in per.values()}) == 3:
                tag_cands.append(i)
        tag_off = one("TensorShapeRep tag byte", tag_cands)
        tags = {k: reps[k][0][tag_off] for k in reps}
        self.field("shaperep", "dtype", dtype_off, "u8")
        self.field("shaperep", "ndims", ndims_off, "u8")
        self.field("shaperep", "tag", tag_off, "u8")
        for k, name in (("rep16", "TAG_REP16"), ("rep32", "TAG_REP32"), ("out_of_line", "TAG_OUT_OF_LINE")):
            self.constants[name] = tags[k]
            self.provenance[f"constants.{name}"] = f"measured on tensors that need the {k} encoding"
        dims16 = [[o for o in range(0, 16 - 2 * len(t.shape) + 1) if r[o:o + 2 * len(t.shape)] ==
                   struct.pack(f"<{len(t.shape)}H", *t.shape)] for t, r in zip(small, reps["rep16"]) if len(t.shape)]  # fmt: skip
        dims32 = [[o for o in range(0, 16 - 4 * len(t.shape) + 1) if r[o:o + 4 * len(t.shape)] ==
                   struct.pack(f"<{len(t.shape)}I", *t.shape)] for t, r in zip(rep32, reps["rep32"])]  # fmt: skip
        self.field("shaperep", "dims", common("TensorShapeRep inline dims (16 and 32 bit)", *dims16, *dims32), "items")
        ptrs = [[o for o in range(0, 9, 8) if m.readable(struct.unpack_from("<Q", r, o)[0], 8)] for r in reps["out_of_line"]]
        ool = common("TensorShapeRep out-of-line pointer", *ptrs)
        self.field("shaperep", "out_of_line", ool, "ptr")
        # absl::InlinedVector<int64_t, N>: {metadata = size << 1 | allocated, inline elements | {heap pointer, cap}}
        vecs = [struct.unpack_from("<Q", r, ool)[0] for r in reps["out_of_line"]]
        metas = [m.find_word(v, 64, (len(t.shape) << 1) | int(i < len(heap)))
                 for i, (t, v) in enumerate(zip(heap + inline, vecs))]  # fmt: skip
        self.field("inlinedvector", "metadata", common("InlinedVector metadata", *metas), "u64")
        packed = [struct.pack(f"<{len(t.shape)}q", *t.shape) for t in heap]
        heap_ptr = [[o for o in range(0, 57, 8) if m.try_raw(m.word(v + o), len(p)) == p] for v, p in zip(vecs, packed)]
        self.field("inlinedvector", "heap", common("InlinedVector heap pointer", *heap_ptr), "ptr")
        t = inline[0]
        raw = m.raw(vecs[-1], 64)
        p = struct.pack(f"<{len(t.shape)}q", *t.shape)
        self.field("inlinedvector", "inline", one("InlinedVector inline elements", [raw.find(p)] if p in raw else []), "items")
        # inline capacity: the largest rank whose (non-REP) dims stay inside the vector
        cap = 0
        for rank in range(4, 17):
            probe = tf.zeros((70000,) + (1,) * (rank - 1), tf.int8)
            vec = struct.unpack_from("<Q", self.rep(probe), ool)[0]
            meta = m.word(vec + self.off("inlinedvector", "metadata"))
            if meta & 1:
                break
            cap = rank
        self.check(cap >= 4, "an out-of-line shape of rank 4 keeps its dims inline")
        self.constants["INLINED_DIMS"] = cap
        self.provenance["constants.INLINED_DIMS"] = "measured: the largest rank whose dims were not heap-allocated"
        self.L = TensorLayout.from_profile(self.structs, self.constants)

    # -- the dtype table ----------------------------------------------------------------------------
    def dtypes(self) -> None:
        tf = self.tf
        table: dict[str, dict] = {}
        skipped = []
        for name in sorted(dir(tf.dtypes)):
            d = getattr(tf.dtypes, name)
            if not isinstance(d, tf.dtypes.DType) or d.name in {v["name"] for v in table.values()}:
                continue
            if d.name in ("resource", "variant") or d.name.endswith("_ref"):
                continue
            try:
                t = tf.constant(["zen"]) if d == tf.string else tf.zeros([3], dtype=d)
            except (TypeError, ValueError, tf.errors.OpError, NotImplementedError):
                skipped.append(d.name)
                continue
            enum = self.rep(t)[self.off("shaperep", "dtype")]
            self.check(enum == d.as_datatype_enum, f"dtype byte of {d.name} equals its DataType enum")
            table[str(enum)] = self._dtype_entry(d)
        v = tf.Variable([1.0, 2.0])
        r_enum = self.rep(v.handle)[self.off("shaperep", "dtype")]
        self.check(r_enum == tf.resource.as_datatype_enum, "a variable handle's dtype byte is DT_RESOURCE")
        table[str(r_enum)] = {"name": "resource", "itemsize": 0, "safetensors": None, "floating": False, "complex": False}
        self.constants["DT_RESOURCE"] = r_enum
        self.provenance["constants.DT_RESOURCE"] = "measured on a ResourceVariable's handle tensor"
        self.dtype_table = dict(sorted(table.items(), key=lambda kv: int(kv[0])))
        why = "measured: one tensor per tf.dtypes dtype"
        self.provenance["dtypes"] = why + (f"; not constructible: {skipped}" if skipped else "")

    def _dtype_entry(self, d) -> dict:
        size = 0 if d == self.tf.string else d.size
        return {"name": d.name, "itemsize": size, "safetensors": SAFETENSORS.get(d.name),
                "floating": bool(d.is_floating), "complex": bool(d.is_complex)}  # fmt: skip

    # -- ResourceVariable: handle -> ResourceHandle -> Var -> Tensor -> TensorBuffer -> data ---------
    def variable(self) -> None:
        tf, m, L = self.tf, self.m, self.L
        samples = [tf.Variable(self.known((1000,), "float64")), tf.Variable(self.known((7, 9), "int32")),
                   tf.Variable(self.known((4, 4, 4), "float32"))]  # fmt: skip
        found = []
        rhs = []
        for v in samples:
            h = decode_tensor(L, self.tensor_in_handle(v.handle), m.raw)
            self.check(h.dtype == self.constants["DT_RESOURCE"] and h.shape == (), "a variable handle is a resource scalar")
            rhs.append(h.data)
            target = v.numpy().tobytes()[:KNOWN]
            # ResourceHandle -> Var -> TensorBuffer, then the measured TensorBuffer::data_
            paths = self.chains(h.data, [512, 256], b"")  # every two-hop path; filtered below
            found.append([p for p in paths if self._reaches(h.data, (*p, L.buffer_data), target)])
        cands = set.intersection(*map(set, found))
        resource, var_buf = one("ResourceHandle.resource_ -> Var tensor_.buf_", cands)
        self.field("resourcehandle", "resource", resource, "ptr", "measured: the pointer to the variable's Var")
        self.field("var", "tensor", var_buf - L.tensor_buf, "struct", "derived: Var::tensor_ ends with the measured buf_")
        for v, rh in zip(samples, rhs):
            var = m.word(rh + resource)
            t = decode_tensor(L, var + self.off("var", "tensor"), m.raw)
            self.check(t.shape == tuple(v.shape) and t.dtype == v.dtype.as_datatype_enum, "Var::tensor_ decodes to the variable")
        # ResourceHandle::device_ (std::string): the variable's device name, {data pointer, size, ...}
        dev = samples[0].handle.device.encode()
        raw = m.raw(rhs[0], 256)
        spots = [o for o in range(0, 249, 8) if m.try_raw(struct.unpack_from("<Q", raw, o)[0], len(dev)) == dev
                 and len(dev) in struct.unpack_from("<2Q", raw, o + 8) if o + 24 <= 256]  # fmt: skip
        dev_off = min(spots) if spots else None
        if dev_off is None:
            raise CalibrationFailed(f"ResourceHandle::device_ ({dev!r}) not found")
        size_off = next(k for k in (8, 16) if struct.unpack_from("<Q", raw, dev_off + k)[0] == len(dev))
        self.field("resourcehandle", "device", dev_off, "string")
        self.field("stdstring", "data", 0, "ptr", "measured: the pointer to the device name")
        self.field("stdstring", "size", size_off, "u64", "measured: the device name's length after its pointer")
        self.check(read_std_string(rhs[1] + dev_off, m.raw, 0, size_off) == samples[1].handle.device, "device_ reads back")

    def _reaches(self, addr: int, path: tuple[int, ...], target: bytes) -> bool:
        """Whether following the pointers at `path` from `addr` ends at `target`. Every hop is read again and may be
        unreadable now: TF's threads run while we search, and a word that was a pointer when `chains` listed the
        path (a mutex, a refcount, a cache slot) can hold 0 moments later (seen under load as reads at 0x30/0x40)."""
        for o in path:
            raw = self.m.try_raw(addr + o, 8)
            if raw is None:
                return False
            addr = struct.unpack("<Q", raw)[0]
        return self.m.try_raw(addr, len(target)) == target

    # -- the Keras side (pure Python attributes the front end reads by name) ------------------------------
    def keras_side(self) -> dict:
        try:
            import keras
        except ImportError:
            return {}
        layer = keras.layers.Dense(3, name="zen_probe")
        layer.build((None, 2))
        k = layer.kernel
        self.check(hasattr(k, "_value") and isinstance(k._value, self.tf.Variable), "keras Variable keeps the TF one in _value")
        self.check(k._path == "zen_probe/kernel", "a keras Variable's _path is layer/name")
        self.check(any(v is k for v in layer._trainable_variables), "layers keep variables in _trainable_variables")
        t = decode_tensor(self.L, self.tensor_in_handle(k._value._handle), self.m.raw)
        self.check(t.dtype == self.constants["DT_RESOURCE"], "keras Variable._value._handle is a resource handle")
        return {"version": keras.__version__, "backend": keras.backend.backend()}

    # -- self-check on fresh samples ---------------------------------------------------------------
    def self_check(self) -> None:
        tf, m, L = self.tf, self.m, self.L
        shapes = [(), (5,), (3, 4), (2, 3, 5), (70000, 2), (1, 2, 1, 3, 1, 2, 1), (66000, 1, 1, 2)]
        resource = self.off("resourcehandle", "resource")
        for enum, d in self.dtype_table.items():
            if not d["itemsize"] or d["name"] == "resource":
                continue
            dt = tf.as_dtype(d["name"])
            for shape in shapes:
                n = 1
                for x in shape:
                    n *= x
                try:
                    t, var = self.sample(dt, shape, n, d["itemsize"])
                except (TypeError, ValueError, tf.errors.OpError, NotImplementedError) as exc:
                    self.unsampled.append(f"{d['name']}{list(shape)}: {type(exc).__name__}")
                    continue
                for obj, at in ((t, None), (var, "var")):
                    if obj is None:
                        continue
                    if at is None:
                        got = decode_tensor(L, self.tensor_in_handle(obj), m.raw)
                    else:
                        rh = decode_tensor(L, self.tensor_in_handle(obj.handle), m.raw).data
                        got = decode_tensor(L, m.word(rh + resource) + self.off("var", "tensor"), m.raw)
                    want = obj.numpy().tobytes()
                    ok = got.dtype == int(enum) and got.shape == shape and (not want or m.raw(got.data, len(want)) == want)
                    self.check(ok, f"{'variable' if at else 'tensor'} {d['name']}{list(shape)} decodes bit-exact")

    def sample(self, dt, shape: tuple[int, ...], n: int, itemsize: int):
        """A tensor of `dt` with random bits (zeros when large) and a variable holding it (None if TF refuses)."""
        tf = self.tf
        if dt == tf.bool:
            t = tf.constant(self.rng.integers(0, 2, shape) > 0)
        elif n > 1000:
            t = tf.zeros(shape, dt)
        else:
            raw = self.np.frombuffer(self.rng.bytes(n * itemsize), "u1")
            t = tf.bitcast(tf.constant(raw.reshape(*shape, itemsize) if itemsize > 1 else raw.reshape(shape)), dt)
        try:
            var = tf.Variable(t)
        except (TypeError, ValueError, tf.errors.OpError, NotImplementedError) as exc:
            self.unsampled.append(f"variable {dt.name}{list(shape)}: {type(exc).__name__}")
            var = None
        return t, var

    def run(self) -> dict:
        tf = self.tf
        self.eager()
        self.shape_rep()
        self.dtypes()
        self.variable()
        keras_info = self.keras_side()
        try:
            self.self_check()
        except LayoutError as exc:
            raise CalibrationFailed(f"self-check failed: {exc}") from None
        if self.unsampled:
            self.provenance["self_check.unsampled"] = "; ".join(sorted(set(self.unsampled)))
        return {
            "format": FORMAT,
            "kind": "tf-layout",
            "tensorflow": {"version": tf.__version__, "minor": ".".join(tf.__version__.split(".")[:2]),
                           "machine": platform.machine(), "python": platform.python_version(), "keras": keras_info},
            "structs": {k: self.structs[k] for k in sorted(self.structs)},
            "constants": dict(sorted(self.constants.items())),
            "dtypes": self.dtype_table,
            "provenance": dict(sorted(self.provenance.items())),
            "self_checks": len(self.checks),
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from zen.cpython.calibration.entry import run_main

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU tensors: their buffers are host memory
    return run_main(argv, "Measure this interpreter's TensorFlow tensor/variable layouts for zen.",
                    lambda: TFCalibrator().run(), CalibrationFailed, needs="tensorflow")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
