"""Measure PyTorch's tensor layouts (THPVariable, TensorImpl, StorageImpl, AutogradMeta) with ctypes; TorchScript
modules and packed quantized weights in `torchscript/calibration.py` and `quantized/calibration.py`.

Same idea as the CPython calibrator: make tensors whose metadata we know (distinct sizes, strides,
offsets, dtypes, devices), read the C++ objects' bytes at the addresses torch itself reports
(`Tensor._cdata` is the TensorImpl*, `UntypedStorage._cdata` the StorageImpl*), and locate the
known values. Pointers are only followed inside this process's readable mappings. The dtype table
(TypeMeta index -> name, item size) is measured by making one tensor of every dtype torch has.

Standard library + torch only: it runs in the target's interpreter, not necessarily zen's.

    python -I -c 'import sys; sys.path.insert(0, SRC); from zen.frontends.pytorch.calibration import main; main()' -o FILE
"""

from __future__ import annotations

import platform
import struct
import sys

from zen.cpython.calibration.base import CalibrationFailed, CalibratorBase, common, one

FORMAT = 1
C10_DEVICE_TYPES = {
    1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga", 8: "maia", 9: "xla",
    10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia",
    20: "privateuseone",
}  # fmt: skip
SAFETENSORS = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
}  # fmt: skip


