"""Fuzzing what reads evidence (issue 20): mutated real images and case files, counted.

    python bench/fuzz.py [--budget N] [--recover N] [--seed S] [--dir DIR] [--out FILE]

Inputs are *real* artefacts, mutated structure-aware, one seed per input (reproducible with
`--seed`):
  * objects    - a real torch process image opened once; one object (module, tensor, function,
                 code, type, dict, str, ...) gets its header, size fields or pointers rewritten
                 (refcount, type pointer, pointers aimed at itself, other objects, unmapped or
                 region-end addresses, bit flips) and every object reader, the tensor reader and the
                 module reader run on it;
  * elf        - the same image's ELF header, program headers and notes (NT_FILE, NT_PRSTATUS, zen's
                 acquisition note) patched in place; the image is opened, the interpreter found and
                 sys.modules read;
  * case       - one file of a real case directory replaced by a mutation of its JSON (values of
                 the wrong type, deleted or unknown fields, deep nesting, huge numbers, lone
                 surrogates), with and without the manifest's hash updated to match; the case is
                 verified and loaded;
  * containers - LiME and AVML headers of a small physical image made from the process image's
                 bytes, mutated; the container is parsed and every segment read;
  * recover    - (`--recover N`) the whole `zen recover` CLI, in its own process, on copies of the
                 image with mutated headers and objects: exit code histogram, no traceback;
  * hostile    - (`--hostile`, default on) the hostile target process (tests/targets/hostile_target.py)
                 imaged and recovered: time, peak RSS, tensors bit-exact, whether any hook ran.
Each in-process input runs under a timer (a hang is an input still running after its limit); a
crash is any exception other than zen's typed errors. Results, with the slowest inputs and every
crash's seed and message, go to bench/results/fuzz.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from zen.errors import ZenError  # noqa: E402
from zen.memory.space import AddressSpace  # noqa: E402

Target = Callable[[random.Random], None]


class Hang(BaseException):
    """Raised by the timer in an input that ran past its limit (BaseException: code under test
    that catches Exception cannot swallow it)."""


def _alarm(signum, frame):
    raise Hang()


class Tally:
    """Outcomes of one target: counts per outcome, the crashes and hangs with their seeds."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.outcomes: Counter[str] = Counter()
        self.crashes: list[tuple[int, str]] = []
        self.hangs: list[int] = []
        self.max_seconds = 0.0
        self.slowest_seed: int | None = None
        self.seconds = 0.0

    @property
    def runs(self) -> int:
        return sum(self.outcomes.values())

    def run(self, target: Target, seed: int, limit: float) -> None:
        signal.signal(signal.SIGALRM, _alarm)
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            target(random.Random(seed))
            outcome = "ok"
        except Hang:
            outcome = "hang"
            self.hangs.append(seed)
        except ZenError as exc:
            outcome = f"{type(exc).__name__} (exit {exc.exit_code})"
        except Exception as exc:  # a crash: a bug in zen
            outcome = "crash"
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            self.crashes.append((seed, f"{type(exc).__name__}: {str(exc)[:160]} at {Path(tb.filename).name}:{tb.lineno}"))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t0
        self.seconds += dt
        if dt > self.max_seconds:
            self.max_seconds, self.slowest_seed = dt, seed
        self.outcomes[outcome] += 1


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
        from zen.recover import torch_version

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
        self.patched = _Patched(self.space)
        self.errors: Counter[str] = Counter()  # typed errors raised by the readers (mutations bite)

    def __call__(self, rng: random.Random) -> None:
        from zen.cpython.codebuild import rebuild_code
        from zen.cpython.describe import describe
        from zen.cpython.interp import Interpreter
        from zen.cpython.readers.code import read_code
        from zen.cpython.readers.dicts import read_dict
        from zen.cpython.readers.functions import read_function
        from zen.cpython.readers.instances import read_instance
        from zen.cpython.readers.types import read_type
        from zen.cpython.snapshot import Encoder
        from zen.frontends.pytorch.modules import ModuleIndex
        from zen.frontends.pytorch.mr import module_record
        from zen.frontends.pytorch.tensors import TensorReader

        t, addr = rng.choice(self.objects)
        self.patched.patches = patches_for(rng, addr, self.pointers)
        ip = Interpreter(self.patched, self.ip.info, self.ip.P)
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


