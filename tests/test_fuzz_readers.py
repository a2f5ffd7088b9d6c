"""Readers on hostile memory: real objects with corrupted bytes, and random blobs that point at
real types. Nothing but zen's typed errors may escape, and every call must finish quickly."""

from __future__ import annotations

import random

import pytest
from conftest import zen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zen.cpython.code.codebuild import rebuild_code
from zen.cpython.describe import describe
from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.code import read_code
from zen.cpython.readers.containers import read_list, read_set, read_tuple
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.functions import read_function
from zen.cpython.readers.instances import read_instance
from zen.cpython.readers.modules import read_module
from zen.cpython.readers.types import read_type
from zen.memory import open_space
from zen.memory.overlay import overlay
from zen.memory.space import AddressSpace, BytesChunk
from zen.runtime.errors import ZenError

READERS = [
    lambda ip, a: ip.value(a),
    read_instance,
    read_type,
    read_function,
    read_code,
    rebuild_code,
    read_dict,
    read_set,
    read_tuple,
    read_list,
    read_module,
    describe,
]
SETTINGS = settings(
    max_examples=250, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def fuzz_base(light_target, workdir):
    img = workdir / "fuzz.core"
    zen("acquire", "--pid", light_target.pid, "-o", img, "--lean")
    space = open_space(img)
    ip = Interpreter.open(space)
    t = light_target.truth
    addrs = [e["id"] for e in t["values"].values()] + [e["id"] for e in t["instances"].values()]
    addrs += [e["id"] for e in t["types"].values()] + [e["id"] for e in t["functions"].values()]
    addrs += [e["code"] for e in t["functions"].values()] + [t["modules"]["__main__"]["id"]]
    yield space, ip, addrs
    space.close()
    img.unlink(missing_ok=True)


def run_all(ip: Interpreter, addr: int) -> None:
    for fn in READERS:
        try:
            fn(ip, addr)
        except ZenError:
            pass


@SETTINGS
@given(data=st.data())
def test_corrupted_real_objects(fuzz_base, data):
    space, ip0, addrs = fuzz_base
    addr = data.draw(st.sampled_from(addrs))
    patches = data.draw(st.lists(st.tuples(st.integers(-40, 320), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6))
    ps = overlay(space, {addr + off: blob for off, blob in patches})  # every reader sees it, the compiled one too
    run_all(Interpreter(ps, ip0.info, ip0.P), addr)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), plant=st.integers(0, 64))
def test_random_bytes_with_real_type_pointers(fuzz_base, seed, plant):
    space, ip0, _ = fuzz_base
    rng = random.Random(seed)
    blob = bytearray(rng.randbytes(1 << 14))
    types = list(ip0.wk.types.values())
    base = 0x10_0000_0000
    for _ in range(plant):  # object headers that dispatch to real readers
        off = rng.randrange(0, len(blob) - 16) & ~7
        blob[off : off + 8] = rng.choice([1, 2, 3, 1 << 20]).to_bytes(8, "little")
        blob[off + 8 : off + 16] = rng.choice(types).to_bytes(8, "little")
    rs = AddressSpace(space.regions, list(space.chunks) + [BytesChunk(base, bytes(blob))], description="random")
    ip = Interpreter(rs, ip0.info, ip0.P)
    for _ in range(16):
        run_all(ip, base + (rng.randrange(0, len(blob)) & ~7))


def test_census_on_random_memory(fuzz_base):
    """The census and GC walk on an image whose heap is noise: typed errors or results, no hang."""
    space, ip0, _ = fuzz_base
    rng = random.Random(7)
    chunks = [
        BytesChunk(c.start, rng.randbytes(c.end - c.start)) if not space.region_of(c.start).file_backed else c
        for c in space.chunks
        if c.end - c.start <= 1 << 22
    ]
    rs = AddressSpace(space.regions, chunks, description="noise")
    ip = Interpreter(rs, ip0.info, ip0.P)
    heap = Heap(ip)
    for op in (heap.all_types, heap.census, heap.gc_generations, heap.sys_modules, heap.threads):
        try:
            op()
        except ZenError:
            pass
