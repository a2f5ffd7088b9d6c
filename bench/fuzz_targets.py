"""The in-process fuzzing targets of bench/fuzz.py: real artefacts mutated structure-aware, one seed per input.

objects (an object's header, sizes or pointers rewritten in a real torch image), elf (its ELF header, program headers
and notes), case (one case file's JSON mutated, with and without the manifest's hash updated), containers (LiME and
AVML headers of a small physical image). bench/fuzz.py runs them under a timer and counts the outcomes.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.runtime.errors import ZenError  # noqa: E402

# -- mutations ---------------------------------------------------------------------------------

INTERESTING = [0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 32, (1 << 63) - 1, (1 << 64) - 1,
               1 << 40, 0x1000, 0xFFF]  # fmt: skip


def word(rng: random.Random, pointers: list[int]) -> int:
    """A value to plant in a word: small/boundary integers, real object pointers, near misses."""
    r = rng.random()
    if r < 0.35:
        return rng.choice(INTERESTING)
    if r < 0.75 and pointers:
        p = rng.choice(pointers)
        return (p + rng.choice([0, 0, 8, 16, -8, -16, 1, 4096])) % (1 << 64)
    return rng.getrandbits(64)


def patches_for(rng: random.Random, addr: int, pointers: list[int], span: int = 128) -> dict[int, bytes]:
    """Structure-aware patches of the object at `addr`: its header words (refcount, type), its
    size and pointer fields (words in its first `span` bytes), or flipped bits."""
    out: dict[int, bytes] = {}
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.2:
            off = 0  # refcount
        elif kind < 0.45:
            off = 8  # type pointer
        else:
            off = rng.randrange(0, span) & ~7
        if rng.random() < 0.25:
            out[addr + off + rng.randrange(8)] = bytes([1 << rng.randrange(8)])
        else:
            out[addr + off] = word(rng, pointers).to_bytes(8, "little")
    return out


def mutate_json(rng: random.Random, data):
    """One structure-aware change somewhere in parsed JSON."""
    import copy

    data = copy.deepcopy(data)
    path, node = [], data
    for _ in range(rng.randint(0, 6)):  # walk to a random container
        if isinstance(node, dict) and node:
            k = rng.choice(sorted(node))
        elif isinstance(node, list) and node:
            k = rng.randrange(len(node))
        else:
            break
        if not isinstance(node[k], (dict, list)):
            break
        path.append(k)
        node = node[k]
    replacements = [None, True, -1, 2**70, 1.5e308, "", "\udcff\ud800", "x" * 1000, [], {}, [[[[[]]]]],
                    {"kind": "zen-mr"}, "[/bold]<script>"]  # fmt: skip
    if isinstance(node, dict) and node:
        k = rng.choice(sorted(node))
        op = rng.random()
        if op < 0.6:
            node[k] = rng.choice(replacements)
        elif op < 0.8:
            del node[k]
        else:
            node[f"unknown{rng.randrange(99)}"] = rng.choice(replacements)
    elif isinstance(node, list) and node:
        i = rng.randrange(len(node))
        if rng.random() < 0.7:
            node[i] = rng.choice(replacements)
        else:
            node.insert(i, node[i])
    else:
        return rng.choice(replacements)
    if rng.random() < 0.05:  # deep nesting
        deep: list = []
        cur = deep
        for _ in range(rng.choice([150, 250, 900])):
            cur.append([])
            cur = cur[0]
        if isinstance(data, dict):
            data["deep"] = deep
    return data


# -- targets -----------------------------------------------------------------------------------


class ObjectsTarget:
    """Readers on real objects of a real torch image with corrupted headers and pointers."""

    limit = 10.0

    def __init__(self, image: Path, per_type: int = 60) -> None:
        import numpy as np

        from zen.cpython.heap import Heap
        from zen.cpython.interp import Interpreter
        from zen.frontends.pytorch.modules import MODULE_BASE, TENSOR_BASE
        from zen.frontends.pytorch.profile import load_torch_profile
        from zen.memory import open_space
        from zen.recover.run import torch_version

        self.space = open_space(image)
        self.ip = Interpreter.open(self.space)
        heap = Heap(self.ip)
        tv = torch_version(self.ip, heap)
        self.tprof = load_torch_profile(".".join(tv.split("+")[0].split(".")[:2]), tv)
        self.module_types = {t.addr: t for t in heap.subclasses_of(MODULE_BASE)}
        self.tensor_types = {t.addr for t in heap.subclasses_of(TENSOR_BASE)}
        wk = self.ip.wk.types
        wanted = {wk[k] for k in ("function", "code", "dict", "str", "tuple", "list", "type", "module") if k in wk}
        found = heap.instances_of_types(wanted | set(self.module_types) | self.tensor_types)
        rng = np.random.default_rng(0)
        self.objects: list[tuple[int, int]] = []  # (type, address)
        for t, addrs in sorted(found.items()):
            pick = addrs if len(addrs) <= per_type else rng.choice(addrs, per_type, replace=False)
            self.objects += [(t, int(a)) for a in pick]
        self.pointers = [a for _, a in self.objects] + list(wk.values())
        self.errors: Counter[str] = Counter()  # typed errors raised by the readers (mutations bite)

    def __call__(self, rng: random.Random) -> None:
        from zen.cpython.code.codebuild import rebuild_code
        from zen.cpython.describe import describe
        from zen.cpython.encode.snapshot import Encoder
        from zen.cpython.interp import Interpreter
        from zen.cpython.readers.code import read_code
        from zen.cpython.readers.dicts import read_dict
        from zen.cpython.readers.functions import read_function
        from zen.cpython.readers.instances import read_instance
        from zen.cpython.readers.types import read_type
        from zen.frontends.pytorch.modules import ModuleIndex
        from zen.frontends.pytorch.mr import module_record
        from zen.frontends.pytorch.tensors import TensorReader
        from zen.memory.overlay import overlay

        t, addr = rng.choice(self.objects)
        # the pages patched become chunks of their own: every reader (the compiled one too) reads the corruption
        ip = Interpreter(overlay(self.space, patches_for(rng, addr, self.pointers)), self.ip.info, self.ip.P)
        calls = [lambda: ip.value(addr), lambda: describe(ip, addr), lambda: read_instance(ip, addr),
                 lambda: read_type(ip, addr), lambda: read_function(ip, addr), lambda: read_code(ip, addr),
                 lambda: rebuild_code(ip, addr), lambda: read_dict(ip, addr), lambda: Encoder(ip).encode(addr)]  # fmt: skip
        if t in self.tensor_types:
            calls.append(lambda: TensorReader(ip, self.tprof).meta(addr))
        if t in self.module_types:
            index = ModuleIndex.__new__(ModuleIndex)
            index.ip = ip
            calls.append(lambda: module_record(ip, "x", index._read(addr, self.module_types[t]), self.tensor_types, []))
        for call in calls:
            try:
                call()
            except ZenError as exc:
                self.errors[type(exc).__name__] += 1


class ElfTarget:
    """The image's ELF header, program headers and notes patched in place, then opened."""

    limit = 60.0

    def __init__(self, image: Path, work: Path) -> None:
        from elftools.elf.elffile import ELFFile

        self.path = work / "elf-fuzz.core"
        shutil.copyfile(image, self.path)
        with open(self.path, "rb") as fh:
            elf = ELFFile(fh)
            phoff, phnum, phsize = elf.header["e_phoff"], elf.header["e_phnum"], elf.header["e_phentsize"]
            notes = [(s["p_offset"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_NOTE"]
        self.areas = [(0, 64), (phoff, phnum * phsize)] + [(o, min(n, 1 << 16)) for o, n in notes]

    def __call__(self, rng: random.Random) -> None:
        from zen.cpython.heap import Heap
        from zen.cpython.interp import Interpreter
        from zen.memory import open_space

        saved = []
        with open(self.path, "r+b") as fh:
            for _ in range(rng.randint(1, 6)):
                start, n = rng.choice(self.areas)
                off = start + (rng.randrange(n) & ~7 if rng.random() < 0.7 else rng.randrange(n))
                fh.seek(off)
                saved.append((off, fh.read(8)))
                fh.seek(off)
                fh.write(word(rng, []).to_bytes(8, "little")[: rng.choice([1, 2, 4, 8])])
        try:
            space = open_space(self.path)
            try:
                ip = Interpreter.open(space)
                Heap(ip).sys_modules()
            finally:
                space.close()
        finally:
            with open(self.path, "r+b") as fh:
                for off, old in reversed(saved):
                    fh.seek(off)
                    fh.write(old)


class CaseTarget:
    """One case file replaced by a JSON mutation (hash updated or not), then verified and loaded."""

    limit = 60.0
    FILES = ("manifest.json", "mr.json", "pr.json", "ur.json")

    def __init__(self, case: Path, work: Path) -> None:
        self.case = work / "case-fuzz"
        shutil.copytree(case, self.case)
        self.original = {n: (self.case / n).read_bytes() for n in self.FILES}
        self.parsed = {n: json.loads(b) for n, b in self.original.items()}

    def __call__(self, rng: random.Random) -> None:
        import hashlib

        from zen.represent import case

        name = rng.choice(self.FILES)
        mutated = mutate_json(rng, self.parsed[name])
        text = json.dumps(mutated, ensure_ascii=False).encode("utf-8", "backslashreplace")
        if rng.random() < 0.1:
            text = text[: rng.randrange(len(text) + 1)]
        elif rng.random() < 0.03:  # nesting far beyond any parser's recursion limit
            text = b"[" * 100_000 + b"]" * 100_000
        try:
            (self.case / name).write_bytes(text)
            if name != "manifest.json" and rng.random() < 0.7:  # crafted: the manifest agrees
                man = dict(self.parsed["manifest.json"])
                man["files"] = {**man["files"], name: hashlib.sha256(text).hexdigest()}
                (self.case / "manifest.json").write_text(json.dumps(man))
            m = case.load_manifest(self.case)
            case.integrity(self.case, m)
            case.load_mr(self.case)
            case.load_pr(self.case)
            case.load_ur(self.case)
        finally:
            for n, b in self.original.items():
                (self.case / n).write_bytes(b)


class ContainersTarget:
    """LiME and AVML containers around real memory bytes, headers mutated, parsed and read."""

    limit = 30.0

    def __init__(self, image: Path, work: Path) -> None:
        with open(image, "rb") as fh:
            fh.seek(1 << 20)
            self.payload = fh.read(1 << 18)
        self.work = work

    def _lime(self, rng: random.Random) -> bytearray:
        out = bytearray()
        phys = 0
        for _ in range(rng.randint(1, 4)):
            n = rng.choice([4096, 8192, 65536])
            out += struct.pack("<IIQQQ", 0x4C694D45, 1, phys, phys + n - 1, 0) + self.payload[:n]
            phys += n + rng.choice([0, 4096])
        return out

    def __call__(self, rng: random.Random) -> None:
        from zen.memory.system.formats import open_physical, sniff

        blob = self._lime(rng)
        for _ in range(rng.randint(1, 5)):
            off = rng.randrange(0, min(len(blob), 256)) if rng.random() < 0.6 else rng.randrange(len(blob))
            blob[off : off + 8] = word(rng, []).to_bytes(8, "little")
        if rng.random() < 0.2:
            blob = blob[: rng.randrange(len(blob))]
        path = self.work / "container.lime"
        path.write_bytes(bytes(blob) + bytes(max(0, 4096 - len(blob))))
        fmt = sniff(path)
        if fmt is None:
            return
        img = open_physical(path, fmt)
        try:
            for seg in getattr(img, "segments", [])[:16]:
                img.physical_run(seg.start, min(4096, seg.end - seg.start))
        finally:
            close = getattr(img, "close", None)
            if close:
                close()