class _Patched(AddressSpace):
    """An address space with some bytes overwritten (`patches`, set per input). Every typed read
    (u64, i64, u32, views) goes through `read`/`view`, so readers see the corruption."""

    def __init__(self, base: AddressSpace) -> None:
        super().__init__(base.regions, base.chunks, description="patched")
        self.patches: dict[int, bytes] = {}

    def read(self, addr: int, size: int) -> bytes:
        data = super().read(addr, size)
        hit = [(a, b) for a, b in self.patches.items() if a < addr + size and a + len(b) > addr]
        if not hit:
            return data
        buf = bytearray(data)
        for at, blob in hit:
            lo, hi = max(at, addr), min(at + len(blob), addr + size)
            buf[lo - addr : hi - addr] = blob[lo - at : hi - at]
        return bytes(buf)

    def view(self, addr: int, size: int) -> bytes:
        return self.read(addr, size)


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


def recover_runs(image: Path, work: Path, n: int, seed: int) -> tuple[Counter, list[str], float]:
    """`zen recover` (the CLI, in its own process) on the image with mutated headers and data
    words, patched in place and restored after each run: exit codes, tracebacks, slowest run."""
    target = ElfTarget(image, work)
    size = target.path.stat().st_size
    codes: Counter[int | str] = Counter()
    bad: list[str] = []
    slowest = 0.0
    for i in range(n):
        rng = random.Random(seed + i)
        saved = []
        with open(target.path, "r+b") as fh:
            for _ in range(rng.randint(1, 8)):
                if rng.random() < 0.4:
                    start, m = rng.choice(target.areas)
                    off = start + (rng.randrange(m) & ~7)
                else:
                    off = rng.randrange(size - 8) & ~7
                fh.seek(off)
                saved.append((off, fh.read(8)))
                fh.seek(off)
                fh.write(word(rng, []).to_bytes(8, "little"))
        case = work / f"recover-{i}"
        t0 = time.perf_counter()
        try:
            res = subprocess.run([sys.executable, "-m", "zen", "recover", str(target.path), "-o", str(case)],
                                 capture_output=True, text=True, timeout=300, cwd=work)  # fmt: skip
            codes[res.returncode] += 1
            if "Traceback" in res.stderr or res.returncode == 70:
                bad.append(f"seed {seed + i}: exit {res.returncode}: {res.stderr.strip().splitlines()[-1][:200]}")
        except subprocess.TimeoutExpired:
            codes["hang"] += 1
            bad.append(f"seed {seed + i}: no result in 300 s")
        slowest = max(slowest, time.perf_counter() - t0)
        shutil.rmtree(case, ignore_errors=True)
        with open(target.path, "r+b") as fh:
            for off, old in reversed(saved):
                fh.seek(off)
                fh.write(old)
    return codes, bad, slowest


def hostile_run(work: Path) -> dict:
    """The hostile target (tests/targets/hostile_target.py) imaged and recovered by the CLI: wall
    time and peak RSS of `zen recover` (its own process), exit code, problems, tensors bit-exact."""
    import hashlib

    from safetensors.numpy import load_file

    out = work / "hostile"
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "targets" / "hostile_target.py"), str(out)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        if proc.stdout.readline().strip() != "READY":
            raise SystemExit("the hostile target did not start")
        image = work / "hostile.core"
        subprocess.run([sys.executable, "-m", "zen", "acquire", "--pid", str(proc.pid), "-o", str(image)], check=True,
                       capture_output=True)  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    truth = json.loads((out / "truth.json").read_text())
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "zen", "recover", str(image), "-o", str(work / "hostile-case")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    man = json.loads((work / "hostile-case" / "manifest.json").read_text())
    weights = load_file(str(work / "hostile-case" / "weights.safetensors"))
    exact = sum(1 for s in truth["state"] if s["key"] in weights
                and hashlib.sha256(weights[s["key"]].tobytes()).hexdigest() == s["sha256"])  # fmt: skip
    size = image.stat().st_size
    image.unlink()
    return {"exit": child.returncode, "seconds": seconds, "rss_mib": usage.ru_maxrss / 1024, "image_mib": size / 2**20,
            "problems": man["problems"], "exact": exact, "tensors": len(truth["state"]),
            "hooks_called": Path(truth["marker"]).exists()}  # fmt: skip


def make_artefacts(work: Path) -> tuple[Path, Path]:
    """A real torch process image and its recovered case: `zen demo --keep` makes both."""
    demo = work / "demo"
    res = subprocess.run([sys.executable, "-m", "zen", "demo", "--dir", str(demo), "--keep"], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"zen demo failed: {res.stderr[-2000:]}")
    return demo / "deployed.core", demo / "case"


