"""Whole-CLI fuzzing (issue 38): mutated evidence through the `zen` command, each run in its own process.

    python bench/fuzz_cli.py [--kinds process,special,case,system,tvm,gpu,service,lying] [--runs N] [--jobs J] [--seed S]
                             [--system-dir DIR] [--tvm-dir DIR] [--out FILE]

The in-process harness (bench/fuzz.py) calls readers directly; this one runs `zen` as an investigator does, so every
layer (argument parsing, forked children, Volatility, the console) is in the path. Inputs are real artefacts:
  * process  - an image of a real torch process serving a CNN (bench/gpu_target.py on the CPU), mutated per seed:
               random or repeated pages over writable memory, sparse pointer-sized words, an ELF or program header
               field set to a boundary value, note bytes, or the file cut short; `zen recover` / `zen info --json`;
  * special  - sparse files (1 TiB raw; LiME, AVML and ELF headers claiming terabytes over a hole), FIFOs, empty and
               one-byte files, an executable; `zen ps` / `info` / `recover`;
  * case     - the case recovered from that image, one file mutated (JSON values, nesting, huge strings, bytes of
               the safetensors and marshal files), the manifest rehashed to match (a lie) in most runs, and the case
               signed in some: show / attribute / diff / report / reuse / library add / verify-case;
  * system   - (`--system-dir`, from `bench/fullsystem.py --keep DIR`) the guest's ELF and LiME images, 70% with
               words of the kernel structures zen walks mutated (bench/fuzz_kernel.py: tasks, mms, maple nodes, VMAs,
               files, dentries), 30% with pages or words anywhere; `zen ps` / `zen recover`;
  * tvm      - (`--tvm-dir`, the libraries tests/targets/tvm_models.py builds) a TVM model library with mutated
               bytes; `zen decompile`.
  * gpu, service, lying - hand-built hostile inputs (issue 49): see bench/fuzz_hostile.py.
A run is bad when it exits 70 (a bug), prints a traceback, or hangs (still running after --timeout). A signed case
that any command accepts after a change (exit 0) is counted as a lie believed. Results, with every bad seed, go to
bench/results/fuzz_cli.md; bench/results/fuzz.md keeps the in-process figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
TIB = 1 << 40


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kinds: dict[str, dict] = {}

    def add(self, kind: str, label: str, rc, seconds: float, rss_mb: int, bad: str | None) -> None:
        with self.lock:
            k = self.kinds.setdefault(kind, {})  # may hold only "accepted" so far (a run that counted one first)
            for key, empty in (("runs", 0), ("codes", Counter()), ("bad", []), ("max_s", 0.0), ("max_rss", 0), ("slowest", ""),
                               ("largest", "")):  # fmt: skip
                k.setdefault(key, empty)
            k["runs"] += 1
            k["codes"][str(rc)] += 1
            if seconds > k["max_s"]:
                k["max_s"], k["slowest"] = seconds, label
            if rss_mb > k["max_rss"]:
                k["max_rss"], k["largest"] = rss_mb, label
            if bad:
                k["bad"].append(f"{label}: {bad}")


def zen(args: list, timeout: float, cwd: Path) -> tuple[object, float, int, str]:
    """(exit code or "HANG", seconds, peak RSS MB, stderr tail) of one `zen` run, reaped here for its own rusage."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen([sys.executable, "-m", "zen", *map(str, args)], stdout=subprocess.DEVNULL, stderr=errf,
                                env=ENV, cwd=cwd, start_new_session=True)  # fmt: skip
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, 9)
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                return "HANG", time.monotonic() - t0, usage.ru_maxrss // 1024, ""
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read()[-3000:].decode(errors="replace")
    return proc.returncode, time.monotonic() - t0, usage.ru_maxrss // 1024, err


def judge(rc, err: str) -> str | None:
    if rc == "HANG":
        return "hang"
    if rc == 70 or "Traceback" in err or "internal error" in err:
        return f"exit {rc}: {err.strip().splitlines()[-1][:160] if err.strip() else ''}"
    if isinstance(rc, int) and rc < 0:
        return f"killed by signal {-rc}"
    return None


# -- process images ------------------------------------------------------------------------------------------------


def make_process_image(work: Path) -> Path:
    d = work / "target"
    d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gpu_target.py"), str(d), "--model", "cnn", "--device",
                             "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "READY"
        img = work / "process.core"
        subprocess.run([sys.executable, "-m", "zen", "acquire", "--pid", str(proc.pid), "-o", str(img), "--lean"],
                       check=True, env=ENV, capture_output=True, cwd=work)  # fmt: skip
    finally:
        proc.kill()
    return img


