"""The fast census paths find exactly what the full scans find, on a real model process's image.

`Heap` answers most questions from a pointer map (the ranges of the image that hold any
user-space pointer, built in the first pass) instead of scanning the whole image again, and the
scan reuses its scratch arrays; `zen recover` takes the weights file's sha256 while writing it and
the image's in a thread with one reused buffer. None of that may change a result: each is checked
here against the plain way of computing the same thing (whole-image scans, hashing the files
afterwards) and against the ground truth written by the process itself.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import opened_heap, recovered

from zen.cpython.heap import Heap
from zen.frontends.pytorch.modules import MODULE_BASE, TENSOR_BASE
from zen.memory.scan import find_u64_in, find_u64_in_mapped, find_u64_in_ranges, writable_chunks
from zen.represent.safetensors_io import SLICE, STAGE, Entry, SafetensorsWriter


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def zoo_heap(zoo_image):
    img, target = zoo_image
    with opened_heap(img) as (ip, heap):
        yield ip, heap, target


def _census_types(ip, heap) -> list[int]:
    tensors = {t.addr for t in heap.subclasses_of(TENSOR_BASE)}
    modules = {t.addr for t in heap.subclasses_of(MODULE_BASE)}
    return sorted(tensors | modules | {ip.wk.types["function"], ip.wk.types["code"]})


def test_pointer_map_scan_equals_full_scan(zoo_heap):
    """Every hit of a whole-image scan for the census's types is found in the pointer map's
    ranges, and the first (mapping) pass finds the same words as a plain scan."""
    ip, heap, _ = zoo_heap
    types = _census_types(ip, heap)
    assert len(types) > 100  # torch's tensor and module classes, function and code
    chunks = writable_chunks(ip.space)
    full_hits, full_vals = find_u64_in(ip.space, types, chunks)
    lo, hi = heap._pointer_span()  # noqa: SLF001 (the span the recover pass uses)
    map_hits, map_vals, ranges = find_u64_in_mapped(ip.space, types, chunks, lo, hi)
    assert np.array_equal(full_hits, map_hits) and np.array_equal(full_vals, map_vals)
    r_hits, r_vals = find_u64_in_ranges(ip.space, types, ranges)
    assert np.array_equal(full_hits, r_hits) and np.array_equal(full_vals, r_vals)
    assert full_hits.size > 10_000  # one hit per live function, code object, module, tensor
    mapped = sum(b - a for a, b in ranges)
    assert mapped < sum(c.end - c.start for c in chunks)  # the map leaves tensor data out


def test_fast_census_equals_full_census(zoo_heap):
    """`instances_of_types` through the pointer map finds the same objects as without it, and
    every module the process itself listed in its ground truth is among them."""
    ip, heap, target = zoo_heap
    types = _census_types(ip, heap)
    fast = heap.instances_of_types(types)
    assert "pointer_map" in heap._memo  # noqa: SLF001 (the fast path was taken)
    slow_heap = Heap(ip)
    slow_heap._memo = dict(heap._memo, pointer_span=None, pointer_map=None)  # noqa: SLF001 (plain scans)
    slow = slow_heap.instances_of_types(types)
    assert fast.keys() == slow.keys()
    for t in types:
        assert np.array_equal(fast[t], slow[t]), hex(t)
    found = {int(a) for t, addrs in fast.items() for a in addrs.tolist()}
    truth_modules = {m["address"] for model in target.truth["models"].values() for m in model["modules"]}
    assert truth_modules and truth_modules <= found


def test_streamed_file_digest_matches_file(tmp_path):
    """The writer's sha256 of its file (each piece staged and hashed twice a slice at a time) is the sha256 of the
    bytes on disk, and each tensor's digest is that of its bytes, whatever the pieces' sizes and formats."""
    rng = np.random.default_rng(7)
    blobs = {
        "big": rng.integers(0, 255, SLICE * 3 + 12, dtype=np.uint8).tobytes(),
        "small": rng.integers(0, 255, 1000, dtype=np.uint8).tobytes(),
        "odd": rng.integers(0, 255, SLICE + 5, dtype=np.uint8).tobytes(),
        "staged": rng.integers(0, 255, STAGE + 7, dtype=np.uint8).tobytes(),  # past one staging block
    }
    path = tmp_path / "t.safetensors"
    w = SafetensorsWriter(path, [Entry(k, "U8", (len(v),), len(v)) for k, v in blobs.items()], {"producer": "test"})
    for k, v in blobs.items():
        pieces = [v[i : i + SLICE + 3] for i in range(0, len(v), SLICE + 3)]  # mixed sizes
        if k == "staged":  # a memoryview of 4-byte items first, as a numpy buffer can give
            pieces = [memoryview(v[:4096]).cast("I"), v[4096:]]
        assert w.write(k, pieces) == hashlib.sha256(v).hexdigest()
    w.close()
    assert w.file_sha256 == _sha256(path)
    from safetensors.numpy import load_file

    loaded = load_file(str(path))
    assert all(loaded[k].tobytes() == v for k, v in blobs.items())


def test_recover_digests_are_those_of_the_files(zoo_image, workdir):
    """The manifest's sha256 of the weights (taken while writing) and of the image (taken in a
    thread while the analysis ran) equal the digests of the files on disk."""
    img, target = zoo_image
    name = next(iter(target.truth["models"]))
    case, mr, manifest, _ = recovered(img, target, name, workdir)
    assert manifest["files"]["weights.safetensors"] == _sha256(case / "weights.safetensors")
    assert manifest["evidence"]["sha256"] == _sha256(img)
    raw = (case / "weights.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    written = [t for t in mr["tensors"] if t["key"] in header]
    assert written and all(t["status"] == "ok" for t in written)
    for t in written:  # each tensor's digest (taken in the main thread) is that of its bytes
        a, b = header[t["key"]]["data_offsets"]
        assert t["sha256"] == hashlib.sha256(data[a:b]).hexdigest(), t["key"]
