"""A case's safetensors file as torch tensors, each in its own freshly allocated memory, read once.

Why not `safetensors.torch.load_file`: it maps the file and returns views into the mapping, and a rebuilt model
must own aligned memory (CPU kernels pick SIMD paths, and so rounding, by alignment: outputs would not be
bit-identical), so every view had to be cloned, and the mapped pages stayed resident beside the clones: a process
loading a model peaked at twice its bytes (issue 49.4). Here each tensor is allocated by torch (64-byte aligned)
and filled with `preadv` straight from the file: the model is in memory once, and nothing else is.

The header is parsed by zen's own bounded reader (`zen.represent.tensorfile.read_header`): every entry checked
against the file's size before anything is allocated, and keys that are not valid UTF-8 (a CPython str may hold a
lone surrogate; zen writes it as its JSON escape, which the Rust loader refuses) read back losslessly. A file
that reader refuses (a third party's, not tiled exactly) is loaded by safetensors and copied, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from zen.runtime.errors import ZenError

CHUNK = 1 << 30  # one preadv at most: Linux moves at most 2 GiB - 4 KiB per call
TORCH_DTYPE = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
               "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64",
               "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
               "C64": "complex64"}  # fmt: skip


def load_safetensors(path: Path) -> dict:
    """name -> torch tensor for every tensor of `path` (`{}` when there is no such file)."""
    from zen.represent.tensorfile import TensorFileError, read_header

    path = Path(path)
    if not path.is_file():
        return {}
    with open(path, "rb", buffering=0) as fh:
        try:
            entries, _meta, base = read_header(path, fh, os.fstat(fh.fileno()).st_size)
        except TensorFileError as exc:
            return _by_safetensors(path, exc)
        return {key: _read(fh.fileno(), e, base, path, key) for key, e in entries.items()}


def _read(fd: int, e: dict, base: int, path: Path, key: str):
    import torch

    dtype = getattr(torch, TORCH_DTYPE[e["dtype"]], None)
    if dtype is None:
        raise ZenError(f"{path}: tensor {key[:80]!r} is {e['dtype']}, which this torch has no dtype for",
                       f"load it with a torch that has {TORCH_DTYPE[e['dtype']]}")  # fmt: skip
    nbytes = e["end"] - e["start"]
    raw = torch.empty(nbytes, dtype=torch.uint8)
    view = memoryview(raw.numpy()) if nbytes else memoryview(b"")
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [view[done : done + CHUNK]], base + e["start"] + done)
        if got <= 0:
            raise ZenError(f"{path} ended inside tensor {key[:80]!r}", "recover the case again")
        done += got
    return raw.view(dtype).reshape(e["shape"])


def _by_safetensors(path: Path, why: Exception) -> dict:
    """A file zen's reader refuses: safetensors' own loader, each tensor copied out of its mapping."""
    from safetensors.torch import load_file

    try:
        loaded = load_file(str(path))
    except Exception:  # noqa: BLE001 - safetensors raises several types for a bad file
        raise ZenError(f"{path} is not a readable safetensors file: {why}", "recover the case again") from None
    out = {}
    for k in list(loaded):
        out[k] = loaded.pop(k).clone()
    return out