def layout(img: Path) -> dict:
    """Where an ELF core's program headers, data-holding PT_LOAD segments (index, offset, filesz, flags, memsz) and
    notes are: what the mutations aim at (tests/test_hostile_images.py uses it too)."""
    return _layout(img)


def _layout(img: Path) -> dict:
    raw = img.read_bytes()[:64]
    phoff = struct.unpack_from("<Q", raw, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", raw, 54)
    loads, notes = [], []
    with open(img, "rb") as fh:
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            t, flags, off, va, _, fsz, msz, _ = struct.unpack("<IIQQQQQQ", fh.read(56))
            if t == 1 and fsz >= 4096:
                loads.append((i, off, fsz, flags, msz))
            if t == 4:
                notes.append((off, fsz))
    return {"phoff": phoff, "phentsize": phentsize, "phnum": phnum, "loads": loads, "notes": notes,
            "size": img.stat().st_size}  # fmt: skip


BOUNDARY = [0, 1, 4095, 4096, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 4096, 1 << 47, 0x7FFFFFFFF000]


def mutate_process(src: Path, dst: Path, lay: dict, rng: random.Random) -> str:
    """Write a mutated copy of the image to dst (hard work only where the mutation is); returns a label."""
    how = rng.choice(["pages", "pages", "words", "phdr", "ehdr", "notes", "cut"])
    if how == "cut":
        n = rng.randrange(64, lay["size"])
        with open(src, "rb") as s, open(dst, "wb") as d:
            shutil.copyfileobj(_Limited(s, n), d, 16 << 20)
        return f"cut at {n}"
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        if how == "pages":
            for _ in range(rng.choice([1, 4, 16])):
                _, off, fsz, _, _ = rng.choice([x for x in lay["loads"] if x[3] & 2] or lay["loads"])
                fh.seek(off + rng.randrange(fsz // 4096) * 4096)
                fh.write(rng.randbytes(4096) if rng.random() < 0.5 else bytes([rng.randrange(256)]) * 4096)
        elif how == "words":
            for _ in range(200):
                _, off, fsz, _, _ = rng.choice(lay["loads"])
                fh.seek(off + rng.randrange(fsz // 8) * 8)
                fh.write(struct.pack("<Q", rng.choice(BOUNDARY + [rng.getrandbits(64)])))
        elif how == "phdr":
            i = rng.randrange(lay["phnum"])
            field = rng.choice([8, 16, 32, 40])  # offset, vaddr, filesz, memsz
            fh.seek(lay["phoff"] + i * lay["phentsize"] + field)
            fh.write(struct.pack("<Q", rng.choice(BOUNDARY + [rng.getrandbits(64)])))
            how = f"phdr {i} +{field}"
        elif how == "ehdr":
            field, fmt = rng.choice([(32, "<Q"), (40, "<Q"), (54, "<H"), (56, "<H"), (16, "<H"), (18, "<H")])
            fh.seek(field)
            fh.write(struct.pack(fmt, rng.getrandbits(struct.calcsize(fmt) * 8)))
            how = f"ehdr +{field}"
        elif how == "notes" and lay["notes"]:
            off, fsz = rng.choice(lay["notes"])
            for _ in range(rng.choice([1, 8, 64])):
                fh.seek(off + rng.randrange(max(fsz, 1)))
                fh.write(rng.randbytes(rng.choice([1, 4, 8])))
    return how


class _Limited:
    def __init__(self, fh, n: int) -> None:
        self.fh, self.left = fh, n

    def read(self, size: int = -1) -> bytes:
        b = self.fh.read(min(size if size >= 0 else self.left, self.left))
        self.left -= len(b)
        return b


# -- special files -------------------------------------------------------------------------------------------------


def special_inputs(work: Path) -> list[tuple[str, Path]]:
    def sparse(name: str, head: bytes, size: int) -> Path:
        p = work / name
        with open(p, "wb") as fh:
            fh.write(head)
            fh.truncate(size)
        return p

    note = struct.pack("<III", 5, 8, 0) + b"QEMU\0\0\0\0" + b"\0" * 8
    ehdr = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7, 4, 62, 1, 0, 64, 0, 0, 64, 56, 2,
                       0, 0, 0)  # fmt: skip
    elf = (ehdr + struct.pack("<IIQQQQQQ", 4, 0, 176, 0, 0, len(note), len(note), 4)
           + struct.pack("<IIQQQQQQ", 1, 7, 4096, 0, 0, TIB, TIB, 4096) + note).ljust(4096, b"\0")  # fmt: skip
    fifo = work / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    (work / "empty").write_bytes(b"")
    (work / "one").write_bytes(b"\x7f")
    return [("raw-1TiB", sparse("raw.img", b"", TIB)), ("elf-1TiB-hole", sparse("dump.elf", elf, 4096 + TIB)),
            ("lime-1TiB", sparse("m.lime", struct.pack("<IIQQQ", 0x4C694D45, 1, 0, TIB - 1, 0), 32 + TIB)),
            ("lime-huge-range", sparse("h.lime", struct.pack("<IIQQQ", 0x4C694D45, 1, 0, (1 << 64) - 1, 0), 1 << 20)),
            ("avml-1TiB", sparse("a.avml", struct.pack("<IIQQQ", 0x4C4D5641, 2, 0, TIB, 0), 1 << 20)),
            ("fifo", fifo), ("empty", work / "empty"), ("one-byte", work / "one"),
            ("executable", Path(shutil.which("true") or "/bin/true").resolve()), ("dev-zero", Path("/dev/zero"))]  # fmt: skip


# -- cases ---------------------------------------------------------------------------------------------------------


def _rehash(c: Path, name: str) -> None:
    man = json.loads((c / "manifest.json").read_text())
    man["files"][name] = hashlib.sha256((c / name).read_bytes()).hexdigest()
    (c / "manifest.json").write_text(json.dumps(man))


def _mutate_json(data, rng: random.Random, depth: int = 0):
    """One change somewhere in a JSON value: a wrong type, a deleted or unknown field, deep nesting, a huge number or
    string, a lone surrogate."""
    if isinstance(data, dict) and data and (depth > 3 or rng.random() < 0.3 or not any(isinstance(v, (dict, list))
                                                                                         for v in data.values())):  # fmt: skip
        k = rng.choice(sorted(data))
        op = rng.randrange(7)
        if op == 0:
            del data[k]
        elif op == 1:
            data[k] = rng.choice([None, [], {}, "x", -1, 1e308, 2**70, True])
        elif op == 2:
            data["unknown_" + str(rng.randrange(99))] = 1
        elif op == 3:
            v: object = 0
            for _ in range(rng.choice([300, 900])):  # (json.dumps itself stops near 1,000)
                v = [v]
            data[k] = v
        elif op == 4:
            data[k] = "A" * rng.choice([10**5, 3 * 10**6])
        elif op == 5:
            data[k] = "\ud800"
        else:
            data[k] = rng.getrandbits(80) - (1 << 79)
        return data
    if isinstance(data, dict) and data:
        k = rng.choice([k for k, v in data.items() if isinstance(v, (dict, list))] or sorted(data))
        data[k] = _mutate_json(data[k], rng, depth + 1)
    elif isinstance(data, list) and data:
        i = rng.randrange(len(data))
        data[i] = _mutate_json(data[i], rng, depth + 1)
    return data


def mutate_case(base: Path, dst: Path, rng: random.Random, key: Path) -> tuple[str, bool]:
    """A mutated copy of the case; returns (label, signed)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst)
    name = rng.choice(["mr.json", "pr.json", "ur.json", "manifest.json", "weights.safetensors", "inputs.safetensors",
                       "code.marshal", "requirements.txt"])  # fmt: skip
    p = dst / name
    if name.endswith(".json"):
        data = json.loads(p.read_text())
        text = json.dumps(_mutate_json(data, rng), ensure_ascii=rng.random() < 0.5)
        p.write_bytes(text.encode("utf-8", "surrogatepass"))  # a lone surrogate becomes bytes that are not UTF-8
    else:
        raw = bytearray(p.read_bytes())
        op = rng.randrange(4)
        if op == 0 and raw:
            for _ in range(rng.choice([1, 8])):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif op == 1:
            raw = raw[: rng.randrange(len(raw) + 1)]
        elif op == 2:
            raw[:8] = struct.pack("<Q", rng.choice([0, 8 << 60, len(raw) * 2, (1 << 64) - 1]))
        else:
            raw = bytearray(rng.randbytes(rng.choice([0, 10, 5000])))
        p.write_bytes(bytes(raw))
    signed = rng.random() < 0.25  # the base case is signed: its manifest.sig is kept in a quarter of the runs
    if not signed:
        (dst / "manifest.sig").unlink(missing_ok=True)
    if name != "manifest.json" and rng.random() < 0.8:
        _rehash(dst, name)
        how = f"{name} (rehashed)"
    else:
        how = name
    return how + (", signed" if signed else ""), signed


def case_commands(c: Path, lib: Path, out: Path) -> list[list]:
    return [["show", c], ["attribute", c, "--library", lib], ["diff", c, "--base", "base", "--library", lib, "--listing"],
            ["report", c, "-o", out / "r.md", "--library", lib, "--listing"], ["reuse", c, "-o", out / "pkg"],
            ["library", "add", c, "--name", "again", "--library", out / "l.sqlite"], ["verify-case", c]]  # fmt: skip


# -- whole-machine images and TVM libraries -------------------------------------------------------------------------


def mutate_bytes(src: Path, dst: Path, rng: random.Random, spans: list[tuple[int, int]] | None = None) -> str:
    """A copy with pages or words changed (within `spans` of the file when given)."""
    shutil.copyfile(src, dst)
    size = dst.stat().st_size
    spans = spans or [(0, size)]
    how = rng.choice(["pages", "words", "bytes"])
    with open(dst, "r+b") as fh:
        for _ in range({"pages": 8, "words": 400, "bytes": 64}[how]):
            lo, hi = rng.choice(spans)
            pos = rng.randrange(lo, max(lo + 1, hi - 4096))
            fh.seek(pos)
            if how == "pages":
                fh.write(rng.randbytes(4096) if rng.random() < 0.5 else bytes([rng.randrange(256)]) * 4096)
            elif how == "words":
                fh.write(struct.pack("<Q", rng.choice(BOUNDARY + [rng.getrandbits(64)])))
            else:
                fh.write(bytes([rng.randrange(256)]) * rng.choice([1, 8]))
    return how


# -- main ----------------------------------------------------------------------------------------------------------


def run_kind(kind: str, a, work: Path, stats: Stats) -> None:
    if kind in ("gpu", "service", "lying"):  # hand-built hostile inputs (issue 49): bench/fuzz_hostile.py
        from fuzz_hostile import run_hostile

        return run_hostile(kind, a, work, stats, zen, judge, make_process_image)
    jobs = []
    if kind == "process":
        img = make_process_image(work)
        lay = _layout(img)
        for i in range(a.runs):
            jobs.append(("process", i))
    elif kind == "special":
        items = special_inputs(work)
        cmds = lambda p, n: [["ps", p], ["info", p, "--json"], ["recover", p, "-o", work / f"sc{n}"]]  # noqa: E731
        for i in range(a.runs):
            jobs.append(("special", i))
    elif kind == "case":
        img = make_process_image(work)
        base = work / "base-case"
        subprocess.run([sys.executable, "-m", "zen", "recover", str(img), "-o", str(base)], env=ENV, capture_output=True,
                       cwd=work)  # fmt: skip
        key = work / "key"
        if not key.exists():
            subprocess.run([sys.executable, "-m", "zen", "keygen", "-o", str(key)], env=ENV, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "zen", "sign", str(base), "--key", str(key)], env=ENV, check=True,
                       capture_output=True)  # fmt: skip
        lib = work / "lib.sqlite"
        subprocess.run([sys.executable, "-m", "zen", "library", "add", str(base), "--name", "base", "--library", str(lib)],
                       env=ENV, check=True, capture_output=True)  # fmt: skip
        img.unlink()
        for i in range(-(-a.runs // 7)):  # --runs counts zen runs: seven commands per mutated case
            jobs.append(("case", i))
    elif kind in ("system", "tvm"):
        src = Path(a.system_dir if kind == "system" else a.tvm_dir or "")
        files = sorted(p for p in src.glob("*") if p.suffix in ((".elf", ".lime", ".raw") if kind == "system" else (".so",)))
        if not files:
            print(f"{kind}: no inputs (give --{kind}-dir): skipped", flush=True)
            return
        isf = [p for p in src.glob("isf*")] if kind == "system" else []
        if kind == "system":  # most mutations land on the kernel structures zen walks (bench/fuzz_kernel.py)
            from fuzz_kernel import kernel_spans, mutate_kernel

            structs = {f: kernel_spans(f, {".elf": "elf", ".lime": "lime"}.get(f.suffix, "raw"), isf) for f in files}
        for i in range(a.runs):
            jobs.append((kind, i))

    def one(job) -> None:
        kind, i = job
        rng = random.Random(f"{a.seed}:{kind}:{i}")  # one seed per input, whatever thread runs it: reproducible
        slot = work / f"w{threading.get_ident()}"
        slot.mkdir(exist_ok=True)
        if kind == "process":
            dst = slot / "m.core"
            label = f"input {i}: {mutate_process(img, dst, lay, rng)}"
            args = [["recover", dst, "-o", slot / "case", "--force"], ["info", dst, "--json"]][rng.random() < 0.3]
            runs = [args]
        elif kind == "special":
            name, p = items[i % len(items)]
            label, runs = f"{name}", [cmds(p, i)[i // len(items) % 3]]
        elif kind == "case":
            dst = slot / "case"
            how, signed = mutate_case(base, dst, rng, key)
            label = f"input {i}: {how}"
            runs = case_commands(dst, lib, slot)
        else:
            srcf = files[i % len(files)]
            dst = slot / ("m" + srcf.suffix)
            if kind == "system" and structs[srcf][0] and rng.random() < 0.7:
                label = f"input {i}: {srcf.name} {mutate_kernel(srcf, dst, rng, *structs[srcf])}"
            else:
                label = f"input {i}: {srcf.name} {mutate_bytes(srcf, dst, rng)}"
            if kind == "system":
                sym = [x for p in isf for x in ("--symbols", p)]
                runs = [[["ps", dst, *sym], ["recover", dst, "-o", slot / "case", "--force", *sym]][rng.random() < 0.5]]
            else:
                runs = [["decompile", dst, "-o", slot / "pkg"]]
        for args in runs:
            rc, secs, rss, err = zen(args, a.timeout, slot)
            bad = judge(rc, err)
            if kind == "case" and signed and rc == 0 and "rehashed" in label:
                bad = bad or f"{args[0]} accepted a changed signed case"
            if kind == "case" and not signed and rc == 0 and "rehashed" in label:
                with stats.lock:  # an unsigned case changed and rehashed that this command accepted (see the report)
                    stats.kinds.setdefault("case", {}).setdefault("accepted", Counter())[f"{args[0]} {how.split()[0]}"] += 1
            stats.add(kind, f"{label} [{args[0]}]", rc, secs, rss, bad)
            if bad:
                print(f"BAD {kind} {label} [{' '.join(map(str, args[:1]))}]: {bad}", flush=True)
        shutil.rmtree(slot / "case", ignore_errors=True)
        shutil.rmtree(slot / "pkg", ignore_errors=True)

    if a.inputs:
        keep = {int(x) for x in a.inputs.split(",")}
        jobs = [j for j in jobs if j[1] in keep]
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        for n, _ in enumerate(pool.map(one, jobs), 1):
            if n % 50 == 0:
                print(f"{kind}: {n}/{len(jobs)} in {time.monotonic() - t0:.0f} s", flush=True)
    stats.kinds.setdefault(kind, {})["seconds"] = round(time.monotonic() - t0)


def write_report(a, stats: Stats, started: str) -> None:
    lines = ["# Whole-CLI fuzzing (issue 38)", "",
             f"`python bench/fuzz_cli.py --kinds {a.kinds} --runs {a.runs} --jobs {a.jobs} --seed {a.seed}` on "
             f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()}), started {started}.", "",
             "| kind | zen runs | exit codes | exit 70 / traceback / signal | hangs | max s (input) | max RSS MiB (input) "
             "| minutes |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, k in stats.kinds.items():
        if "runs" not in k:
            continue
        hangs = sum(1 for b in k["bad"] if b.endswith(": hang"))
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(k["codes"].items()))
        lines.append(f"| {kind} | {k['runs']:,} | {codes} | {len(k['bad']) - hangs} | {hangs} | {k['max_s']:.1f} "
                     f"({k['slowest'][:60]}) | {k['max_rss']} ({k['largest'][:60]}) | "
                     f"{k.get('seconds', 0) / 60:.0f} |")  # fmt: skip
    acc = (stats.kinds.get("case") or {}).get("accepted")
    if acc:
        lines += ["", "Unsigned cases changed and rehashed that a command still accepted (exit 0), by command and file: "
                  + ", ".join(f"{k}: {n}" for k, n in sorted(acc.items())) + ". Without a signature a consistent rewrite "
                  "of a file and its manifest entry is indistinguishable from zen's output where the change keeps every "
                  "check true (a renamed note, a reordered listing); signed cases are the answer."]  # fmt: skip
    lines += ["", "Bad runs (every one, with its seed):", ""]
    bad = [b for k in stats.kinds.values() for b in k.get("bad", [])]
    lines += [f"- {b}" for b in bad] or ["- none"]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="process,special,case")
    ap.add_argument("--runs", type=int, default=1000, help="inputs per kind")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds after which a run counts as a hang")
    ap.add_argument("--inputs", help="only these input numbers (comma-separated): reproduces the runs a report lists")
    ap.add_argument("--system-dir")
    ap.add_argument("--tvm-dir")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz_cli.md"))
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="zen-fuzz-cli-") as tmp:
        for kind in a.kinds.split(","):
            work = Path(tmp) / kind
            work.mkdir()
            run_kind(kind, a, work, stats)
            write_report(a, stats, started)
    return 1 if any(k.get("bad") for k in stats.kinds.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