class TorchCalibrator(CalibratorBase):
    def __init__(self) -> None:
        super().__init__()
        import torch

        self.torch = torch

    def tensor_impl(self) -> None:
        torch, m = self.torch, self.m
        base = torch.arange(11 * 13 * 17 * 19 + 64, dtype=torch.float32)
        a = base[23:23 + 11 * 13 * 17 * 19].view(11, 13, 17, 19).transpose(1, 2)  # fmt: skip
        b = torch.arange(3 * 5 * 7, dtype=torch.float64)[5:].view(4, 25)[:, 1:]
        self.field("variable", "cdata", common("THPVariable.cdata", m.find_word(id(a), 64, a._cdata, 16),
                                                m.find_word(id(b), 64, b._cdata, 16)), "ptr")  # fmt: skip
        size = 512
        st_a, st_b = a.untyped_storage()._cdata, b.untyped_storage()._cdata
        self.field("tensorimpl", "storage", common("TensorImpl.storage_", m.find_word(a._cdata, size, st_a),
                                                   m.find_word(b._cdata, size, st_b)), "ptr")  # fmt: skip
        self.field("tensorimpl", "pyobj", common("TensorImpl.pyobj", m.find_word(a._cdata, size, id(a)),
                                                 m.find_word(b._cdata, size, id(b))), "ptr")  # fmt: skip
        raw_a, raw_b = m.raw(a._cdata, size), m.raw(b._cdata, size)
        sizes_a = raw_a.find(struct.pack("<4q", *a.shape))
        strides_a = raw_a.find(struct.pack("<4q", *a.stride()))
        sizes_b = raw_b.find(struct.pack("<2q", *b.shape))
        if min(sizes_a, strides_a) < 0 or sizes_a != sizes_b:
            raise CalibrationFailed("tensor sizes not found inline in TensorImpl")
        inline = (strides_a - sizes_a) // 8
        self.check(raw_b.find(struct.pack("<2q", *b.stride())) == strides_a, "strides follow the inline size slots")
        self.field("tensorimpl", "sizes", sizes_a, "items")
        self.field("tensorimpl", "strides", strides_a, "items")
        self.constants["SIZES_INLINE"] = inline
        self.provenance["constants.SIZES_INLINE"] = "measured: distance between inline sizes and strides"
        self.field("tensorimpl", "ndim", sizes_a - 8, "u64", "derived: the size_ word before the inline storage")
        self.check(m.word(a._cdata + sizes_a - 8) == 4 and m.word(b._cdata + sizes_a - 8) == 2, "ndim before sizes")
        self.field("tensorimpl", "storage_offset", common("TensorImpl.storage_offset_",
                   m.find_word(a._cdata, size, a.storage_offset(), strides_a + 8 * inline),
                   m.find_word(b._cdata, size, b.storage_offset(), strides_a + 8 * inline)), "i64")  # fmt: skip
        self.field("tensorimpl", "numel", common("TensorImpl.numel_",
                   m.find_word(a._cdata, size, a.numel(), strides_a + 8 * inline),
                   m.find_word(b._cdata, size, b.numel(), strides_a + 8 * inline)), "i64")  # fmt: skip
        # out-of-line sizes: more dims than the inline slots
        big = torch.zeros([2] * (inline + 2)).transpose(0, 3)
        ptr = m.word(big._cdata + sizes_a)
        n = inline + 2
        got = struct.unpack(f"<{2 * n}q", m.raw(ptr, 16 * n))
        self.check(m.word(big._cdata + sizes_a - 8) == n, "ndim counts out-of-line dims")
        self.check(list(got[:n]) == list(big.shape) and list(got[n:]) == list(big.stride()),
                   "out-of-line storage holds sizes then strides")  # fmt: skip
        self.constants["SIZES_OUT_OF_LINE"] = 1  # pointer in the first inline slot: sizes then strides
        self.provenance["constants.SIZES_OUT_OF_LINE"] = "measured on a tensor with more dims than inline slots"
        self.dtypes(raw_a)
        self.devices()
        self.autograd()

    def optional(self, what: str, module: str, name: str) -> None:
        """Measure a part only some images need (TorchScript, packed weights): when it fails on this torch, the
        profile is still written without it (and says why), and zen names such state unread instead of guessing."""
        import copy
        import importlib

        before = (copy.deepcopy(self.structs), dict(self.constants), len(self.checks), dict(self.provenance))
        try:
            getattr(importlib.import_module(module), name)(self)
        except (CalibrationFailed, AttributeError, RuntimeError, ImportError, TypeError, ValueError, IndexError, KeyError) as exc:
            self.structs, self.constants, self.provenance = before[0], before[1], before[3]
            del self.checks[before[2] :]
            self.provenance[f"not measured: {what}"] = str(exc)[:300]

    def dtypes(self, raw_a: bytes) -> None:
        torch, m = self.torch, self.m
        import warnings

        warnings.simplefilter("ignore")  # experimental/deprecated dtypes warn when created
        samples = {}
        for name in dir(torch):
            d = getattr(torch, name)
            if isinstance(d, torch.dtype) and str(d).split(".")[-1] not in samples:
                try:
                    samples[str(d).split(".")[-1]] = torch.empty(3, dtype=d)
                except (RuntimeError, TypeError):
                    continue
        f32, i64, f16 = samples["float32"], samples["int64"], samples["float16"]
        lo = self.off("tensorimpl", "numel") + 8
        cands = []
        for off in range(lo, 400, 2):
            vals = {k: struct.unpack("<H", m.raw(t._cdata + off, 2))[0] for k, t in samples.items()}
            if len(set(vals.values())) == len(vals) and vals["float32"] != vals["int64"] != vals["float16"]:
                cands.append(off)
        off = one("TensorImpl.data_type_", cands[:1])
        self.field("tensorimpl", "dtype", off, "u16")
        table = {}
        for k, t in samples.items():
            idx = struct.unpack("<H", m.raw(t._cdata + off, 2))[0]
            table[str(idx)] = {"name": k, "itemsize": t.element_size(), "safetensors": SAFETENSORS.get(k),
                               "floating": t.is_floating_point(), "complex": t.is_complex()}  # fmt: skip
        self.dtype_table = dict(sorted(table.items(), key=lambda kv: int(kv[0])))
        del f32, i64, f16

    def devices(self) -> None:
        torch, m = self.torch, self.m
        cpu = torch.zeros(4)
        meta = torch.empty(4, device="meta")
        lo = self.off("tensorimpl", "dtype") + 2
        rc, rm = m.raw(cpu._cdata + lo, 16), m.raw(meta._cdata + lo, 16)
        # Device is {int8 type, int8 index} inside an optional<Device>; CPU is type 0, index -1.
        pos = next((i for i in range(15) if rc[i] == 0 and rc[i + 1] == 0xFF and rm[i] != 0), None)
        if pos is None:
            raise CalibrationFailed("device field not found after the dtype")
        self.field("tensorimpl", "device_type", lo + pos, "u8")
        self.field("tensorimpl", "device_index", lo + pos + 1, "i8")
        self.device_types = {"0": "cpu", str(rm[pos]): "meta"}  # measured
        # The rest of c10::DeviceType cannot be created without the hardware: taken from c10's
        # header (stable since torch 1.x) and marked so in the provenance.
        for idx, name in C10_DEVICE_TYPES.items():
            self.device_types.setdefault(str(idx), name)
        self.provenance["device_types"] = "cpu and meta measured; others from c10/core/DeviceType.h"
        # torch.device objects (THPDevice: PyObject_HEAD, c10::Device): a meta device and cuda:5
        # (constructible without the hardware) locate {type, index}
        meta_type = rm[pos]
        d_meta, d_cuda = torch.device("meta"), torch.device("cuda", 5)
        r_meta, r_cuda = m.raw(id(d_meta), 64), m.raw(id(d_cuda), 64)
        at = next((i for i in range(16, 63) if (r_meta[i], r_meta[i + 1]) == (meta_type, 0xFF)
                   and (r_cuda[i], r_cuda[i + 1]) == (1, 5)), None)  # fmt: skip
        if at is None:
            raise CalibrationFailed("c10::Device not found in a torch.device object")
        self.field("thpdevice", "type", at, "u8")
        self.field("thpdevice", "index", at + 1, "i8")
        st = cpu.untyped_storage()
        self.field("storageimpl", "data", one("StorageImpl.data_ptr_", m.find_word(st._cdata, 128, st.data_ptr())[:1]), "ptr")
        sizes = [
            (t.untyped_storage()._cdata, t.untyped_storage().nbytes())
            for t in (torch.zeros(37), torch.zeros(101, dtype=torch.int16))
        ]
        self.field("storageimpl", "nbytes", common("StorageImpl.size_bytes_", *[m.find_word(a, 128, n) for a, n in sizes]), "i64")
        data = self.off("storageimpl", "data")
        raw = m.raw(st._cdata + data, self.off("storageimpl", "nbytes") - data)
        pos = next((i for i in range(8, len(raw) - 1) if raw[i] == 0 and raw[i + 1] == 0xFF), None)
        if pos is None:
            raise CalibrationFailed("device not found in the storage's DataPtr")
        self.field("storageimpl", "device_type", data + pos, "u8")

    def autograd(self) -> None:
        torch, m = self.torch, self.m
        on = [torch.zeros(n, requires_grad=True) for n in (3, 5, 7)]
        off = []
        for n in (4, 6, 8):
            t = torch.zeros(n)
            t.requires_grad_(True)
            t.requires_grad_(False)
            off.append(t)
        impl = self.off("tensorimpl", "storage")
        cands = [o for o in range(impl + 8, impl + 24, 8) if all(m.word(t._cdata + o) for t in on + off)]
        meta_off = one("TensorImpl.autograd_meta_", cands)
        self.field("tensorimpl", "autograd_meta", meta_off, "ptr")
        span = 512
        blocks_on = [m.raw(m.word(t._cdata + meta_off), span) for t in on]
        blocks_off = [m.raw(m.word(t._cdata + meta_off), span) for t in off]
        flag = [i for i in range(span) if all(b[i] == 1 for b in blocks_on) and all(b[i] == 0 for b in blocks_off)]
        self.field("autogradmeta", "requires_grad", one("AutogradMeta.requires_grad_", flag[:1]), "u8")

    def run(self) -> dict:
        self.tensor_impl()
        self.optional("TorchScript modules", "zen.frontends.pytorch.torchscript.calibration", "measure_jit")
        if "jitobject" in self.structs:
            self.optional("TorchScript constants and containers", "zen.frontends.pytorch.torchscript.calibration",
                          "measure_jit_values")  # fmt: skip
            self.optional("TorchScript code of loaded modules", "zen.frontends.pytorch.torchscript.source_calibration",
                          "measure_jit_source")  # fmt: skip
        if "jitnode" in self.structs:
            self.optional("TorchScript graph calls", "zen.frontends.pytorch.torchscript.graph_calibration",
                          "measure_jit_graph")  # fmt: skip
        if "SYM_ATTR_NAME" in self.constants:
            self.optional("TorchScript value types, constants and op names", "zen.frontends.pytorch.torchscript.type_calibration",
                          "measure_jit_types")  # fmt: skip
        if "jitsource" in self.structs and "jittype" in self.structs:
            self.optional("tensor constants of loaded TorchScript code", "zen.frontends.pytorch.torchscript.constant_calibration",
                          "measure_jit_constants")  # fmt: skip
        if "jitobject" in self.structs:  # packed weights are reached through TorchScript's Object layout
            self.optional("packed Linear weights", "zen.frontends.pytorch.quantized.calibration", "measure_packed")
            self.optional("fbgemm packed convolutions", "zen.frontends.pytorch.quantized.calibration", "measure_packed_conv")
            if "convpack" in self.structs:
                self.optional("fbgemm packed 3-d convolutions", "zen.frontends.pytorch.quantized.conv3d_calibration",
                              "measure_packed_conv3d")  # fmt: skip
            self.optional("fbgemm float16 Linears", "zen.frontends.pytorch.quantized.calibration", "measure_packed_fp16")
            self.optional("fbgemm embedding tables", "zen.frontends.pytorch.quantized.embedding_calibration",
                          "measure_embedding_bag")  # fmt: skip
        self.optional("quantizers", "zen.frontends.pytorch.quantized.kept_calibration", "measure_quantizer")
        if "jitobject" in self.structs and "qtensorimpl" in self.structs:  # packed objects that keep their weight
            for engine, kind in (("onednn", "conv"), ("onednn", "linear"), ("qnnpack", "conv"), ("qnnpack", "linear")):
                self.optional(f"{engine} packed {kind}", "zen.frontends.pytorch.quantized.kept_calibration",
                              f"measure_{engine}_{kind}")  # fmt: skip
        torch = self.torch
        return {
            "format": FORMAT,
            "kind": "torch-layout",
            "torch": {"version": torch.__version__.split("+")[0], "minor": ".".join(torch.__version__.split(".")[:2]),
                      "full_version": torch.__version__, "machine": platform.machine(), "python": platform.python_version()},
            "structs": {k: self.structs[k] for k in sorted(self.structs)},
            "constants": dict(sorted(self.constants.items())),
            "dtypes": self.dtype_table,
            "device_types": dict(sorted(self.device_types.items(), key=lambda kv: int(kv[0]))),
            "provenance": dict(sorted(self.provenance.items())),
            "self_checks": len(self.checks),
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from zen.cpython.calibration.entry import run_main

    return run_main(argv, "Measure this interpreter's PyTorch tensor layouts for zen.", lambda: TorchCalibrator().run(),
                    CalibrationFailed, needs="torch")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
