"""Reading back a case's safetensors files as evidence: bounded header parse, one pass for every digest.

A weights file whose manifest hash was rewritten to match is still a lie unless its contents agree with mr.json:
every header entry must be well formed (known dtype, shape, offsets inside the data and tiling it exactly), and
every tensor's bytes must hash to the sha256 mr.json recorded when the tensor was read from the image. The file
is read once, sequentially: the file digest and every tensor digest come from the same pass.

A large file's digests are computed once per file state (`zen.evidence.digest_cache`, keyed by device, inode, size, mtime and
ctime): `zen recover` records those it took from the buffers it wrote, and the first reader those it computed; a
later reader of the unchanged file takes them from there (its header is still parsed and checked) instead of
hashing GBs twice. `reuse=False` (`zen verify-case`, `zen sign`) always reads and hashes the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAX_HEADER = 100 << 20  # safetensors' own limit for the JSON header
REUSE_ABOVE = 16 << 20  # smaller files hash faster than the digest cache answers (~0.01 s at 2 GB/s)
MAX_DIMS = 64
BLOCK = 16 << 20
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}  # fmt: skip
# torch / numpy dtype names in mr.json -> safetensors codes (others are not checked by name)
CODE_OF = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
           "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32", "int64": "I64", "uint64": "U64",
           "float64": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64"}  # fmt: skip


class TensorFileError(ValueError):
    """The file is not a well-formed safetensors file (the reason is the message)."""


@dataclass
class TensorFile:
    size: int
    sha256: str
    entries: dict[str, dict] = field(default_factory=dict)  # key -> {"dtype", "shape", "start", "end"}
    digests: dict[str, str] = field(default_factory=dict)  # key -> sha256 of its bytes
    metadata: dict = field(default_factory=dict)
    reused: str | None = None  # the digests were not computed in this run: when and by what (digest_cache)


def read_header(path: Path, fh, size: int) -> tuple[dict, dict, int]:
    """(entries: key -> dtype, shape, start, end in the data; __metadata__; where the data starts), every entry
    checked against the file's size; `fh` is at the file's start."""
    if size < 8:
        raise TensorFileError(f"{size} bytes: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", fh.read(8))
    if n > MAX_HEADER or 8 + n > size:
        raise TensorFileError(f"its header claims {n:,} bytes, the file has {size:,}")
    try:
        head = json.loads(fh.read(n))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise TensorFileError(f"its header is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(head, dict):
        raise TensorFileError("its header is not a JSON object")
    meta = head.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise TensorFileError("its __metadata__ is not a string map")
    data_len = size - 8 - n
    entries, spans = {}, []
    for key, e in head.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise TensorFileError(f"entry {key[:80]!r} is malformed")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in ITEMSIZE:
            raise TensorFileError(f"entry {key[:80]!r} has unknown dtype {str(dtype)[:20]!r}")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(type(d) is int and d >= 0 for d in shape)):  # fmt: skip
            raise TensorFileError(f"entry {key[:80]!r} has an invalid shape")
        if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs):
            raise TensorFileError(f"entry {key[:80]!r} has invalid data offsets")
        start, end = offs
        if not 0 <= start <= end <= data_len:
            raise TensorFileError(f"entry {key[:80]!r} lies outside the data ({start:,}..{end:,} of {data_len:,} bytes)")
        if math.prod(shape) * ITEMSIZE[dtype] != end - start:
            raise TensorFileError(f"entry {key[:80]!r}: {end - start:,} bytes do not hold shape {shape} of {dtype}")
        entries[key] = {"dtype": dtype, "shape": shape, "start": start, "end": end}
        spans.append((start, end, key))
    pos = 0
    for start, end, key in sorted(spans):
        if start != pos:
            raise TensorFileError(f"entry {key[:80]!r} starts at {start:,}: the data is not tiled by the entries")
        pos = end
    if pos != data_len:
        raise TensorFileError(f"{data_len - pos:,} bytes after the last entry belong to no tensor")
    return entries, meta, 8 + n


def read_tensor_file(path: Path, *, reuse: bool = True) -> TensorFile:
    """Parse and hash a safetensors file in one sequential pass (file digest + one digest per entry); with `reuse`,
    a large file's digests recorded for its present state are taken instead of hashing it."""
    from zen.evidence import digest_cache
    from zen.evidence.hashing import sha256, update_both

    path = Path(path)
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())  # the state of the file this reads, whatever the path names meanwhile
        size = st.st_size
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if size >= REUSE_ABOVE else None
        entries, meta, base = read_header(path, fh, size)
        known = digest_cache.lookup_tensor_file(path, key) if reuse and key is not None else None
        if known is not None and known["tensors"].keys() == entries.keys():
            return TensorFile(size, known["sha256"], entries, known["tensors"], meta, reused=known["how"])
        fh.seek(0)
        whole = sha256()
        order = sorted(entries, key=lambda k: entries[k]["start"])
        hashers = {k: sha256() for k in order}
        i, pos = 0, 0
        while block := fh.read(BLOCK):
            lo, hi = pos, pos + len(block)
            view = memoryview(block)
            done = lo  # the file's digest has every byte before this one
            j = i
            while j < len(order) and base + entries[order[j]]["start"] < hi:
                s, t = max(base + entries[order[j]]["start"], lo), min(base + entries[order[j]]["end"], hi)
                h = hashers[order[j]]
                if s < done:  # bytes the file's digest has (entries overlap: read_header refuses that today)
                    h.update(view[s - lo : min(t, done) - lo])
                    s = min(t, done)
                if t > s:
                    if s > done:  # the header (entries tile the rest: read_header checked)
                        whole.update(view[done - lo : s - lo])
                    update_both(h, whole, view[s - lo : t - lo])  # one pass for both digests
                    done = t
                j += 1
            if done < hi:
                whole.update(view[done - lo :])
            while i < len(order) and base + entries[order[i]]["end"] <= hi:  # entries finished in this block
                i += 1
            pos = hi
    tf = TensorFile(size, whole.hexdigest(), entries, {k: h.hexdigest() for k, h in hashers.items()}, meta)
    if key is not None:
        digest_cache.remember_tensor_file(path, tf.sha256, tf.digests, key)
    return tf


