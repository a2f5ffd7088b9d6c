"""`zen recover --offload DIR|FILE`: offloaded tensors read from files the investigator supplies, never silently.

Why: a disk-offloaded tensor's bytes are not in the memory image; accelerate's hook names the file (its own
`KEY.dat`, a raw C-order array, or a key of the original checkpoint's safetensors file). The investigator who has
those files gives them with `--offload`; each tensor is then read from the file whose *name* matches what the hook
recorded, after checking that the file holds exactly the bytes the image's metadata (dtype, shape) implies. The
files are mapped into an address space of their own (the device "offload"), so the tensor writer streams them like
image memory; their sha256 go into the evidence, and each tensor's record says which file it came from.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
from pathlib import Path

from zen.frontends.pytorch.mr import TensorSlot, tensor_record
from zen.frontends.pytorch.tensors import TensorMeta, TensorReader
from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, MmapChunk
from zen.runtime.errors import ZenError

BASE = 1 << 62  # where the supplied files are mapped in their own space (apart from any process address)
STRIDE = 1 << 44  # room for each file
MAX_FILES = 100_000


def _files(paths: list[Path]) -> dict[str, Path]:
    """Basename -> file, from the files and the directories (not recursive) given."""
    out: dict[str, Path] = {}
    for p in paths:
        p = Path(p)
        if p.is_dir():
            for f in sorted(p.iterdir())[:MAX_FILES]:
                if f.is_file():
                    out.setdefault(f.name, f)
        elif p.is_file():
            out[p.name] = p
        else:
            raise ZenError(f"--offload {p}: no such file or directory", "give the folder accelerate offloaded to, or a file")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def attach(reader: TensorReader, slots: list[TensorSlot], paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Read every `offloaded` slot whose file was supplied. Returns (evidence entries, problems)."""
    given = _files(paths)
    space = reader.ip.space
    chunks, regions, used, evidence, problems = [], [], {}, [], []
    recorded: dict[str, dict] = {}  # key -> what the hook's index said
    for i, s in enumerate(slots):
        off = s.record.offload
        if s.record.status != "offloaded" or s.meta is None or off.get("from") != "file":
            continue
        f = given.get(os.path.basename(off["file"]))
        if f is None:
            continue
        try:
            start, size = _span(f, off, s.meta)
        except ZenError as exc:
            problems.append(f"{s.key}: --offload {f}: {exc}")
            continue
        if f not in used:
            base = BASE + len(used) * STRIDE
            fd = os.open(f, os.O_RDONLY)
            length = os.fstat(fd).st_size
            if length:
                mm = mmap.mmap(fd, length, prot=mmap.PROT_READ)
                chunks.append(MmapChunk(base, base + length, mm, 0, Source.IMAGE, fd))
                regions.append(Region(base, base + length, "r--p", str(f)))
            used[f] = base
            evidence.append({"path": str(f.resolve()), "size": length, "sha256": _sha256(f), "tensors": 0})
        m = s.meta
        meta = TensorMeta(m.addr, m.impl, m.dtype, m.itemsize, m.safetensors, m.shape, _c_strides(m.shape), 0, m.numel,
                          "offload", m.requires_grad, 0, used[f] + start, size, m.python_type)  # fmt: skip
        recorded[s.key] = off
        slots[i] = TensorSlot(s.key, s.addr, s.kind, meta, s.record)  # its record is made once the space is attached
        next(e for e in evidence if e["path"] == str(f.resolve()))["tensors"] += 1
    if not used:
        return evidence, problems
    space.attach_device("offload", AddressSpace(regions, chunks, description="files given with --offload"))
    for i, s in enumerate(slots):
        if s.meta is not None and s.meta.device == "offload":
            rec = tensor_record(s.key, s.kind, s.addr, s.meta, reader=reader)
            rec.device, rec.offload = "meta", {**recorded[s.key], "read_from": _path_of(s.meta, used)}
            rec.note = f"read from {rec.offload['read_from']} (given with --offload), not from the image"
            slots[i] = TensorSlot(s.key, s.addr, s.kind, s.meta, rec)
    return evidence, problems


def _path_of(meta: TensorMeta, used: dict[Path, int]) -> str:
    for f, base in used.items():
        if base <= meta.data_ptr < base + STRIDE:
            return str(f)
    return "?"


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= max(d, 1)
    return tuple(reversed(out))


def _span(f: Path, off: dict, meta: TensorMeta) -> tuple[int, int]:
    """(offset, size) of the tensor's bytes in file `f`, checked against the image's dtype and shape."""
    want = meta.numel * meta.itemsize
    if off.get("shape") and list(off["shape"]) != list(meta.shape):
        raise ZenError(f"the hook's index records shape {off['shape']}, the image's tensor has {list(meta.shape)}")
    size = f.stat().st_size
    if not off.get("weight_name"):  # accelerate's own KEY.dat: exactly the array's bytes
        if size != want:
            raise ZenError(f"holds {size:,} bytes; a {meta.dtype} tensor of shape {list(meta.shape)} has {want:,}")
        return 0, want
    from zen.represent.tensorfile import read_header

    with open(f, "rb") as fh:
        entries, _, data_start = read_header(f, fh, size)
    e = entries.get(off["weight_name"])
    if e is None:
        raise ZenError(f"has no tensor {off['weight_name']!r}")
    if list(e["shape"]) != list(meta.shape) or e["end"] - e["start"] != want or math.prod(e["shape"]) != meta.numel:
        raise ZenError(f"{off['weight_name']!r} is {e['dtype']} {e['shape']}; the image has {meta.dtype} {list(meta.shape)}")
    return data_start + e["start"], want
