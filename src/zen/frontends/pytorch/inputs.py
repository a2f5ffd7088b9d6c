"""Input recovery (AiP §5.2): tensors in the heap that look like what the model was last fed.

Candidates are live tensor objects that are neither parameters nor buffers (nor views of their
storage) and whose shape fits the model's first layer: [N, C, ...] with C = in_channels for a
convolution, [..., in_features] for a linear layer, integer ids below num_embeddings for an
embedding. The best few are written to inputs.safetensors so an investigator sees what the model
saw; the ranking prefers batched shapes and the first layer's dtype.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.tensors import TensorMeta, TensorReader
from zen.represent.mr import ModelMR
from zen.represent.safetensors_io import Entry, SafetensorsWriter
from zen.runtime.errors import ZenError

TOP = 5
MAX_EMBED_CHECK = 1 << 20
_INT_DTYPES = {"int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1"}


def first_layer(mr: ModelMR):
    """(kind, expected size, module) of the first input layer in registration order, or None."""
    for m in mr.modules:
        h = m.hyperparameters
        name = m.cls_qualname
        try:
            if name.startswith(("Conv", "LazyConv")) and "in_channels" in h and "ConvTranspose" not in name:
                dims = len(ast.literal_eval(h.get("kernel_size", "(1,)")))
                return "conv", int(ast.literal_eval(h["in_channels"])), dims, m
            if "in_features" in h and name in ("Linear", "Bilinear", "LazyLinear"):
                return "linear", int(ast.literal_eval(h["in_features"])), 0, m
            if name in ("Embedding", "EmbeddingBag") and "num_embeddings" in h:
                return "embedding", int(ast.literal_eval(h["num_embeddings"])), 0, m
        except (ValueError, SyntaxError, TypeError):
            continue
    return None


def _score(meta: TensorMeta, kind: str, size: int, dims: int, weight_dtype: str, reader: TensorReader) -> int | None:
    shape = meta.shape
    if not reader.has_data(meta) or meta.numel == 0:
        return None
    if kind == "conv":
        if len(shape) == dims + 2 and shape[1] == size:
            score = 3
        elif len(shape) == dims + 1 and shape[0] == size:
            score = 2
        else:
            return None
        return score + (meta.dtype == weight_dtype)
    if kind == "linear":
        if not shape or shape[-1] != size:
            return None
        return 2 + (len(shape) >= 2) + (meta.dtype == weight_dtype)
    if kind == "embedding":
        if meta.dtype not in _INT_DTYPES or not 1 <= len(shape) <= 2 or meta.numel > MAX_EMBED_CHECK:
            return None
        data = np.frombuffer(b"".join(reader.iter_bytes(meta)), dtype=_INT_DTYPES[meta.dtype])
        if data.size == 0 or data.min() < 0 or data.max() >= size:
            return None
        return 2 + (len(shape) == 2)
    return None


def recover_inputs(ip: Interpreter, reader: TensorReader, mr: ModelMR, slots, tensors: dict, path: Path) -> list[dict]:
    """Rank candidate inputs among `tensors` ({tensor type: object addresses}) and write the best."""
    layer = first_layer(mr)
    if layer is None:
        return []
    kind, size, dims, module = layer
    weight_key = f"{module.path}.weight" if module.path else "weight"
    weight_dtype = next((t.dtype for t in mr.tensors if t.key == weight_key), "float32")
    own = {s.addr for s in slots}
    storages = {s.meta.storage for s in slots if s.meta is not None and s.meta.storage}
    cands = []
    for addrs in tensors.values():
        for a in addrs.tolist():
            if a in own:
                continue
            try:
                meta = reader.meta(a)
                if meta.storage in storages:
                    continue
                score = _score(meta, kind, size, dims, weight_dtype, reader)
            except ZenError:
                continue
            if score is not None and meta.safetensors is not None:
                lo, hi = meta.extent()
                if ip.space.is_readable(meta.data_ptr + lo * meta.itemsize, (hi - lo) * meta.itemsize):
                    cands.append((score, meta))
    cands.sort(key=lambda sm: (-sm[0], -sm[1].numel, sm[1].addr))
    chosen = cands[:TOP]
    out = []
    if chosen:
        entries = [Entry(f"input_{i}", m.safetensors, m.shape, m.nbytes) for i, (_, m) in enumerate(chosen)]
        meta_info = {f"input_{i}": f"{m.addr:#x} {m.python_type}" for i, (_, m) in enumerate(chosen)}
        w = SafetensorsWriter(path, entries, {"producer": "zen", "first_layer": module.path, **meta_info})
        try:
            for i, (score, m) in enumerate(chosen):
                sha = w.write(f"input_{i}", reader.iter_bytes(m))
                out.append({"key": f"input_{i}", "address": f"{m.addr:#x}", "python_type": m.python_type, "dtype": m.dtype,
                            "shape": list(m.shape), "score": score, "sha256": sha,
                            "reason": f"fits {module.cls_qualname} at '{module.path}' ({kind} expecting {size})"})  # fmt: skip
            w.close()
        except BaseException:
            w.abort()
            raise
    return out