def cross_check(name: str, tf: TensorFile, records: list) -> list[str]:
    """Problems between a tensor file and the records that describe it (mr.json's tensors, inputs or extra):
    every written record's key, shape, dtype and sha256, and no entry that no record describes."""
    problems: list[str] = []
    described = set()
    for r in records:
        key = getattr(r, "key", None) if not isinstance(r, dict) else r.get("key")
        get = r.get if isinstance(r, dict) else lambda k, d=None, r=r: getattr(r, k, d)
        if get("status", "ok") != "ok" or key is None:
            continue
        # mr.json's input records are free-form: a crafted one may hold anything (a boolean shape was a TypeError)
        if type(key) is not str:
            problems.append(f"{name}: mr.json records a tensor whose key is not a string ({str(key)[:80]})")
            continue
        shape = get("shape") or []
        if not isinstance(shape, (list, tuple)) or not all(type(x) is int for x in shape):
            described.add(key)
            bad = str(shape)[:40]
            problems.append(f"{name}: mr.json records {key[:80]!r} with a shape that is not a list of integers ({bad})")
            continue
        e = tf.entries.get(key)
        if e is None:
            tied = get("tied_to")
            if tied and type(tied) is str and tied in tf.entries:
                described.add(key)
                continue
            problems.append(f"{name} lacks {key[:80]!r}, which mr.json records as recovered")
            continue
        described.add(key)
        if list(shape) != e["shape"]:
            problems.append(f"{name}: {key[:80]!r} has shape {e['shape']}, mr.json records {get('shape')}")
        code = CODE_OF.get(str(get("dtype", "")).replace("torch.", ""))
        if code is not None and code != e["dtype"]:
            problems.append(f"{name}: {key[:80]!r} is {e['dtype']}, mr.json records {get('dtype')}")
        want = get("sha256")
        if want and tf.digests.get(key) != want:
            problems.append(f"{name}: the bytes of {key[:80]!r} differ from those read from the image (sha256)")
    extra = sorted(set(tf.entries) - described)
    if extra:
        problems.append(f"{name} holds {len(extra)} tensor(s) mr.json does not record, e.g. {extra[0][:80]!r}")
    return problems
