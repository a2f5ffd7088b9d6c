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

from fuzz_targets import CaseTarget, ContainersTarget, ElfTarget, ObjectsTarget, word  # noqa: E402, F401 - beside this file

from zen.runtime.errors import ZenError  # noqa: E402

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
    from zen.represent.tensorfile import read_tensor_file

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
    # zen's own reader: the hostile model's buffer "mark\udc80" is written as its JSON escape, which safetensors'
    # Rust parser refuses (a lone surrogate); zen reads it back under its own name
    digests = read_tensor_file(work / "hostile-case" / "weights.safetensors", reuse=False).digests
    exact = sum(1 for s in truth["state"] if digests.get(s["key"]) == s["sha256"])
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