SHARES = {"objects": 0.8, "case": 0.06, "elf": 0.04, "containers": 0.10}


def run(budget: int, seed: int, work: Path, image: Path, case: Path, log=print) -> dict[str, Tally]:
    targets = {"objects": lambda: ObjectsTarget(image), "case": lambda: CaseTarget(case, work),
               "elf": lambda: ElfTarget(image, work), "containers": lambda: ContainersTarget(image, work)}  # fmt: skip
    tallies = {}
    for name, make in targets.items():
        target = make()
        tally = Tally(name)
        n = max(1, int(budget * SHARES[name]))
        for i in range(n):
            tally.run(target, seed + i, target.limit)
            if log and (i + 1) % max(1, n // 10) == 0:
                log(f"{name}: {i + 1}/{n} inputs, {dict(tally.outcomes)}")
        tallies[name] = tally
    return tallies


def report(tallies: dict[str, Tally], recover: tuple | None, args, seconds: float, hostile: dict | None = None) -> str:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = sum(t.runs for t in tallies.values())
    crashes = sum(len(t.crashes) for t in tallies.values())
    hangs = sum(len(t.hangs) for t in tallies.values())
    lines = ["# Fuzzing what reads evidence (issue 20)", "",
             f"`python bench/fuzz.py --budget {args.budget} --recover {args.recover} --seed {args.seed}` on "
             f"{platform.node() and 'this machine'} ({os.cpu_count()} cores, {platform.python_version()}), "
             f"{time.strftime('%Y-%m-%d')}; {seconds / 60:.1f} min.", "",
             f"**{total:,} mutated inputs in process: {crashes} crashes, {hangs} hangs; peak RSS {rss:,.0f} MiB.**", "",
             "| target | inputs | outcomes | crashes | hangs | mean ms | max s (seed) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in tallies.values():
        out = ", ".join(f"{k}: {v:,}" for k, v in t.outcomes.most_common())
        lines.append(f"| {t.name} | {t.runs:,} | {out} | {len(t.crashes)} | {len(t.hangs)} | "
                     f"{1000 * t.seconds / max(1, t.runs):.1f} | {t.max_seconds:.2f} ({t.slowest_seed}) |")  # fmt: skip
    if recover is not None:
        codes, bad, slowest = recover
        lines += ["", f"`zen recover` (CLI, own process) on {sum(codes.values())} mutated images: exit codes "
                  + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items(), key=str))
                  + f"; slowest {slowest:.1f} s; {len(bad)} with a traceback, exit 70 or no result."]  # fmt: skip
        lines += [f"- {b}" for b in bad[:20]]
    if hostile is not None:
        h = hostile
        lines += ["", f"Hostile process (tests/targets/hostile_target.py, image {h['image_mib']:,.0f} MiB): `zen recover` "
                  f"exit {h['exit']} in {h['seconds']:.1f} s, peak RSS {h['rss_mib']:,.0f} MiB; {h['exact']}/{h['tensors']} "
                  f"tensors bit-exact; dunder hooks called: {h['hooks_called']}; problems: "
                  + "; ".join(p[:120] for p in h["problems"])]  # fmt: skip
    for t in tallies.values():
        for s, msg in t.crashes[:20]:
            lines.append(f"- crash in {t.name}, seed {s}: {msg}")
        for s in t.hangs[:20]:
            lines.append(f"- hang in {t.name}, seed {s}")
    lines += ["", "Targets: see the docstring of bench/fuzz.py. Outcomes other than `ok` are zen's typed errors "
              "(the exit code the CLI would give). A crash is any other exception; a hang is an input still "
              "running after the target's limit (objects 10 s, containers 30 s, elf and case 60 s)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=100_000, help="mutated inputs in process, over all targets")
    ap.add_argument("--recover", type=int, default=100, help="mutated images through the whole `zen recover` CLI")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--hostile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time and measure `zen recover` on the hostile target process",
    )
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz.md")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="zen-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        image, case = make_artefacts(work)
        tallies = run(args.budget, args.seed, work, image, case)
        rec = recover_runs(image, work, args.recover, args.seed) if args.recover else None
        hostile = hostile_run(work) if args.hostile else None
        text = report(tallies, rec, args, time.perf_counter() - t0, hostile)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(text)
    print(text)
    bad = sum(len(t.crashes) + len(t.hangs) for t in tallies.values()) + (len(rec[1]) if rec else 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
